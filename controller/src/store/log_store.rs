//! `LogStore`: the durable Raft log and vote of one controller node, in a data
//! directory. Implements openraft's `RaftLogStorage`; never interprets commands.
//!
//! Files (formats in `frame.rs`):
//! - `raft-log.bin`: magic `RLRAFTL1`, then one frame per `LogRecord` (JSON):
//!   appended entries, and `Truncate`/`Purge` markers, replayed in order on open.
//!   When dead records outnumber live ones after a purge, the file is rewritten
//!   (atomically) with only the purge point and the live entries.
//! - `vote.bin`: magic `RLVOTE01` and one frame with the vote, replaced atomically.
//!
//! Every write is `sync_data`ed before openraft is told it is durable. A write or
//! fsync failure poisons the store (`StoreError::Failed`): after a failed fsync
//! the kernel may have dropped the dirty pages, so only a restart that rescans
//! the file knows what is on disk. A full disk is the exception: the file is
//! cut back to its length before the write (what was synced before stays
//! synced), and the write waits for room and is tried again
//! (`full_disk::retry_while_full`), so a disk that fills up stalls the
//! controller instead of stopping it.
//!
//! All live entries are also kept in memory: the controller's log is short, since
//! it is purged after every snapshot. File I/O happens inline in the async methods;
//! metadata writes are rare and small, so blocking a runtime worker for an fsync
//! is accepted here.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{Entry, LogId, LogState, OptionalSend, RaftLogReader, StorageError, Vote};
use serde::{Deserialize, Serialize};

use crate::store::error::StoreError;
use crate::store::frame::{self, MAGIC_BYTES};
use crate::store::full_disk::{retry_while_full, RoomWait};
use crate::store::TypeConfig;

const LOG_FILE_NAME: &str = "raft-log.bin";
const VOTE_FILE_NAME: &str = "vote.bin";
const LOG_MAGIC: &[u8; MAGIC_BYTES] = b"RLRAFTL1";
const VOTE_MAGIC: &[u8; MAGIC_BYTES] = b"RLVOTE01";
/// Rewrite the log file once this many records in it are dead and they outnumber the live ones.
const DEAD_RECORDS_COMPACT_MIN: usize = 64;

#[derive(Debug, Serialize, Deserialize)]
enum LogRecord {
    Entry(Entry<TypeConfig>),
    /// Entries at and after this index are gone.
    Truncate {
        since_index: u64,
    },
    /// Entries at and before `upto` are gone; `upto` is the last purged log id.
    Purge {
        upto: LogId<u64>,
    },
}

/// What `open` found; for logging by the caller.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogRecovery {
    pub records_replayed: usize,
    /// Bytes cut off the end of the log file: a torn last write.
    pub torn_bytes_truncated: u64,
}

/// Cheap to clone: clones share one log. openraft uses clones as log readers.
#[derive(Clone, Debug)]
pub struct LogStore {
    inner: Arc<Mutex<LogInner>>,
    /// Shared with the node's state machine store (`store::open`).
    pub(crate) room: RoomWait,
}

#[derive(Debug)]
struct LogInner {
    log_path: PathBuf,
    vote_path: PathBuf,
    file: File,
    entries: BTreeMap<u64, Entry<TypeConfig>>,
    last_purged_log_id: Option<LogId<u64>>,
    vote: Option<Vote<u64>>,
    dead_records: usize,
    failed: bool,
}

impl LogStore {
    /// Opens (creating if needed) the log in `dir`, truncating a torn last record.
    pub fn open(dir: &Path) -> Result<(LogStore, LogRecovery), StoreError> {
        std::fs::create_dir_all(dir).map_err(StoreError::io("create dir", dir))?;
        let vote_path = dir.join(VOTE_FILE_NAME);
        let vote = match frame::read_whole(&vote_path, VOTE_MAGIC, 1)? {
            Some(frames) => Some(
                serde_json::from_slice(&frames[0])
                    .map_err(|e| StoreError::corrupt(&vote_path, e.to_string()))?,
            ),
            None => None,
        };
        let log_path = dir.join(LOG_FILE_NAME);
        let (file, bytes) = open_log_file(&log_path)?;
        let mut inner = LogInner {
            log_path,
            vote_path,
            file,
            entries: BTreeMap::new(),
            last_purged_log_id: None,
            vote,
            dead_records: 0,
            failed: false,
        };
        let recovery = inner.replay(&bytes)?;
        inner.check_invariants();
        Ok((
            LogStore {
                inner: Arc::new(Mutex::new(inner)),
                room: RoomWait::default(),
            },
            recovery,
        ))
    }

    fn lock(&self) -> MutexGuard<'_, LogInner> {
        self.inner
            .lock()
            .expect("log store mutex poisoned by a panic")
    }
}

