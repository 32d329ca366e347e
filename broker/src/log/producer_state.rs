//! Per-partition state of idempotent producers: for each producer id its
//! epoch and the sequence ranges and offsets of its last batches. A leader
//! checks every idempotent batch against it before giving the batch offsets
//! (a repeat is answered with the original offsets, a gap or an old epoch is
//! refused); leaders and followers update it from every batch they append
//! and recovery rebuilds it from a snapshot plus the log after it, so a new
//! leader deduplicates exactly as the old one did. It also follows
//! transactions: where each producer's open transaction began (the last
//! stable offset stops before the oldest one) and which ones a marker ended.
//! Pure: the log owns the files.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use protocol::record_batch::marker::{MarkerKind, TxnMarker};
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
    /// Offset of the first batch of the producer's open transaction here.
    pub txn_first_offset: Option<Offset>,
    /// Epoch of the coordinator whose marker this partition took last.
    pub coordinator_epoch: i32,
    /// The last marker taken here that carried a transaction number: a
    /// marker of that transaction or an earlier one is a resend (a new
    /// coordinator finishing what its predecessor had partly done) and is
    /// not written again.
    pub last_marker: Option<LastMarker>,
}

/// Which transaction a producer's last numbered marker here ended, and
/// where it sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LastMarker {
    pub transaction_number: i64,
    pub offset: Offset,
}

/// The leader's verdict on a marker it may write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkerCheck {
    /// Write it.
    Append,
    /// The transaction was ended here already, by the marker at this offset
    /// (or a later transaction's): write nothing.
    Written(Offset),
}

