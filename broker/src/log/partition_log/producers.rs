//! The log's side of idempotent and transactional producers: the producer
//! state kept beside the segments, its `.snapshot` files (one per rolled
//! segment, named by the offset it stands at, and one at the log end on a
//! clean close), the aborted transactions' `.txnindex` files (one per
//! segment with an abort marker, written as the segment is sealed), and
//! rebuilding both at open and after a truncation from the newest snapshot
//! at or below the log end plus the batches after it.

use protocol::record_batch::marker::{parse_marker, MarkerKind};
use protocol::{Offset, RecordBatch};

use super::{PartitionLog, PRODUCER_EXPIRY_CHECK_MS};
use crate::log::config::STORED_BATCH_BYTES_MAX;
use crate::log::error::{LogError, LogResult};
use crate::log::producer_state::ProducerStateTable;
use crate::log::scan::{ScanDepth, SegmentScanner};
use crate::log::segment::{parse_segment_name, remove_if_exists, segment_path, write_small_file};
use crate::log::txn_index::{AbortedIndex, AbortedTxn};
use crate::runtime;

pub const SNAPSHOT_SUFFIX: &str = "snapshot";
pub const TXN_INDEX_SUFFIX: &str = "txnindex";

impl PartitionLog {
    /// A copy of the producer state as of the log end.
    pub fn producer_state(&self) -> ProducerStateTable {
        self.state.borrow().producers.clone()
    }

    /// One producer's state as of the log end.
    pub fn producer_entry(
        &self,
        producer_id: protocol::ProducerId,
    ) -> Option<crate::log::producer_state::ProducerEntry> {
        self.state.borrow().producers.get(producer_id).cloned()
    }

    /// Producers this replica remembers.
    pub fn producer_count(&self) -> usize {
        self.state.borrow().producers.len()
    }

    /// Offsets of the snapshot files in the directory, oldest first. Lists
    /// on the blocking pool: a directory of a long-lived partition holds
    /// thousands of files.
    pub async fn producer_snapshot_offsets(&self) -> LogResult<Vec<Offset>> {
        Ok(self.list_producer_files().await?.0)
    }

    /// Offsets of the snapshot files and bases of the transaction index
    /// files in the directory, each oldest first.
    async fn list_producer_files(&self) -> LogResult<(Vec<Offset>, Vec<Offset>)> {
        let dir = self.dir.clone();
        runtime::blocking(move || {
            let (mut snapshots, mut txn_indexes) = (Vec::new(), Vec::new());
            for entry in std::fs::read_dir(&dir).map_err(|e| LogError::io(&dir, e))? {
                let entry = entry.map_err(|e| LogError::io(&dir, e))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                match parse_segment_name(&name) {
                    Some((offset, SNAPSHOT_SUFFIX)) => snapshots.push(offset),
                    Some((base, TXN_INDEX_SUFFIX)) => txn_indexes.push(base),
                    _ => {}
                }
            }
            snapshots.sort();
            txn_indexes.sort();
            Ok((snapshots, txn_indexes))
        })
        .await
    }

    /// Writes the aborts whose marker lies in the sealed segment `[base,
    /// next_offset)` to its `.txnindex` (none: no file). The producer
    /// snapshot that lets recovery skip this segment is written after it.
    pub(super) async fn write_txn_index(&self, base: Offset, next_offset: Offset) -> LogResult<()> {
        let entries = self
            .state
            .borrow()
            .aborted
            .with_marker_in(base, next_offset);
        let path = segment_path(&self.dir, base, TXN_INDEX_SUFFIX);
        if entries.is_empty() {
            return remove_if_exists(&path);
        }
        write_small_file(&path, &AbortedIndex::encode_file(&entries)).await
    }

    /// Aborted transactions this replica knows of.
    pub fn aborted_count(&self) -> usize {
        self.state.borrow().aborted.len()
    }

    /// Writes the state as it stands at `offset` (every batch below it
    /// applied) to `<offset>.snapshot`. A torn file fails its checksum and
    /// the next open falls back to an older one.
    pub(super) async fn write_producer_snapshot(
        &self,
        offset: Offset,
        bytes: &[u8],
    ) -> LogResult<()> {
        write_small_file(&segment_path(&self.dir, offset, SNAPSHOT_SUFFIX), bytes).await
    }