/// Opens the log file for appending and returns its bytes; a file too short to
/// hold the magic (a crash while creating it) is started afresh.
fn open_log_file(path: &Path) -> Result<(File, Vec<u8>), StoreError> {
    let mut file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)
        .map_err(StoreError::io("open", path))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(StoreError::io("read", path))?;
    if bytes.len() < MAGIC_BYTES && LOG_MAGIC.starts_with(&bytes) {
        file.set_len(0).map_err(StoreError::io("truncate", path))?;
        file.write_all(LOG_MAGIC)
            .map_err(StoreError::io("write", path))?;
        file.sync_all().map_err(StoreError::io("fsync", path))?;
        frame::sync_parent_dir(path)?;
        bytes = LOG_MAGIC.to_vec();
    }
    if bytes.get(..MAGIC_BYTES) != Some(LOG_MAGIC.as_slice()) {
        return Err(StoreError::corrupt(path, "bad magic"));
    }
    Ok((file, bytes))
}

impl LogInner {
    fn replay(&mut self, bytes: &[u8]) -> Result<LogRecovery, StoreError> {
        let scan = frame::scan(&bytes[MAGIC_BYTES..]);
        let mut recovery = LogRecovery {
            records_replayed: 0,
            torn_bytes_truncated: 0,
        };
        for body in &scan.bodies {
            // A frame whose CRC matched but whose body does not decode was written
            // by a different program: that is corruption, not a torn write.
            let record: LogRecord = serde_json::from_slice(body)
                .map_err(|e| StoreError::corrupt(&self.log_path, e.to_string()))?;
            self.apply_record(record);
            recovery.records_replayed += 1;
        }
        let valid_bytes = (MAGIC_BYTES + scan.valid_bytes) as u64;
        let file_bytes = bytes.len() as u64;
        if valid_bytes < file_bytes {
            self.file
                .set_len(valid_bytes)
                .map_err(StoreError::io("truncate", &self.log_path))?;
            self.file
                .sync_all()
                .map_err(StoreError::io("fsync", &self.log_path))?;
            recovery.torn_bytes_truncated = file_bytes - valid_bytes;
        }
        Ok(recovery)
    }

    /// Applies a record to memory; the same code serves appends and replay.
    fn apply_record(&mut self, record: LogRecord) {
        match record {
            LogRecord::Entry(entry) => {
                let index = entry.log_id.index;
                // Appending over existing entries replaces them and everything after.
                self.remove_since(index);
                self.entries.insert(index, entry);
            }
            LogRecord::Truncate { since_index } => {
                self.remove_since(since_index);
                self.dead_records += 1;
            }
            LogRecord::Purge { upto } => {
                let kept = self.entries.split_off(&(upto.index + 1));
                self.dead_records += self.entries.len() + 1;
                self.entries = kept;
                if self.last_purged_log_id.is_none_or(|p| p < upto) {
                    self.last_purged_log_id = Some(upto);
                }
            }
        }
    }

    fn remove_since(&mut self, index: u64) {
        let removed = self.entries.split_off(&index);
        self.dead_records += removed.len();
    }

    /// Writes records as frames and `sync_data`s them. Any failure poisons the store.
    fn write_records(&mut self, records: &[LogRecord]) -> Result<(), StoreError> {
        if self.failed {
            return Err(StoreError::Failed);
        }
        let mut bytes = Vec::new();
        for record in records {
            let body = serde_json::to_vec(record).map_err(StoreError::encode("log record"))?;
            frame::encode(&body, &mut bytes);
        }
        let before_bytes = self
            .file
            .metadata()
            .map_err(StoreError::io("stat", &self.log_path))?
            .len();
        let written = self
            .file
            .write_all(&bytes)
            .and_then(|()| self.file.sync_data());
        if let Err(e) = written {
            let error = StoreError::io("append", &self.log_path)(e);
            // Out of space: nothing of this write may stay (a torn frame
            // would end the log at the next replay, and a retry appends the
            // records whole). Bytes synced before it are not touched.
            let cut_back = error.is_no_space()
                && self
                    .file
                    .set_len(before_bytes)
                    .and_then(|()| self.file.sync_data())
                    .is_ok();
            if !cut_back {
                self.failed = true;
                return Err(error.settled());
            }
            return Err(error);
        }
        Ok(())
    }

    fn append(&mut self, entries: &[Entry<TypeConfig>]) -> Result<(), StoreError> {
        let records: Vec<LogRecord> = entries.iter().cloned().map(LogRecord::Entry).collect();
        self.write_records(&records)?;
        for record in records {
            self.apply_record(record);
        }
        self.debug_check_invariants();
        Ok(())
    }