/// A transaction a marker ended in this partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompletedTxn {
    pub producer_id: ProducerId,
    pub first_offset: Offset,
    /// Where the marker sits.
    pub marker_offset: Offset,
    pub kind: MarkerKind,
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
    #[error(
        "producer {producer_id} is not known here and its batch starts at sequence {got}, not 0"
    )]
    UnknownProducer { producer_id: i64, got: i32 },
    #[error("producer {producer_id} has a transaction open here and sent a batch outside it")]
    NotInTransaction { producer_id: i64 },
    #[error("producer {producer_id} sent a transactional batch without a producer epoch")]
    InvalidTransactional { producer_id: i64 },
    #[error("marker from coordinator epoch {got}, older than {current}")]
    CoordinatorFenced { current: i32, got: i32 },
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
    /// Open transactions by where they began: the oldest bounds the last
    /// stable offset.
    ongoing: BTreeSet<(Offset, ProducerId)>,
    /// Transactions ended by a marker the high watermark has not passed yet
    /// (marker offset -> first offset): still unstable, since the marker may
    /// yet be lost with a leader change.
    completed: BTreeMap<Offset, Offset>,
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
        if header.is_transactional() && (header.producer_id.0 < 0 || header.producer_epoch.0 < 0) {
            return Err(SequenceError::InvalidTransactional {
                producer_id: header.producer_id.0,
            });
        }
        if !is_idempotent(header) {
            return Ok(SequenceCheck::Append);
        }
        let first = header.base_sequence;
        let Some(entry) = self.producers.get(&header.producer_id) else {
            // Unknown here: a new producer starts at 0. A later batch may be
            // one that overtook the producer's first (a client keeps several
            // in flight, and a new leader may hold none of them): taking it
            // would put it before the records it follows. A producer whose
            // state expired numbers its batches here again from 0.
            return if first.0 == 0 {
                Ok(SequenceCheck::Append)
            } else {
                Err(SequenceError::UnknownProducer {
                    producer_id: header.producer_id.0,
                    got: first.0,
                })
            };
        };
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
        if entry.txn_first_offset.is_some() && !header.is_transactional() {
            return Err(SequenceError::NotInTransaction {
                producer_id: header.producer_id.0,
            });
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

    /// The leader's check of a marker it is about to write for the
    /// producer: not from an older producer epoch nor an older coordinator,
    /// and not for a transaction a marker here already ended.
    pub fn check_marker(
        &self,
        producer_id: ProducerId,
        producer_epoch: ProducerEpoch,
        marker: TxnMarker,
    ) -> Result<MarkerCheck, SequenceError> {
        let Some(entry) = self.producers.get(&producer_id) else {
            return Ok(MarkerCheck::Append);
        };
        if producer_epoch < entry.epoch {
            return Err(SequenceError::StaleEpoch {
                producer_id: producer_id.0,
                current: entry.epoch.0,
                got: producer_epoch.0,
            });
        }
        if marker.coordinator_epoch < entry.coordinator_epoch {
            return Err(SequenceError::CoordinatorFenced {
                current: entry.coordinator_epoch,
                got: marker.coordinator_epoch,
            });
        }
        match entry.last_marker {
            // Numbers count one transactional id's transactions, and a
            // producer id serves one transactional id.
            Some(last)
                if marker.transaction_number > 0
                    && marker.transaction_number <= last.transaction_number =>
            {
                Ok(MarkerCheck::Written(last.offset))
            }
            _ => Ok(MarkerCheck::Append),
        }
    }

    /// Takes an appended batch (stored header: its offsets are final), on
    /// the leader after its check and on followers and recovery as it comes.
    /// `marker` is the decoded marker of a control batch (`None` for data
    /// batches). Returns the transaction a marker ended, if one was open.
    pub fn apply(
        &mut self,
        header: &BatchHeader,
        marker: Option<TxnMarker>,
    ) -> Option<CompletedTxn> {
        if header.producer_id.0 < 0 {
            return None;
        }
        let entry = self
            .producers
            .entry(header.producer_id)
            .or_insert_with(|| ProducerEntry {
                epoch: header.producer_epoch,
                batches: VecDeque::new(),
                last_timestamp_ms: header.max_timestamp_ms,
                txn_first_offset: None,
                coordinator_epoch: -1,
                last_marker: None,
            });
        if header.producer_epoch < entry.epoch {
            // Only a leader that failed its own check could have written it;
            // the newer epoch stays.
            return None;
        }
        if header.producer_epoch > entry.epoch {
            entry.epoch = header.producer_epoch;
            entry.batches.clear();
        }
        entry.last_timestamp_ms = entry.last_timestamp_ms.max(header.max_timestamp_ms);
        if header.is_control() {
            // A control batch never opens a transaction; one that is no
            // readable marker ends nothing.
            let marker = marker?;
            entry.coordinator_epoch = entry.coordinator_epoch.max(marker.coordinator_epoch);
            let newer = entry
                .last_marker
                .is_none_or(|last| marker.transaction_number > last.transaction_number);
            if marker.transaction_number > 0 && newer {
                entry.last_marker = Some(LastMarker {
                    transaction_number: marker.transaction_number,
                    offset: header.base_offset,
                });
            }
            let first = entry.txn_first_offset.take()?;
            self.ongoing.remove(&(first, header.producer_id));
            self.completed.insert(header.base_offset, first);
            return Some(CompletedTxn {
                producer_id: header.producer_id,
                first_offset: first,
                marker_offset: header.base_offset,
                kind: marker.kind,
            });
        }
        if header.is_transactional() && entry.txn_first_offset.is_none() {
            entry.txn_first_offset = Some(header.base_offset);
            self.ongoing
                .insert((header.base_offset, header.producer_id));
        }
        if !is_idempotent(header) {
            return None;
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
        None
    }

    /// The first offset a read_committed consumer may not read yet given
    /// the high watermark: where the oldest open transaction began, or the
    /// oldest ended one whose marker the high watermark has not passed.
    /// `None`: nothing below the high watermark is unstable.
    pub fn first_unstable_offset(&mut self, high_watermark: Offset) -> Option<Offset> {
        self.completed = self.completed.split_off(&high_watermark);
        let ongoing = self.ongoing.first().map(|(first, _)| *first);
        let completed = self.completed.values().min().copied();
        match (ongoing, completed) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Producers with a transaction open here, oldest first.
    pub fn open_transactions(&self) -> impl Iterator<Item = (Offset, ProducerId)> + '_ {
        self.ongoing.iter().copied()
    }

    /// Forgets producers silent for `expiration_ms` (by batch timestamps).
    /// Returns how many went.
    /// A producer with a transaction open stays: its coordinator ends it.
    pub fn remove_expired(&mut self, now_ms: i64, expiration_ms: i64) -> usize {
        let before = self.producers.len();
        self.producers.retain(|_, e| {
            e.txn_first_offset.is_some()
                || e.last_timestamp_ms.saturating_add(expiration_ms) > now_ms
        });
        before - self.producers.len()
    }

    /// Encodes the table as the state of every batch below `offset`:
    /// `[magic "RLPS"][version u16][crc32c u32 of the rest][offset i64]
    /// [count u32]` then per producer `[id i64][epoch i16][last timestamp
    /// i64][open transaction's first offset i64, -1 for none][coordinator
    /// epoch i32][last marker's transaction number i64, 0 for none][last
    /// marker's offset i64][batches u8]` and per batch `[first seq i32][last
    /// seq i32][base offset i64][last offset i64]`, all big-endian,
    /// producers by id. Version 1 lacks the four transaction fields, version
    /// 2 the two of the last marker.
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
            let txn_first = entry.txn_first_offset.map_or(-1, |o| o.0);
            body.extend_from_slice(&txn_first.to_be_bytes());
            body.extend_from_slice(&entry.coordinator_epoch.to_be_bytes());
            let (number, offset) = entry
                .last_marker
                .map_or((0, -1), |m| (m.transaction_number, m.offset.0));
            body.extend_from_slice(&number.to_be_bytes());
            body.extend_from_slice(&offset.to_be_bytes());
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
        if !(1..=SNAPSHOT_VERSION).contains(&version) {
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
        let mut ongoing = BTreeSet::new();
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
            let (txn_first_offset, coordinator_epoch) = if version == 1 {
                (None, -1)
            } else {
                let first = reader.i64()?;
                let coordinator_epoch = reader.i32()?;
                if first < -1 {
                    return Err(SnapshotError::Invalid("transaction first offset"));
                }
                ((first >= 0).then_some(Offset(first)), coordinator_epoch)
            };
            let last_marker = if version < 3 {
                None
            } else {
                let transaction_number = reader.i64()?;
                let offset = reader.i64()?;
                if transaction_number < 0 || (transaction_number > 0) != (offset >= 0) {
                    return Err(SnapshotError::Invalid("last marker"));
                }
                (transaction_number > 0).then_some(LastMarker {
                    transaction_number,
                    offset: Offset(offset),
                })
            };
            if let Some(first) = txn_first_offset {
                ongoing.insert((first, id));
            }
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
                txn_first_offset,
                coordinator_epoch,
                last_marker,
            };
            producers.insert(id, entry);
        }
        if reader.at != bytes.len() {
            return Err(SnapshotError::Invalid("bytes after the last producer"));
        }
        let table = ProducerStateTable {
            producers,
            ongoing,
            completed: BTreeMap::new(),
        };
        Ok((offset, table))
    }
}