    /// Forgets producers silent for longer than the log's
    /// `producer_id_expiration_ms`, looking at most every
    /// `PRODUCER_EXPIRY_CHECK_MS`. Returns how many went.
    pub(super) fn expire_producers(&self, now_ms: i64) -> usize {
        let expiration_ms = self.config.borrow().producer_id_expiration_ms;
        let mut state = self.state.borrow_mut();
        if now_ms - state.producers_expired_ms < PRODUCER_EXPIRY_CHECK_MS {
            return 0;
        }
        state.producers_expired_ms = now_ms;
        let removed = state.producers.remove_expired(now_ms, expiration_ms);
        if removed > 0 {
            // The snapshot on disk still names them: a close writes a new one.
            state.sealed_at_open = None;
        }
        removed
    }

    /// Removes snapshot files below `log_start` (retention took their
    /// segments) except the newest, every one past `log_end` (they describe
    /// records this log no longer has), and transaction index files based
    /// below `log_start` (left by segments compaction merged into an older
    /// one, whose entries retention has now passed). Returns the offsets of
    /// the snapshots and the bases of the transaction indexes left.
    pub(super) async fn remove_stale_snapshots(
        &self,
        log_start: Offset,
        log_end: Offset,
    ) -> LogResult<(Vec<Offset>, Vec<Offset>)> {
        let (offsets, txn_indexes) = self.list_producer_files().await?;
        let newest_usable = offsets.iter().rev().find(|o| **o <= log_end).copied();
        let (stale, kept): (Vec<Offset>, Vec<Offset>) = offsets
            .into_iter()
            .partition(|o| *o > log_end || (*o < log_start && Some(*o) != newest_usable));
        let (stale_indexes, kept_indexes): (Vec<Offset>, Vec<Offset>) =
            txn_indexes.into_iter().partition(|b| *b < log_start);
        if stale.is_empty() && stale_indexes.is_empty() {
            return Ok((kept, kept_indexes));
        }
        let dir = self.dir.clone();
        runtime::blocking(move || {
            for offset in stale {
                remove_if_exists(&segment_path(&dir, offset, SNAPSHOT_SUFFIX))?;
            }
            for base in stale_indexes {
                remove_if_exists(&segment_path(&dir, base, TXN_INDEX_SUFFIX))?;
            }
            LogResult::Ok(())
        })
        .await?;
        Ok((kept, kept_indexes))
    }

    /// The aborts recorded in the `.txnindex` files with a marker in
    /// `[log_start, below)`. An unreadable file is rebuilt from its segment.
    async fn load_txn_indexes(
        &self,
        bases: Vec<Offset>,
        log_start: Offset,
        below: Offset,
    ) -> LogResult<AbortedIndex> {
        let mut index = AbortedIndex::new();
        for base in bases {
            let path = segment_path(&self.dir, base, TXN_INDEX_SUFFIX);
            let read = {
                let path = path.clone();
                runtime::blocking(move || std::fs::read(&path)).await
            };
            let decoded = read
                .map_err(|e| e.to_string())
                .and_then(|b| AbortedIndex::decode_file(&b).map_err(|e| e.to_string()));
            let entries = match decoded {
                Ok(entries) => entries,
                Err(reason) => {
                    tracing::warn!(file = %path.display(), %reason, "unreadable transaction index; rebuilding it from its segment");
                    self.scan_aborts(base).await?
                }
            };
            for entry in entries {
                if entry.last_offset >= log_start && entry.last_offset < below {
                    index.insert(entry);
                }
            }
        }
        Ok(index)
    }

    /// Rebuilds the aborts recorded for `base` from the markers of the
    /// segment holding that offset. A transaction begun in an earlier
    /// segment is not seen begin here, so its abort is not recovered: this
    /// only mends a damaged file, which the checksum makes rare.
    async fn scan_aborts(&self, base: Offset) -> LogResult<Vec<AbortedTxn>> {
        let holder = self
            .state
            .borrow()
            .segments
            .iter()
            .find(|s| s.base <= base && base < s.next_offset)
            .map(|s| (s.base, s.size_bytes));
        let Some((segment_base, size_bytes)) = holder else {
            return Ok(Vec::new());
        };
        let mut table = ProducerStateTable::new();
        let mut out = Vec::new();
        self.replay(
            segment_base,
            size_bytes,
            Offset::ZERO,
            &mut table,
            &mut |done| out.push(done),
        )
        .await?;
        Ok(out)
    }