    fn truncate(&mut self, since_index: u64) -> Result<(), StoreError> {
        self.write_records(&[LogRecord::Truncate { since_index }])?;
        self.apply_record(LogRecord::Truncate { since_index });
        self.debug_check_invariants();
        Ok(())
    }

    fn purge(&mut self, upto: LogId<u64>) -> Result<(), StoreError> {
        self.write_records(&[LogRecord::Purge { upto }])?;
        self.apply_record(LogRecord::Purge { upto });
        if self.dead_records >= DEAD_RECORDS_COMPACT_MIN && self.dead_records > self.entries.len() {
            self.compact()?;
        }
        self.debug_check_invariants();
        Ok(())
    }

    /// Rewrites the log file with only the purge point and the live entries.
    fn compact(&mut self) -> Result<(), StoreError> {
        let mut bodies = Vec::with_capacity(self.entries.len() + 1);
        if let Some(upto) = self.last_purged_log_id {
            bodies.push(
                serde_json::to_vec(&LogRecord::Purge { upto })
                    .map_err(StoreError::encode("purge"))?,
            );
        }
        for entry in self.entries.values() {
            let record = LogRecord::Entry(entry.clone());
            bodies.push(serde_json::to_vec(&record).map_err(StoreError::encode("entry"))?);
        }
        let body_refs: Vec<&[u8]> = bodies.iter().map(Vec::as_slice).collect();
        if let Err(e) = frame::write_atomically(&self.log_path, LOG_MAGIC, &body_refs) {
            if e.is_no_space() {
                // The file in place is whole; the next purge compacts it.
                tracing::warn!(error = %e, "controller log not compacted: the disk is full");
                return Ok(());
            }
            self.failed = true;
            return Err(e);
        }
        self.file = OpenOptions::new()
            .append(true)
            .open(&self.log_path)
            .map_err(|e| {
                self.failed = true;
                StoreError::io("reopen", &self.log_path)(e)
            })?;
        self.dead_records = 0;
        Ok(())
    }

    fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StoreError> {
        if self.failed {
            return Err(StoreError::Failed);
        }
        let body = serde_json::to_vec(vote).map_err(StoreError::encode("vote"))?;
        frame::write_atomically(&self.vote_path, VOTE_MAGIC, &[&body])?;
        self.vote = Some(*vote);
        Ok(())
    }

    fn log_state(&self) -> LogState<TypeConfig> {
        let last = self.entries.last_key_value().map(|(_, e)| e.log_id);
        LogState {
            last_purged_log_id: self.last_purged_log_id,
            last_log_id: last.or(self.last_purged_log_id),
        }
    }

    /// O(entries), so only in debug builds on the write path.
    fn debug_check_invariants(&self) {
        if cfg!(debug_assertions) {
            self.check_invariants();
        }
    }

    fn check_invariants(&self) {
        // Neither holes nor entries below the purge point are refused: openraft never
        // makes them, but its conformance suite appends such entries on purpose and
        // expects them stored, so the store keeps whatever it is given, in order.
        for (index, entry) in &self.entries {
            assert_eq!(*index, entry.log_id.index);
        }
    }
}

fn io_error(e: &StoreError) -> io::Error {
    io::Error::other(e.to_string())
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<u64>> {
        Ok(self
            .lock()
            .entries
            .range(range)
            .map(|(_, e)| e.clone())
            .collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<u64>> {
        Ok(self.lock().log_state())
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError<u64>> {
        retry_while_full("vote", &self.room, || self.lock().save_vote(vote))
            .await
            .map_err(StoreError::into_write_vote)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError<u64>> {
        Ok(self.lock().vote)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        let result =
            retry_while_full("log append", &self.room, || self.lock().append(&entries)).await;
        // The callback reports durability, so it runs only after `sync_data` returned.
        match result {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(io_error(&e)));
                Err(e.into_write_logs())
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        retry_while_full("log truncation", &self.room, || {
            self.lock().truncate(log_id.index)
        })
        .await
        .map_err(StoreError::into_write_logs)
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        retry_while_full("log purge", &self.room, || self.lock().purge(log_id))
            .await
            .map_err(StoreError::into_write_logs)
    }
}

impl LogStore {
    /// For tests and diagnostics: the live entries' indexes and the purge point.
    pub fn summary(&self) -> (Vec<u64>, Option<LogId<u64>>) {
        let inner = self.lock();
        (
            inner.entries.keys().copied().collect(),
            inner.last_purged_log_id,
        )
    }

    /// Reads the log file's bytes, for crash tests that damage its tail.
    pub fn log_file_path(&self) -> PathBuf {
        self.lock().log_path.clone()
    }
}
