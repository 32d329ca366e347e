//! Per-partition state of idempotent producers: for each producer id its
//! epoch and the sequence ranges and offsets of its last batches. A leader
//! checks every idempotent batch against it before giving the batch offsets
//! (a repeat is answered with the original offsets, a gap or an old epoch is
//! refused); leaders and followers update it from every batch they append
//! and recovery rebuilds it from a snapshot plus the log after it, so a new
//! leader deduplicates exactly as the old one did. Pure: the log owns the
//! files.

use std::collections::{HashMap, VecDeque};

use protocol::{BatchHeader, Offset, ProducerEpoch, ProducerId, Sequence};

/// Batches remembered per producer: a client keeps at most this many
/// requests in flight per partition, so any retry it sends repeats one of
/// them.
pub const PRODUCER_BATCHES_KEPT_MAX: usize = 5;

/// Producers one snapshot may hold; a file claiming more is corrupt.
pub const SNAPSHOT_PRODUCERS_MAX: usize = 10_000_000;

/// One appended batch of a producer: its sequences and where it landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchRange {
    pub first_sequence: Sequence,
    pub last_sequence: Sequence,
    pub base_offset: Offset,
    pub last_offset: Offset,
}

/// What a partition knows of one producer id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducerEntry {
    pub epoch: ProducerEpoch,
    /// Oldest first, at most `PRODUCER_BATCHES_KEPT_MAX`.
    pub batches: VecDeque<BatchRange>,
    /// Largest batch timestamp seen: expiry counts from it.
    pub last_timestamp_ms: i64,
}

/// The leader's verdict on an idempotent batch it may append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SequenceCheck {
    /// New and in order: append it.
    Append,
    /// Already appended: answer with where it landed, append nothing.
    Duplicate(BatchRange),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SequenceError {
    #[error("producer {producer_id} sent epoch {got}, older than its current epoch {current}")]
    StaleEpoch {
        producer_id: i64,
        current: i16,
        got: i16,
    },
    #[error(
        "producer {producer_id} epoch {epoch}: sequence {got} is out of order, expected {expected}"
    )]
    OutOfOrder {
        producer_id: i64,
        epoch: i16,
        expected: i32,
        got: i32,
    },
}

/// The sequence of a batch's last record, `last_offset_delta` after its
/// first (compaction may remove records but keeps the delta), wrapping past
/// `i32::MAX` to 0 as Kafka's clients do.
pub fn last_sequence(first: Sequence, last_offset_delta: i32) -> Sequence {
    first.advanced_by(i64::from(last_offset_delta.max(0)))
}

/// The sequence after `last`.
pub fn next_sequence(last: Sequence) -> Sequence {
    last.advanced_by(1)
}