    /// Applies every batch of segment `base` at or past `from` to `table`;
    /// aborts its markers end go to `aborted`. Returns how many batches.
    async fn replay(
        &self,
        base: Offset,
        size_bytes: u64,
        from: Offset,
        table: &mut ProducerStateTable,
        aborted: &mut dyn FnMut(AbortedTxn),
    ) -> LogResult<u64> {
        if size_bytes == 0 {
            return Ok(0);
        }
        let file = self.ensure_file(base).await?;
        let mut scanner = SegmentScanner::new(
            file,
            size_bytes,
            0,
            None,
            STORED_BATCH_BYTES_MAX,
            ScanDepth::Headers,
        );
        let mut replayed = 0u64;
        while let Some(batch) = scanner.next().await.map_err(|e| self.scan_error(base, e))? {
            if batch.header.base_offset < from {
                continue;
            }
            let marker = if batch.header.is_control() {
                RecordBatch::parse(scanner.last_bytes(), STORED_BATCH_BYTES_MAX)
                    .ok()
                    .and_then(|b| parse_marker(&b).ok())
            } else {
                None
            };
            if let Some(done) = table.apply(&batch.header, marker) {
                if done.kind == MarkerKind::Abort {
                    aborted(AbortedTxn {
                        producer_id: done.producer_id,
                        first_offset: done.first_offset,
                        last_offset: done.marker_offset,
                    });
                }
            }
            replayed += 1;
        }
        Ok(replayed)
    }

    /// Rebuilds the producer state from the newest readable snapshot at or
    /// below the log end (none: the log start, with an empty state) plus the
    /// headers of every batch from there to the log end. Every staged byte
    /// must be in the files (open, truncation).
    pub(super) async fn rebuild_producers(&self) -> LogResult<()> {
        let (log_start, log_end) = (self.log_start_offset(), self.log_end_offset());
        let (snapshots, txn_indexes) = self.remove_stale_snapshots(log_start, log_end).await?;
        let mut table = ProducerStateTable::new();
        let mut from = log_start;
        for offset in snapshots.into_iter().rev() {
            let path = segment_path(&self.dir, offset, SNAPSHOT_SUFFIX);
            let read = {
                let path = path.clone();
                runtime::blocking(move || std::fs::read(&path)).await
            };
            let decoded = read
                .map_err(|e| e.to_string())
                .and_then(|b| ProducerStateTable::decode_snapshot(&b).map_err(|e| e.to_string()));
            match decoded {
                Ok((at, snapshot)) if at == offset => {
                    table = snapshot;
                    from = offset;
                    break;
                }
                Ok((at, _)) => {
                    tracing::warn!(file = %path.display(), %at, "producer snapshot names another offset; skipping it")
                }
                Err(reason) => {
                    tracing::warn!(file = %path.display(), %reason, "unreadable producer snapshot; trying an older one")
                }
            }
        }
        // Aborts below the replay's start come from the files; the replay
        // finds the rest (a file may hold entries a truncation cut off).
        let mut aborted = self.load_txn_indexes(txn_indexes, log_start, from).await?;
        let segments: Vec<(Offset, u64)> = {
            let state = self.state.borrow();
            state
                .segments
                .iter()
                .filter(|s| s.next_offset > from)
                .map(|s| (s.base, s.size_bytes))
                .collect()
        };
        let mut replayed = 0u64;
        for (base, size_bytes) in segments {
            replayed += self
                .replay(base, size_bytes, from, &mut table, &mut |done| {
                    aborted.insert(done)
                })
                .await?;
        }
        tracing::debug!(dir = %self.dir.display(), %from, replayed, producers = table.len(), "producer state rebuilt");
        let mut state = self.state.borrow_mut();
        state.producers = table;
        state.aborted = aborted;
        Ok(())
    }
}