const SNAPSHOT_MAGIC: &[u8; 4] = b"RLPS";
const SNAPSHOT_VERSION: u16 = 3;

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
        table.apply(&first, None);
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
        // A producer this partition does not know starts at 0: a later
        // batch that overtook its first is refused, not put before it.
        assert!(matches!(
            table.check(&header(2, 0, 10, 1, 10)),
            Err(SequenceError::UnknownProducer {
                producer_id: 2,
                got: 10
            })
        ));
        assert_eq!(
            table.check(&header(2, 0, 0, 1, 10)),
            Ok(SequenceCheck::Append)
        );
        assert_eq!(
            table.check(&header(1, 0, 10, 1, 10)),
            Ok(SequenceCheck::Append)
        );
        // A new epoch starts again at 0; the old epoch is then fenced.
        assert!(table.check(&header(1, 1, 5, 1, 10)).is_err());
        let bumped = header(1, 1, 0, 1, 10);
        assert_eq!(table.check(&bumped), Ok(SequenceCheck::Append));
        table.apply(&bumped, None);
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
            table.apply(&header(3, 0, i, 1, i64::from(i)), None);
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
        table.apply(&header(1, 0, 0, 1, 0), None);
        table.apply(&header(2, 0, 0, 1, 500), None);
        assert_eq!(table.remove_expired(1_000 + 400, 100), 1);
        assert!(table.get(ProducerId(1)).is_none());
        assert!(table.get(ProducerId(2)).is_some());
    }

    #[test]
    fn a_snapshot_round_trips_and_damage_is_detected() {
        let mut table = ProducerStateTable::new();
        for i in 0..12 {
            table.apply(&header(i % 4, (i % 2) as i16, i as i32, 3, i * 3), None);
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

    fn txn(pid: i64, first: i32, count: i32, base: i64) -> BatchHeader {
        BatchHeader {
            attributes: 0x10,
            ..header(pid, 0, first, count, base)
        }
    }

    fn marker_header(pid: i64, base: i64) -> BatchHeader {
        BatchHeader {
            attributes: 0x30,
            base_sequence: Sequence::NONE,
            ..header(pid, 0, 0, 1, base)
        }
    }

    fn marker(kind: MarkerKind, coordinator_epoch: i32) -> Option<TxnMarker> {
        numbered(kind, coordinator_epoch, 0)
    }

    fn numbered(kind: MarkerKind, coordinator_epoch: i32, number: i64) -> Option<TxnMarker> {
        Some(TxnMarker {
            kind,
            coordinator_epoch,
            transaction_number: number,
        })
    }

    #[test]
    fn open_transactions_hold_back_the_stable_offset_until_their_marker_is_replicated() {
        let mut table = ProducerStateTable::new();
        assert_eq!(table.first_unstable_offset(Offset(100)), None);
        table.apply(&txn(1, 0, 2, 10), None);
        table.apply(&txn(2, 0, 1, 12), None);
        table.apply(&txn(1, 2, 1, 13), None);
        assert_eq!(table.first_unstable_offset(Offset(14)), Some(Offset(10)));
        let done = table.apply(&marker_header(1, 14), marker(MarkerKind::Abort, 0));
        assert_eq!(
            done,
            Some(CompletedTxn {
                producer_id: ProducerId(1),
                first_offset: Offset(10),
                marker_offset: Offset(14),
                kind: MarkerKind::Abort,
            })
        );
        // The marker is not replicated yet: still unstable from 10.
        assert_eq!(table.first_unstable_offset(Offset(14)), Some(Offset(10)));
        assert_eq!(table.first_unstable_offset(Offset(15)), Some(Offset(12)));
        table.apply(&marker_header(2, 15), marker(MarkerKind::Commit, 0));
        assert_eq!(table.first_unstable_offset(Offset(16)), None);
        // A marker with nothing open ends nothing.
        assert_eq!(
            table.apply(&marker_header(2, 16), marker(MarkerKind::Commit, 0)),
            None
        );
    }

    #[test]
    fn transaction_rules_are_enforced_at_the_leader() {
        let mut table = ProducerStateTable::new();
        let anonymous = BatchHeader {
            producer_id: ProducerId(-1),
            ..txn(1, 0, 1, 0)
        };
        assert!(matches!(
            table.check(&anonymous),
            Err(SequenceError::InvalidTransactional { .. })
        ));
        table.apply(&txn(1, 0, 1, 0), None);
        assert!(matches!(
            table.check(&header(1, 0, 1, 1, 1)),
            Err(SequenceError::NotInTransaction { producer_id: 1 })
        ));
        assert_eq!(table.check(&txn(1, 1, 1, 1)), Ok(SequenceCheck::Append));
        table.apply(&marker_header(1, 1), marker(MarkerKind::Commit, 5));
        assert_eq!(
            table.check_marker(
                ProducerId(1),
                ProducerEpoch(0),
                marker(MarkerKind::Abort, 4).unwrap()
            ),
            Err(SequenceError::CoordinatorFenced { current: 5, got: 4 })
        );
        assert_eq!(
            table.check_marker(
                ProducerId(1),
                ProducerEpoch(0),
                marker(MarkerKind::Abort, 5).unwrap()
            ),
            Ok(MarkerCheck::Append)
        );
        // After the marker the producer may write outside a transaction.
        assert_eq!(
            table.check(&header(1, 0, 1, 1, 2)),
            Ok(SequenceCheck::Append)
        );
    }

    #[test]
    fn open_transactions_survive_snapshots_and_expiry() {
        let mut table = ProducerStateTable::new();
        table.apply(&txn(7, 0, 3, 20), None);
        table.apply(&header(8, 0, 0, 1, 23), None);
        table.apply(&marker_header(9, 24), numbered(MarkerKind::Commit, 3, 6));
        let bytes = table.encode_snapshot(Offset(25));
        let (at, mut decoded) = ProducerStateTable::decode_snapshot(&bytes).unwrap();
        assert_eq!(at, Offset(25));
        assert_eq!(decoded, table);
        assert_eq!(decoded.first_unstable_offset(Offset(25)), Some(Offset(20)));
        assert_eq!(decoded.get(ProducerId(9)).unwrap().coordinator_epoch, 3);
        assert_eq!(
            decoded.get(ProducerId(9)).unwrap().last_marker,
            Some(LastMarker {
                transaction_number: 6,
                offset: Offset(24),
            })
        );
        // Silent for long, but its transaction is open: it stays.
        assert_eq!(decoded.remove_expired(1_000_000, 10), 2);
        assert!(decoded.get(ProducerId(7)).is_some());
    }

    /// A coordinator that took over resends the markers of a prepared
    /// transaction; the partitions its predecessor already reached write
    /// nothing, and a late resend of an ended transaction never ends the
    /// producer's next one.
    #[test]
    fn a_numbered_marker_is_written_once() {
        let mut table = ProducerStateTable::new();
        table.apply(&txn(1, 0, 2, 0), None);
        let first = numbered(MarkerKind::Commit, 4, 1).unwrap();
        assert_eq!(
            table.check_marker(ProducerId(1), ProducerEpoch(0), first),
            Ok(MarkerCheck::Append)
        );
        assert!(table.apply(&marker_header(1, 2), Some(first)).is_some());
        // The successor, a higher coordinator epoch, resends it.
        let resent = numbered(MarkerKind::Commit, 5, 1).unwrap();
        assert_eq!(
            table.check_marker(ProducerId(1), ProducerEpoch(0), resent),
            Ok(MarkerCheck::Written(Offset(2)))
        );
        // The next transaction opens; the predecessor's late resend of the
        // first one must not end it.
        table.apply(&txn(1, 2, 1, 3), None);
        assert_eq!(
            table.check_marker(ProducerId(1), ProducerEpoch(0), first),
            Ok(MarkerCheck::Written(Offset(2)))
        );
        assert_eq!(table.first_unstable_offset(Offset(4)), Some(Offset(3)));
        let second = numbered(MarkerKind::Abort, 5, 2).unwrap();
        assert_eq!(
            table.check_marker(ProducerId(1), ProducerEpoch(0), second),
            Ok(MarkerCheck::Append)
        );
        table.apply(&marker_header(1, 4), Some(second));
        assert_eq!(
            table.get(ProducerId(1)).unwrap().last_marker,
            Some(LastMarker {
                transaction_number: 2,
                offset: Offset(4),
            })
        );
        // Markers without a number (Kafka's, or a leader's backstop abort)
        // are always written.
        assert_eq!(
            table.check_marker(
                ProducerId(1),
                ProducerEpoch(0),
                marker(MarkerKind::Abort, 5).unwrap()
            ),
            Ok(MarkerCheck::Append)
        );
    }
}