/// Whether the batch takes part in idempotence: a producer id, and records
/// with sequences (control batches have none).
pub fn is_idempotent(header: &BatchHeader) -> bool {
    header.producer_id.0 >= 0 && !header.is_control()
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProducerStateTable {
    producers: HashMap<ProducerId, ProducerEntry>,
}

impl ProducerStateTable {
    pub fn new() -> ProducerStateTable {
        ProducerStateTable::default()
    }

    pub fn len(&self) -> usize {
        self.producers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    pub fn get(&self, producer_id: ProducerId) -> Option<&ProducerEntry> {
        self.producers.get(&producer_id)
    }

    /// The leader's check of a batch it is about to append (header as the
    /// producer sent it). Batches without a producer id always append.
    pub fn check(&self, header: &BatchHeader) -> Result<SequenceCheck, SequenceError> {
        if !is_idempotent(header) {
            return Ok(SequenceCheck::Append);
        }
        let Some(entry) = self.producers.get(&header.producer_id) else {
            // Unknown here: a new producer, or one whose state expired or
            // left with the segments retention removed. Kafka accepts its
            // batch as it comes, and so do we.
            return Ok(SequenceCheck::Append);
        };
        let first = header.base_sequence;
        let last = last_sequence(first, header.last_offset_delta);
        if header.producer_epoch < entry.epoch {
            return Err(SequenceError::StaleEpoch {
                producer_id: header.producer_id.0,
                current: entry.epoch.0,
                got: header.producer_epoch.0,
            });
        }
        if header.producer_epoch > entry.epoch {
            // A bumped epoch restarts the sequences.
            return if first.0 == 0 {
                Ok(SequenceCheck::Append)
            } else {
                Err(SequenceError::OutOfOrder {
                    producer_id: header.producer_id.0,
                    epoch: header.producer_epoch.0,
                    expected: 0,
                    got: first.0,
                })
            };
        }
        if let Some(same) = entry
            .batches
            .iter()
            .find(|b| b.first_sequence == first && b.last_sequence == last)
        {
            return Ok(SequenceCheck::Duplicate(*same));
        }
        let expected = entry
            .batches
            .back()
            .map_or(Sequence(0), |b| next_sequence(b.last_sequence));
        if first == expected || entry.batches.is_empty() {
            Ok(SequenceCheck::Append)
        } else {
            Err(SequenceError::OutOfOrder {
                producer_id: header.producer_id.0,
                epoch: header.producer_epoch.0,
                expected: expected.0,
                got: first.0,
            })
        }
    }

    /// Takes an appended batch (stored header: its offsets are final), on
    /// the leader after its check and on followers and recovery as it comes.
    pub fn apply(&mut self, header: &BatchHeader) {
        if header.producer_id.0 < 0 {
            return;
        }
        let entry = self
            .producers
            .entry(header.producer_id)
            .or_insert_with(|| ProducerEntry {
                epoch: header.producer_epoch,
                batches: VecDeque::new(),
                last_timestamp_ms: header.max_timestamp_ms,
            });
        if header.producer_epoch < entry.epoch {
            // Only a leader that failed its own check could have written it;
            // the newer epoch stays.
            return;
        }
        if header.producer_epoch > entry.epoch {
            entry.epoch = header.producer_epoch;
            entry.batches.clear();
        }
        entry.last_timestamp_ms = entry.last_timestamp_ms.max(header.max_timestamp_ms);
        if !is_idempotent(header) {
            return;
        }
        entry.batches.push_back(BatchRange {
            first_sequence: header.base_sequence,
            last_sequence: last_sequence(header.base_sequence, header.last_offset_delta),
            base_offset: header.base_offset,
            last_offset: header.last_offset(),
        });
        while entry.batches.len() > PRODUCER_BATCHES_KEPT_MAX {
            entry.batches.pop_front();
        }
    }

    /// Forgets producers silent for `expiration_ms` (by batch timestamps).
    /// Returns how many went.
    pub fn remove_expired(&mut self, now_ms: i64, expiration_ms: i64) -> usize {
        let before = self.producers.len();
        self.producers
            .retain(|_, e| e.last_timestamp_ms.saturating_add(expiration_ms) > now_ms);
        before - self.producers.len()
    }

    /// Encodes the table as the state of every batch below `offset`:
    /// `[magic "RLPS"][version u16][crc32c u32 of the rest][offset i64]
    /// [count u32]` then per producer `[id i64][epoch i16][last timestamp
    /// i64][batches u8]` and per batch `[first seq i32][last seq i32][base
    /// offset i64][last offset i64]`, all big-endian, producers by id.
    pub fn encode_snapshot(&self, offset: Offset) -> Vec<u8> {
        let mut body = Vec::with_capacity(12 + self.producers.len() * 64);
        body.extend_from_slice(&offset.0.to_be_bytes());
        body.extend_from_slice(&(self.producers.len() as u32).to_be_bytes());
        let mut ids: Vec<&ProducerId> = self.producers.keys().collect();
        ids.sort();
        for id in ids {
            let entry = &self.producers[id];
            body.extend_from_slice(&id.0.to_be_bytes());
            body.extend_from_slice(&entry.epoch.0.to_be_bytes());
            body.extend_from_slice(&entry.last_timestamp_ms.to_be_bytes());
            body.push(entry.batches.len() as u8);
            for batch in &entry.batches {
                body.extend_from_slice(&batch.first_sequence.0.to_be_bytes());
                body.extend_from_slice(&batch.last_sequence.0.to_be_bytes());
                body.extend_from_slice(&batch.base_offset.0.to_be_bytes());
                body.extend_from_slice(&batch.last_offset.0.to_be_bytes());
            }
        }
        let mut out = Vec::with_capacity(10 + body.len());
        out.extend_from_slice(SNAPSHOT_MAGIC);
        out.extend_from_slice(&SNAPSHOT_VERSION.to_be_bytes());
        out.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Decodes a snapshot: the offset it stands at and the table.
    pub fn decode_snapshot(bytes: &[u8]) -> Result<(Offset, ProducerStateTable), SnapshotError> {
        let mut reader = Reader { bytes, at: 0 };
        if reader.take(4)? != SNAPSHOT_MAGIC {
            return Err(SnapshotError::Magic);
        }
        let version = reader.u16()?;
        if version != SNAPSHOT_VERSION {
            return Err(SnapshotError::Version(version));
        }
        let crc = reader.u32()?;
        let body = &bytes[reader.at..];
        if crc32c::crc32c(body) != crc {
            return Err(SnapshotError::Crc);
        }
        let offset = Offset(reader.i64()?);
        let count = reader.u32()? as usize;
        if count > SNAPSHOT_PRODUCERS_MAX {
            return Err(SnapshotError::TooMany(count));
        }
        let mut producers = HashMap::with_capacity(count.min(1 << 16));
        let mut previous: Option<ProducerId> = None;
        for _ in 0..count {
            let id = ProducerId(reader.i64()?);
            if previous.is_some_and(|p| p >= id) {
                return Err(SnapshotError::Invalid(
                    "producers not in increasing id order",
                ));
            }
            previous = Some(id);
            let epoch = ProducerEpoch(reader.i16()?);
            let last_timestamp_ms = reader.i64()?;
            let batch_count = usize::from(reader.take(1)?[0]);
            if batch_count > PRODUCER_BATCHES_KEPT_MAX || id.0 < 0 {
                return Err(SnapshotError::Invalid("producer entry"));
            }
            let mut batches = VecDeque::with_capacity(batch_count);
            for _ in 0..batch_count {
                batches.push_back(BatchRange {
                    first_sequence: Sequence(reader.i32()?),
                    last_sequence: Sequence(reader.i32()?),
                    base_offset: Offset(reader.i64()?),
                    last_offset: Offset(reader.i64()?),
                });
            }
            let entry = ProducerEntry {
                epoch,
                batches,
                last_timestamp_ms,
            };
            producers.insert(id, entry);
        }
        if reader.at != bytes.len() {
            return Err(SnapshotError::Invalid("bytes after the last producer"));
        }
        Ok((offset, ProducerStateTable { producers }))
    }
}

const SNAPSHOT_MAGIC: &[u8; 4] = b"RLPS";
const SNAPSHOT_VERSION: u16 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    #[error("not a producer snapshot (bad magic)")]
    Magic,
    #[error("producer snapshot version {0} is not known")]
    Version(u16),
    #[error("producer snapshot checksum mismatch")]
    Crc,
    #[error("producer snapshot ends early")]
    Truncated,
    #[error("producer snapshot claims {0} producers")]
    TooMany(usize),
    #[error("invalid producer snapshot: {0}")]
    Invalid(&'static str),
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        let end = self.at.checked_add(n).ok_or(SnapshotError::Truncated)?;
        let slice = self
            .bytes
            .get(self.at..end)
            .ok_or(SnapshotError::Truncated)?;
        self.at = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        Ok(self.take(N)?.try_into().expect("length taken"))
    }

    fn u16(&mut self) -> Result<u16, SnapshotError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    fn i16(&mut self) -> Result<i16, SnapshotError> {
        Ok(i16::from_be_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, SnapshotError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    fn i32(&mut self) -> Result<i32, SnapshotError> {
        Ok(i32::from_be_bytes(self.array()?))
    }

    fn i64(&mut self) -> Result<i64, SnapshotError> {
        Ok(i64::from_be_bytes(self.array()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::LeaderEpoch;

    fn header(pid: i64, epoch: i16, first: i32, count: i32, base: i64) -> BatchHeader {
        BatchHeader {
            base_offset: Offset(base),
            batch_length: 0,
            partition_leader_epoch: LeaderEpoch(0),
            magic: 2,
            crc: 0,
            attributes: 0,
            last_offset_delta: count - 1,
            base_timestamp_ms: 1_000,
            max_timestamp_ms: 1_000 + base,
            producer_id: ProducerId(pid),
            producer_epoch: ProducerEpoch(epoch),
            base_sequence: Sequence(first),
            record_count: count,
        }
    }

    #[test]
    fn sequences_wrap_past_the_largest_i32() {
        assert_eq!(last_sequence(Sequence(i32::MAX - 1), 2), Sequence(0));
        assert_eq!(next_sequence(Sequence(i32::MAX)), Sequence(0));
        assert_eq!(last_sequence(Sequence(7), 0), Sequence(7));
    }

    #[test]
    fn repeats_are_duplicates_gaps_and_old_epochs_are_refused() {
        let mut table = ProducerStateTable::new();
        let first = header(1, 0, 0, 10, 0);
        assert_eq!(table.check(&first), Ok(SequenceCheck::Append));
        table.apply(&first);
        let dup = table.check(&header(1, 0, 0, 10, 99)).unwrap();
        assert_eq!(
            dup,
            SequenceCheck::Duplicate(BatchRange {
                first_sequence: Sequence(0),
                last_sequence: Sequence(9),
                base_offset: Offset(0),
                last_offset: Offset(9),
            })
        );
        assert!(matches!(
            table.check(&header(1, 0, 11, 1, 10)),
            Err(SequenceError::OutOfOrder {
                expected: 10,
                got: 11,
                ..
            })
        ));
        assert_eq!(
            table.check(&header(1, 0, 10, 1, 10)),
            Ok(SequenceCheck::Append)
        );
        // A new epoch starts again at 0; the old epoch is then fenced.
        assert!(table.check(&header(1, 1, 5, 1, 10)).is_err());
        let bumped = header(1, 1, 0, 1, 10);
        assert_eq!(table.check(&bumped), Ok(SequenceCheck::Append));
        table.apply(&bumped);
        assert!(matches!(
            table.check(&header(1, 0, 10, 1, 11)),
            Err(SequenceError::StaleEpoch {
                current: 1,
                got: 0,
                ..
            })
        ));
    }

    #[test]
    fn only_the_last_five_batches_are_remembered() {
        let mut table = ProducerStateTable::new();
        for i in 0..7 {
            table.apply(&header(3, 0, i, 1, i64::from(i)));
        }
        let entry = table.get(ProducerId(3)).unwrap();
        assert_eq!(entry.batches.len(), PRODUCER_BATCHES_KEPT_MAX);
        assert_eq!(entry.batches[0].first_sequence, Sequence(2));
        // Older than the window: neither a known duplicate nor in order.
        assert!(table.check(&header(3, 0, 1, 1, 7)).is_err());
    }

    #[test]
    fn expiry_forgets_silent_producers() {
        let mut table = ProducerStateTable::new();
        table.apply(&header(1, 0, 0, 1, 0));
        table.apply(&header(2, 0, 0, 1, 500));
        assert_eq!(table.remove_expired(1_000 + 400, 100), 1);
        assert!(table.get(ProducerId(1)).is_none());
        assert!(table.get(ProducerId(2)).is_some());
    }

    #[test]
    fn a_snapshot_round_trips_and_damage_is_detected() {
        let mut table = ProducerStateTable::new();
        for i in 0..12 {
            table.apply(&header(i % 4, (i % 2) as i16, i as i32, 3, i * 3));
        }
        let bytes = table.encode_snapshot(Offset(36));
        assert_eq!(
            ProducerStateTable::decode_snapshot(&bytes),
            Ok((Offset(36), table.clone()))
        );
        for cut in 0..bytes.len() {
            assert!(ProducerStateTable::decode_snapshot(&bytes[..cut]).is_err());
        }
        let mut flipped = bytes.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert_eq!(
            ProducerStateTable::decode_snapshot(&flipped),
            Err(SnapshotError::Crc)
        );
    }
}
