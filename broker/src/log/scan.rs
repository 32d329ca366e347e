//! Sequential validation of a segment file, batch by batch: the one place that
//! decides whether stored bytes are a valid batch. Recovery, truncation and
//! `verify-log` all walk segments through it.

use std::io;

use protocol::record_batch::peek_total_bytes;
use protocol::{BatchHeader, LeaderEpoch, Offset, RecordBatch, BATCH_HEADER_BYTES};

use crate::runtime::{DirectFile, ReadBytes};

/// Bytes read from the file at a time while scanning.
const SCAN_WINDOW_BYTES: usize = 1 << 20;

/// A valid batch found by the scanner.
#[derive(Clone, Copy, Debug)]
pub struct ScannedBatch {
    pub position: u64,
    pub header: BatchHeader,
}

impl ScannedBatch {
    pub fn end_position(&self) -> u64 {
        self.position + self.header.total_bytes() as u64
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    #[error("invalid batch at byte {position}: {reason}")]
    Corrupt { position: u64, reason: String },
}

/// How thoroughly each batch is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanDepth {
    /// Header fields and the continuity of offsets and epochs only.
    Headers,
    /// Also the CRC over the whole batch.
    Crc,
}

#[derive(Debug)]
pub struct SegmentScanner {
    file: DirectFile,
    file_bytes: u64,
    position: u64,
    window: Option<(u64, ReadBytes)>,
    expected_base: Option<Offset>,
    latest_epoch: LeaderEpoch,
    batch_bytes_max: usize,
    depth: ScanDepth,
    last: Option<ScannedBatch>,
}

impl SegmentScanner {
    /// Scans `file` (valid bytes [position, file_bytes)) expecting the first batch
    /// at or after `expected_base` when given.
    pub fn new(
        file: DirectFile,
        file_bytes: u64,
        position: u64,
        expected_base: Option<Offset>,
        batch_bytes_max: usize,
        depth: ScanDepth,
    ) -> SegmentScanner {
        SegmentScanner {
            file,
            file_bytes,
            position,
            window: None,
            expected_base,
            latest_epoch: LeaderEpoch(0),
            batch_bytes_max,
            depth,
            last: None,
        }
    }

    /// Requires epochs to be at least `epoch` (the previous segment's last).
    pub fn with_latest_epoch(mut self, epoch: LeaderEpoch) -> SegmentScanner {
        self.latest_epoch = epoch;
        self
    }

    pub fn position(&self) -> u64 {
        self.position
    }

    pub fn latest_epoch(&self) -> LeaderEpoch {
        self.latest_epoch
    }

    /// The bytes of the batch last returned by [`next`](Self::next).
    pub fn last_bytes(&self) -> &[u8] {
        let last = self.last.expect("a batch was returned");
        let (start, window) = self.window.as_ref().expect("window holds the last batch");
        let from = (last.position - start) as usize;
        &window[from..from + last.header.total_bytes()]
    }

    /// Makes the window hold [position, position + len); false if the file ends first.
    async fn ensure(&mut self, len: usize) -> Result<bool, ScanError> {
        let end = self.position + len as u64;
        if end > self.file_bytes {
            return Ok(false);
        }
        let covered = matches!(&self.window, Some((start, w)) if *start <= self.position && end <= start + w.len() as u64);
        if !covered {
            let want = len
                .max(SCAN_WINDOW_BYTES)
                .min((self.file_bytes - self.position) as usize);
            let bytes = self.file.read_at(self.position, want).await?;
            if bytes.len() < len {
                return Ok(false);
            }
            self.window = Some((self.position, bytes));
        }
        Ok(true)
    }

    fn current(&self, len: usize) -> &[u8] {
        let (start, window) = self.window.as_ref().expect("window ensured");
        let from = (self.position - start) as usize;
        &window[from..from + len]
    }

    fn corrupt(&self, reason: impl Into<String>) -> ScanError {
        ScanError::Corrupt {
            position: self.position,
            reason: reason.into(),
        }
    }

    /// The next valid batch, `None` at the clean end of the valid bytes, or the
    /// reason the bytes at the current position are not a valid batch.
    pub async fn next(&mut self) -> Result<Option<ScannedBatch>, ScanError> {
        if self.position == self.file_bytes {
            return Ok(None);
        }
        if !self.ensure(BATCH_HEADER_BYTES).await? {
            return Err(self.corrupt("truncated batch header"));
        }
        let total =
            peek_total_bytes(self.current(BATCH_HEADER_BYTES)).expect("header bytes present");
        if total < BATCH_HEADER_BYTES as i64 || total > self.batch_bytes_max as i64 {
            return Err(self.corrupt(format!(
                "batch length {total} outside 61..={}",
                self.batch_bytes_max
            )));
        }
        if !self.ensure(total as usize).await? {
            return Err(self.corrupt(format!(
                "batch of {total} bytes runs past the end of the file"
            )));
        }
        let bytes = self.current(total as usize);
        let header = match self.depth {
            ScanDepth::Headers => BatchHeader::parse(bytes),
            ScanDepth::Crc => RecordBatch::parse(bytes, self.batch_bytes_max).map(|b| *b.header()),
        }
        .map_err(|e| self.corrupt(e.to_string()))?;
        self.check_continuity(&header)?;
        let batch = ScannedBatch {
            position: self.position,
            header,
        };
        self.expected_base = Some(header.next_offset());
        self.latest_epoch = header.partition_leader_epoch;
        self.position = batch.end_position();
        self.last = Some(batch);
        Ok(Some(batch))
    }

    /// Checks the fields the CRC does not cover: base offset and leader epoch.
    fn check_continuity(&self, header: &BatchHeader) -> Result<(), ScanError> {
        if let Some(expected) = self.expected_base {
            // Compaction may drop whole batches: a batch starts at or after
            // where the previous one ended, never before.
            if header.base_offset < expected {
                return Err(self.corrupt(format!(
                    "base offset {} below the {} where the previous batch ended",
                    header.base_offset, expected
                )));
            }
        }
        if header.partition_leader_epoch < self.latest_epoch {
            return Err(self.corrupt(format!(
                "leader epoch {} below the preceding {}",
                header.partition_leader_epoch, self.latest_epoch
            )));
        }
        Ok(())
    }
}
