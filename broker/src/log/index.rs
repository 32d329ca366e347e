//! The sparse offset index and the time index of one segment: in-memory sorted
//! entries, lookups, and their file encodings (docs/formats/segment.md).
//! Files are written whole when a segment closes; the active segment's indexes
//! live in memory and are rebuilt by recovery after a crash.

use protocol::Offset;

pub const OFFSET_INDEX_MAGIC: &[u8; 4] = b"RLIX";
pub const TIME_INDEX_MAGIC: &[u8; 4] = b"RLTI";
pub const INDEX_FORMAT_VERSION: u32 = 1;
pub const INDEX_HEADER_BYTES: usize = 8;
pub const OFFSET_ENTRY_BYTES: usize = 8;
pub const TIME_ENTRY_BYTES: usize = 12;

/// Why an index file cannot be used; recovery rebuilds the index instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    #[error("index file is shorter than its header")]
    Truncated,
    #[error("index file has a bad magic or version")]
    BadHeader,
    #[error("index file length {0} is not a whole number of entries")]
    PartialEntry(usize),
    #[error("entry {0} is not after the entry before it")]
    NotIncreasing(usize),
    #[error("entry {0} points past the segment")]
    OutOfSegment(usize),
}

/// One sparse entry: the batch starting at `base + relative_offset` begins at
/// byte `position` of the segment file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffsetEntry {
    pub relative_offset: u32,
    pub position: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OffsetIndex {
    entries: Vec<OffsetEntry>,
}

impl OffsetIndex {
    pub fn push(&mut self, entry: OffsetEntry) {
        if let Some(last) = self.entries.last() {
            assert!(entry.relative_offset > last.relative_offset && entry.position > last.position);
        }
        self.entries.push(entry);
    }

    pub fn entries(&self) -> &[OffsetEntry] {
        &self.entries
    }

    pub fn last(&self) -> Option<OffsetEntry> {
        self.entries.last().copied()
    }

    /// Start position for a scan that finds `relative_offset`: the last entry at
    /// or before it, else the segment start.
    pub fn lookup(&self, relative_offset: u32) -> OffsetEntry {
        let at = self
            .entries
            .partition_point(|e| e.relative_offset <= relative_offset);
        if at == 0 {
            OffsetEntry {
                relative_offset: 0,
                position: 0,
            }
        } else {
            self.entries[at - 1]
        }
    }

    /// Drops entries for batches at or after `position` (truncation).
    pub fn truncate_to_position(&mut self, position: u32) {
        let keep = self.entries.partition_point(|e| e.position < position);
        self.entries.truncate(keep);
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(INDEX_HEADER_BYTES + self.entries.len() * OFFSET_ENTRY_BYTES);
        out.extend_from_slice(OFFSET_INDEX_MAGIC);
        out.extend_from_slice(&INDEX_FORMAT_VERSION.to_be_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.relative_offset.to_be_bytes());
            out.extend_from_slice(&e.position.to_be_bytes());
        }
        out
    }

    /// Decodes and checks an index file against its segment's size and offset span.
    pub fn decode(
        bytes: &[u8],
        segment_bytes: u64,
        offset_span: u64,
    ) -> Result<OffsetIndex, IndexError> {
        let body = check_header(bytes, OFFSET_INDEX_MAGIC, OFFSET_ENTRY_BYTES)?;
        let mut index = OffsetIndex::default();
        for (i, chunk) in body.chunks_exact(OFFSET_ENTRY_BYTES).enumerate() {
            let entry = OffsetEntry {
                relative_offset: u32::from_be_bytes(chunk[0..4].try_into().expect("4")),
                position: u32::from_be_bytes(chunk[4..8].try_into().expect("4")),
            };
            if u64::from(entry.position) >= segment_bytes
                || u64::from(entry.relative_offset) >= offset_span
            {
                return Err(IndexError::OutOfSegment(i));
            }
            if let Some(last) = index.entries.last() {
                if entry.relative_offset <= last.relative_offset || entry.position <= last.position
                {
                    return Err(IndexError::NotIncreasing(i));
                }
            }
            index.entries.push(entry);
        }
        Ok(index)
    }
}

/// One time entry: every record before the batch at `base + relative_offset`,
/// and that batch itself, has a timestamp at most `timestamp_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeEntry {
    pub timestamp_ms: i64,
    pub relative_offset: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TimeIndex {
    entries: Vec<TimeEntry>,
}

impl TimeIndex {
    /// Adds an entry if it raises the maximum timestamp; returns whether it did.
    pub fn maybe_push(&mut self, entry: TimeEntry) -> bool {
        if let Some(last) = self.entries.last() {
            assert!(entry.relative_offset > last.relative_offset);
            if entry.timestamp_ms <= last.timestamp_ms {
                return false;
            }
        }
        self.entries.push(entry);
        true
    }

    pub fn entries(&self) -> &[TimeEntry] {
        &self.entries
    }

