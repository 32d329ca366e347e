//! The aborted transactions of a partition: for each, the producer, where
//! its first batch and its abort marker sit. A read_committed fetch returns
//! the ones overlapping what it reads, so consumers skip the aborted
//! batches. Held in memory by marker offset and persisted per segment as a
//! `{base}.txnindex` file (the aborts whose marker lies in that segment),
//! written whole when the segment is finished or the log closes; the log
//! after the newest producer snapshot is replayed at open, so a file is only
//! trusted below where that replay starts. Pure: the log owns the files.

use std::collections::BTreeMap;

use protocol::{Offset, ProducerId};

/// Entries one file may hold; a file claiming more is corrupt.
pub const TXN_INDEX_ENTRIES_MAX: usize = 10_000_000;

const FILE_MAGIC: &[u8; 4] = b"RLTX";
const FILE_VERSION: u16 = 1;
const FILE_HEADER_BYTES: usize = 4 + 2 + 4 + 4;
const ENTRY_BYTES: usize = 24;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AbortedTxn {
    pub producer_id: ProducerId,
    pub first_offset: Offset,
    /// The abort marker's offset.
    pub last_offset: Offset,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AbortedIndex {
    by_marker: BTreeMap<Offset, AbortedTxn>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TxnIndexError {
    #[error("not a transaction index (bad magic)")]
    Magic,
    #[error("transaction index version {0} is not known")]
    Version(u16),
    #[error("transaction index checksum mismatch")]
    Crc,
    #[error("transaction index length does not match its entry count")]
    Length,
    #[error("invalid transaction index entry")]
    Entry,
}

impl AbortedIndex {
    pub fn new() -> AbortedIndex {
        AbortedIndex::default()
    }

    pub fn len(&self) -> usize {
        self.by_marker.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_marker.is_empty()
    }

    pub fn insert(&mut self, txn: AbortedTxn) {
        assert!(
            txn.first_offset <= txn.last_offset,
            "an abort marker follows its transaction's first batch: {txn:?}"
        );
        self.by_marker.insert(txn.last_offset, txn);
    }

    /// Forgets aborts whose marker is at or past `offset` (truncation).
    pub fn truncate_from(&mut self, offset: Offset) {
        self.by_marker.split_off(&offset);
    }

    /// Forgets aborts whose marker is below `log_start` (retention).
    pub fn remove_below(&mut self, log_start: Offset) {
        self.by_marker = self.by_marker.split_off(&log_start);
    }

    /// Aborts whose marker lies in `[from, to)`, by marker offset.
    pub fn with_marker_in(&self, from: Offset, to: Offset) -> Vec<AbortedTxn> {
        if from >= to {
            return Vec::new();
        }
        self.by_marker.range(from..to).map(|(_, t)| *t).collect()
    }

    /// Aborts a reader of `[from, to)` must know: begun before `to`, ended
    /// at or after `from`. Oldest first (by first offset).
    pub fn overlapping(&self, from: Offset, to: Offset) -> Vec<AbortedTxn> {
        let mut out: Vec<AbortedTxn> = self
            .by_marker
            .range(from..)
            .map(|(_, t)| *t)
            .filter(|t| t.first_offset < to)
            .collect();
        out.sort_by_key(|t| (t.first_offset, t.producer_id));
        out
    }

    /// Encodes `entries` as one file: `[magic "RLTX"][version u16][crc32c
    /// u32 of the rest][count u32]` then per entry `[producer id i64][first
    /// offset i64][last offset i64]`, big-endian.
    pub fn encode_file(entries: &[AbortedTxn]) -> Vec<u8> {
        let mut body = Vec::with_capacity(4 + entries.len() * ENTRY_BYTES);
        body.extend_from_slice(&(entries.len() as u32).to_be_bytes());
        for entry in entries {
            body.extend_from_slice(&entry.producer_id.0.to_be_bytes());
            body.extend_from_slice(&entry.first_offset.0.to_be_bytes());
            body.extend_from_slice(&entry.last_offset.0.to_be_bytes());
        }
        let mut out = Vec::with_capacity(FILE_HEADER_BYTES + body.len());
        out.extend_from_slice(FILE_MAGIC);
        out.extend_from_slice(&FILE_VERSION.to_be_bytes());
        out.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    pub fn decode_file(bytes: &[u8]) -> Result<Vec<AbortedTxn>, TxnIndexError> {
        if bytes.len() < FILE_HEADER_BYTES {
            return Err(TxnIndexError::Length);
        }
        if &bytes[..4] != FILE_MAGIC {
            return Err(TxnIndexError::Magic);
        }
        let version = u16::from_be_bytes([bytes[4], bytes[5]]);
        if version != FILE_VERSION {
            return Err(TxnIndexError::Version(version));
        }
        let crc = u32::from_be_bytes(bytes[6..10].try_into().expect("4 bytes"));
        let body = &bytes[10..];
        if crc32c::crc32c(body) != crc {
            return Err(TxnIndexError::Crc);
        }
        let count = u32::from_be_bytes(body[..4].try_into().expect("4 bytes")) as usize;
        if count > TXN_INDEX_ENTRIES_MAX || body.len() != 4 + count * ENTRY_BYTES {
            return Err(TxnIndexError::Length);
        }
        let i64_at = |at: usize| i64::from_be_bytes(body[at..at + 8].try_into().expect("8 bytes"));
        let mut out = Vec::with_capacity(count);
        for i in 0..count {
            let at = 4 + i * ENTRY_BYTES;
            let entry = AbortedTxn {
                producer_id: ProducerId(i64_at(at)),
                first_offset: Offset(i64_at(at + 8)),
                last_offset: Offset(i64_at(at + 16)),
            };
            if entry.producer_id.0 < 0
                || entry.first_offset.0 < 0
                || entry.first_offset > entry.last_offset
            {
                return Err(TxnIndexError::Entry);
            }
            out.push(entry);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(pid: i64, first: i64, last: i64) -> AbortedTxn {
        AbortedTxn {
            producer_id: ProducerId(pid),
            first_offset: Offset(first),
            last_offset: Offset(last),
        }
    }

    #[test]
    fn a_reader_learns_every_abort_overlapping_its_range() {
        let mut index = AbortedIndex::new();
        index.insert(txn(1, 0, 10));
        index.insert(txn(2, 5, 30));
        index.insert(txn(3, 20, 25));
        index.insert(txn(4, 40, 41));
        assert_eq!(
            index.overlapping(Offset(11), Offset(21)),
            vec![txn(2, 5, 30), txn(3, 20, 25)]
        );
        assert_eq!(index.overlapping(Offset(0), Offset(1)), vec![txn(1, 0, 10)]);
        assert_eq!(index.overlapping(Offset(42), Offset(50)), vec![]);
        assert_eq!(
            index.with_marker_in(Offset(10), Offset(30)),
            vec![txn(1, 0, 10), txn(3, 20, 25)]
        );
        index.truncate_from(Offset(30));
        index.remove_below(Offset(11));
        assert_eq!(
            index.with_marker_in(Offset(0), Offset(100)),
            vec![txn(3, 20, 25)]
        );
    }

    #[test]
    fn files_round_trip_and_damage_is_detected() {
        let entries = vec![txn(1, 0, 10), txn(9, 3, 12)];
        let bytes = AbortedIndex::encode_file(&entries);
        assert_eq!(AbortedIndex::decode_file(&bytes), Ok(entries));
        for cut in 0..bytes.len() {
            assert!(AbortedIndex::decode_file(&bytes[..cut]).is_err());
        }
        let mut flipped = bytes.clone();
        flipped[20] ^= 1;
        assert_eq!(AbortedIndex::decode_file(&flipped), Err(TxnIndexError::Crc));
        assert_eq!(
            AbortedIndex::decode_file(&AbortedIndex::encode_file(&[])),
            Ok(vec![])
        );
    }
}
