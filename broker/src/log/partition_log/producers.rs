//! The log's side of idempotent producers: the producer state kept beside
//! the segments, its `.snapshot` files (one per rolled segment, named by the
//! offset it stands at, and one at the log end on a clean close), and
//! rebuilding it at open and after a truncation from the newest snapshot at
//! or below the log end plus the batch headers after it.

use protocol::Offset;

use super::{PartitionLog, PRODUCER_EXPIRY_CHECK_MS};
use crate::log::config::STORED_BATCH_BYTES_MAX;
use crate::log::error::{LogError, LogResult};
use crate::log::producer_state::ProducerStateTable;
use crate::log::scan::{ScanDepth, SegmentScanner};
use crate::log::segment::{parse_segment_name, remove_if_exists, segment_path, write_small_file};
use crate::runtime;

pub const SNAPSHOT_SUFFIX: &str = "snapshot";

impl PartitionLog {
    /// A copy of the producer state as of the log end.
    pub fn producer_state(&self) -> ProducerStateTable {
        self.state.borrow().producers.clone()
    }

    /// Producers this replica remembers.
    pub fn producer_count(&self) -> usize {
        self.state.borrow().producers.len()
    }

    /// Offsets of the snapshot files in the directory, oldest first. Lists
    /// on the blocking pool: a directory of a long-lived partition holds
    /// thousands of files.
    pub async fn producer_snapshot_offsets(&self) -> LogResult<Vec<Offset>> {
        let dir = self.dir.clone();
        runtime::blocking(move || {
            let mut offsets = Vec::new();
            for entry in std::fs::read_dir(&dir).map_err(|e| LogError::io(&dir, e))? {
                let entry = entry.map_err(|e| LogError::io(&dir, e))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if let Some((offset, SNAPSHOT_SUFFIX)) = parse_segment_name(&name) {
                    offsets.push(offset);
                }
            }
            offsets.sort();
            Ok(offsets)
        })
        .await
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
        state.producers.remove_expired(now_ms, expiration_ms)
    }

    /// Removes snapshot files below `log_start` (retention took their
    /// segments) except the newest, and every one past `log_end` (they
    /// describe records this log no longer has). Returns the offsets of the
    /// snapshots left, oldest first.
    pub(super) async fn remove_stale_snapshots(
        &self,
        log_start: Offset,
        log_end: Offset,
    ) -> LogResult<Vec<Offset>> {
        let offsets = self.producer_snapshot_offsets().await?;
        let newest_usable = offsets.iter().rev().find(|o| **o <= log_end).copied();
        let (stale, kept): (Vec<Offset>, Vec<Offset>) = offsets
            .into_iter()
            .partition(|o| *o > log_end || (*o < log_start && Some(*o) != newest_usable));
        if stale.is_empty() {
            return Ok(kept);
        }
        let dir = self.dir.clone();
        runtime::blocking(move || {
            for offset in stale {
                remove_if_exists(&segment_path(&dir, offset, SNAPSHOT_SUFFIX))?;
            }
            LogResult::Ok(())
        })
        .await?;
        Ok(kept)
    }

    /// Rebuilds the producer state from the newest readable snapshot at or
    /// below the log end (none: the log start, with an empty state) plus the
    /// headers of every batch from there to the log end. Every staged byte
    /// must be in the files (open, truncation).
    pub(super) async fn rebuild_producers(&self) -> LogResult<()> {
        let (log_start, log_end) = (self.log_start_offset(), self.log_end_offset());
        let snapshots = self.remove_stale_snapshots(log_start, log_end).await?;
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
        let segments: Vec<(Offset, Offset, u64)> = {
            let state = self.state.borrow();
            state
                .segments
                .iter()
                .filter(|s| s.next_offset > from)
                .map(|s| (s.base, s.next_offset, s.size_bytes))
                .collect()
        };
        let mut replayed = 0u64;
        for (base, _, size_bytes) in segments {
            if size_bytes == 0 {
                continue;
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
            while let Some(batch) = scanner.next().await.map_err(|e| self.scan_error(base, e))? {
                if batch.header.base_offset >= from {
                    table.apply(&batch.header);
                    replayed += 1;
                }
            }
        }
        tracing::debug!(dir = %self.dir.display(), %from, replayed, producers = table.len(), "producer state rebuilt");
        self.state.borrow_mut().producers = table;
        Ok(())
    }
}