    pub fn last(&self) -> Option<TimeEntry> {
        self.entries.last().copied()
    }

    /// Offset from which a scan for the first record at or after `timestamp_ms`
    /// may start: the last entry whose maximum is still below it.
    pub fn scan_start(&self, timestamp_ms: i64) -> Option<TimeEntry> {
        let at = self
            .entries
            .partition_point(|e| e.timestamp_ms < timestamp_ms);
        at.checked_sub(1).map(|i| self.entries[i])
    }

    pub fn truncate_to_offset(&mut self, relative_offset: u32) {
        let keep = self
            .entries
            .partition_point(|e| e.relative_offset < relative_offset);
        self.entries.truncate(keep);
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(INDEX_HEADER_BYTES + self.entries.len() * TIME_ENTRY_BYTES);
        out.extend_from_slice(TIME_INDEX_MAGIC);
        out.extend_from_slice(&INDEX_FORMAT_VERSION.to_be_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.timestamp_ms.to_be_bytes());
            out.extend_from_slice(&e.relative_offset.to_be_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8], offset_span: u64) -> Result<TimeIndex, IndexError> {
        let body = check_header(bytes, TIME_INDEX_MAGIC, TIME_ENTRY_BYTES)?;
        let mut index = TimeIndex::default();
        for (i, chunk) in body.chunks_exact(TIME_ENTRY_BYTES).enumerate() {
            let entry = TimeEntry {
                timestamp_ms: i64::from_be_bytes(chunk[0..8].try_into().expect("8")),
                relative_offset: u32::from_be_bytes(chunk[8..12].try_into().expect("4")),
            };
            if u64::from(entry.relative_offset) >= offset_span {
                return Err(IndexError::OutOfSegment(i));
            }
            if let Some(last) = index.entries.last() {
                if entry.relative_offset <= last.relative_offset
                    || entry.timestamp_ms <= last.timestamp_ms
                {
                    return Err(IndexError::NotIncreasing(i));
                }
            }
            index.entries.push(entry);
        }
        Ok(index)
    }
}

fn check_header<'a>(
    bytes: &'a [u8],
    magic: &[u8; 4],
    entry_bytes: usize,
) -> Result<&'a [u8], IndexError> {
    if bytes.len() < INDEX_HEADER_BYTES {
        return Err(IndexError::Truncated);
    }
    if &bytes[0..4] != magic || bytes[4..8] != INDEX_FORMAT_VERSION.to_be_bytes() {
        return Err(IndexError::BadHeader);
    }
    let body = &bytes[INDEX_HEADER_BYTES..];
    if !body.len().is_multiple_of(entry_bytes) {
        return Err(IndexError::PartialEntry(bytes.len()));
    }
    Ok(body)
}

/// Offset of an index entry relative to its segment base; a segment never spans
/// more than u32::MAX offsets (it rolls first).
pub fn relative(base: Offset, offset: Offset) -> u32 {
    u32::try_from(offset.0 - base.0).expect("offset within segment span")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Lookup agrees with a linear scan of the same entries.
        #[test]
        fn lookup_matches_linear_scan(steps in proptest::collection::vec((1u32..50, 1u32..5000), 0..100), probe in 0u32..3000) {
            let mut index = OffsetIndex::default();
            let (mut off, mut pos) = (0u32, 0u32);
            for (d_off, d_pos) in steps {
                off += d_off;
                pos += d_pos;
                index.push(OffsetEntry { relative_offset: off, position: pos });
            }
            let linear = index.entries().iter().rev().find(|e| e.relative_offset <= probe).copied()
                .unwrap_or(OffsetEntry { relative_offset: 0, position: 0 });
            prop_assert_eq!(index.lookup(probe), linear);
            let decoded = OffsetIndex::decode(&index.encode(), u64::from(pos) + 1, u64::from(off) + 1).unwrap();
            prop_assert_eq!(decoded, index);
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = OffsetIndex::decode(&bytes, 1 << 20, 1 << 20);
            let _ = TimeIndex::decode(&bytes, 1 << 20);
        }
    }

    #[test]
    fn time_index_keeps_only_rising_maxima() {
        let mut index = TimeIndex::default();
        assert!(index.maybe_push(TimeEntry {
            timestamp_ms: 10,
            relative_offset: 0
        }));
        assert!(!index.maybe_push(TimeEntry {
            timestamp_ms: 10,
            relative_offset: 5
        }));
        assert!(index.maybe_push(TimeEntry {
            timestamp_ms: 20,
            relative_offset: 9
        }));
        assert_eq!(index.scan_start(5), None);
        assert_eq!(index.scan_start(15).unwrap().relative_offset, 0);
        assert_eq!(index.scan_start(25).unwrap().relative_offset, 9);
        let decoded = TimeIndex::decode(&index.encode(), 100).unwrap();
        assert_eq!(decoded, index);
        assert_eq!(
            TimeIndex::decode(&index.encode(), 5),
            Err(IndexError::OutOfSegment(1))
        );
    }
}
