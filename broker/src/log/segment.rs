//! One segment of a partition log: its files, its in-memory indexes and, while
//! active or closing, its unwritten tail. File names carry the base offset:
//! `00000000000000000000.log`, `.index`, `.timeindex`; and how those small
//! files are written whole.

use std::path::{Path, PathBuf};

use protocol::{BatchHeader, LeaderEpoch, Offset};

use super::error::{LogError, LogResult};
use super::index::{relative, OffsetEntry, OffsetIndex, TimeEntry, TimeIndex};
use super::tail::Tail;
use crate::runtime::{AlignedBuffer, DirectFile, DIRECT_IO_ALIGNMENT_BYTES};

pub const LOG_SUFFIX: &str = "log";
pub const INDEX_SUFFIX: &str = "index";
pub const TIME_INDEX_SUFFIX: &str = "timeindex";

pub fn segment_path(dir: &Path, base: Offset, suffix: &str) -> PathBuf {
    dir.join(format!("{:020}.{suffix}", base.0))
}

/// Parses a segment file name into its base offset and suffix.
pub fn parse_segment_name(name: &str) -> Option<(Offset, &str)> {
    let (stem, suffix) = name.split_once('.')?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((Offset(stem.parse().ok()?), suffix))
}

#[derive(Debug)]
pub struct Segment {
    pub base: Offset,
    /// Offset after the last batch in this segment.
    pub next_offset: Offset,
    /// Valid bytes of the segment (appended, written or not).
    pub size_bytes: u64,
    /// Newest record timestamp in the segment, -1 when empty.
    pub max_timestamp_ms: i64,
    pub created_ms: i64,
    pub latest_epoch: LeaderEpoch,
    pub offset_index: OffsetIndex,
    pub time_index: TimeIndex,
    pub bytes_since_index_entry: u64,
    /// Opened lazily for a new segment: created by its first write.
    pub file: Option<DirectFile>,
    /// Present while the segment is active or closing.
    pub tail: Option<Tail>,
    /// Rolled, waiting for its last writes, sync and index files.
    pub closing: bool,
    /// How far this process has extended the file with allocated space
    /// (`DirectFile::preallocate`) ahead of its writes; 0 when unknown.
    /// A hint for the write path only: nothing reads the file by it.
    pub allocated_bytes: u64,
}

impl Segment {
    pub fn new_active(
        base: Offset,
        created_ms: i64,
        chunk_bytes: usize,
        index_interval_bytes: u32,
    ) -> Segment {
        Segment {
            base,
            next_offset: base,
            size_bytes: 0,
            max_timestamp_ms: -1,
            created_ms,
            latest_epoch: LeaderEpoch(0),
            offset_index: OffsetIndex::default(),
            time_index: TimeIndex::default(),
            bytes_since_index_entry: u64::from(index_interval_bytes),
            file: None,
            tail: Some(Tail::new(chunk_bytes, 0, &[])),
            closing: false,
            allocated_bytes: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.size_bytes == 0
    }

    /// Accounts for a batch placed at the end of the segment and adds index
    /// entries every `index_interval_bytes`.
    pub fn account_batch(&mut self, header: &BatchHeader, index_interval_bytes: u32) {
        // Compaction leaves holes between batches; offsets only go up.
        assert!(
            header.base_offset >= self.next_offset,
            "batch {} placed below the segment's next offset {}",
            header.base_offset,
            self.next_offset
        );
        let position = self.size_bytes;
        let size = header.total_bytes() as u64;
        self.max_timestamp_ms = self.max_timestamp_ms.max(header.max_timestamp_ms);
        if self.bytes_since_index_entry >= u64::from(index_interval_bytes) {
            let relative_offset = relative(self.base, header.base_offset);
            let position = u32::try_from(position).expect("segment position fits u32");
            self.offset_index.push(OffsetEntry {
                relative_offset,
                position,
            });
            self.time_index.maybe_push(TimeEntry {
                timestamp_ms: self.max_timestamp_ms,
                relative_offset,
            });
            self.bytes_since_index_entry = 0;
        }
        self.bytes_since_index_entry += size;
        self.size_bytes += size;
        self.next_offset = header.next_offset();
        self.latest_epoch = header.partition_leader_epoch;
    }

    pub fn offset_span(&self) -> u64 {
        (self.next_offset.0 - self.base.0) as u64
    }

    pub fn check_invariants(&self) {
        assert!(self.next_offset >= self.base);
        assert_eq!(self.is_empty(), self.next_offset == self.base);
        if let Some(tail) = &self.tail {
            assert_eq!(
                tail.end(),
                self.size_bytes,
                "tail ends where the segment does"
            );
        }
        assert!(self.closing <= self.tail.is_some());
    }
}

pub(super) fn remove_if_exists(path: &Path) -> LogResult<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(LogError::io(path, e)),
    }
}

/// Writes a whole small file (an index) with direct I/O: padded aligned write,
/// then truncation to the exact length and a sync.
pub(super) async fn write_small_file(path: &Path, bytes: &[u8]) -> LogResult<()> {
    remove_if_exists(path)?;
    let file = DirectFile::create_new(path)
        .await
        .map_err(|e| LogError::io(path, e))?;
    let padded =
        (bytes.len() as u64).div_ceil(DIRECT_IO_ALIGNMENT_BYTES) * DIRECT_IO_ALIGNMENT_BYTES;
    if padded > 0 {
        let mut buffer = AlignedBuffer::new(padded as usize);
        buffer.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
        buffer.as_mut_slice()[bytes.len()..].fill(0);
        let shared = buffer.seal(padded as usize);
        file.write_at(&shared, 0)
            .await
            .map_err(|e| LogError::io(path, e))?;
    }
    file.truncate(bytes.len() as u64)
        .await
        .map_err(|e| LogError::io(path, e))?;
    file.fdatasync().await.map_err(|e| LogError::io(path, e))?;
    Ok(())
}
