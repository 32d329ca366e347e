//! Records of `__transaction_state`: one per transactional id, keyed by the
//! id (so compaction keeps the latest), its value the transaction's whole
//! metadata; a null value (tombstone) when the id expired. Encoding:
//! key `[version u16 = 0][id len u16][id]`; value `[version u16 = 0]
//! [producer id i64][producer epoch i16][timeout ms u32][state u8][start ms
//! i64][update ms i64][partition count u32]` then per partition `[topic len
//! u16][topic][partition u32]`, then (version 1) `[transaction number i64]`,
//! big-endian. Version 0 values (no transaction number) still load.

use protocol::{PartitionIndex, ProducerEpoch, ProducerId};
use thiserror::Error;

use super::{TopicPartition, TRANSACTIONAL_ID_BYTES_MAX, TXN_PARTITIONS_MAX};

const KEY_VERSION: u16 = 0;
const VALUE_VERSION: u16 = 1;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum TxnRecordError {
    #[error("transaction record is malformed: {0}")]
    Malformed(&'static str),
    #[error("transaction record version {0} is unknown")]
    UnknownVersion(u16),
}

/// Where a transactional id's current transaction stands (Kafka's states).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TxnState {
    /// No transaction since the producer (re)started.
    Empty,
    /// Partitions were added; records may be written.
    Ongoing,
    /// Decided: markers are being written.
    PrepareCommit,
    PrepareAbort,
    /// Every marker is written.
    CompleteCommit,
    CompleteAbort,
}

impl TxnState {
    fn code(self) -> u8 {
        match self {
            TxnState::Empty => 0,
            TxnState::Ongoing => 1,
            TxnState::PrepareCommit => 2,
            TxnState::PrepareAbort => 3,
            TxnState::CompleteCommit => 4,
            TxnState::CompleteAbort => 5,
        }
    }

    fn from_code(code: u8) -> Result<TxnState, TxnRecordError> {
        Ok(match code {
            0 => TxnState::Empty,
            1 => TxnState::Ongoing,
            2 => TxnState::PrepareCommit,
            3 => TxnState::PrepareAbort,
            4 => TxnState::CompleteCommit,
            5 => TxnState::CompleteAbort,
            _ => return Err(TxnRecordError::Malformed("unknown state")),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "Empty",
            TxnState::Ongoing => "Ongoing",
            TxnState::PrepareCommit => "PrepareCommit",
            TxnState::PrepareAbort => "PrepareAbort",
            TxnState::CompleteCommit => "CompleteCommit",
            TxnState::CompleteAbort => "CompleteAbort",
        }
    }

    /// Prepared: markers are owed to the transaction's partitions.
    pub fn is_prepared(self) -> bool {
        matches!(self, TxnState::PrepareCommit | TxnState::PrepareAbort)
    }
}

/// One transactional id's metadata, as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnMetadata {
    pub producer_id: ProducerId,
    pub producer_epoch: ProducerEpoch,
    pub timeout_ms: u32,
    pub state: TxnState,
    /// When the current transaction began (wall ms); -1 when none.
    pub start_ms: i64,
    pub update_ms: i64,
    /// Partitions of the current transaction, sorted.
    pub partitions: Vec<TopicPartition>,
    /// Transactions this id began, the current (or last) one included: its
    /// markers carry it, so a partition recognises a resent marker of a
    /// transaction it already ended. 0 for none (or a version 0 record).
    pub transaction_number: i64,
}

/// A record of `__transaction_state`: the id's metadata, or `None` when it
/// expired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnRecord {
    pub transactional_id: String,
    pub value: Option<TxnMetadata>,
}

impl TxnRecord {
    pub fn encode_key(&self) -> Vec<u8> {
        let id = self.transactional_id.as_bytes();
        assert!(
            id.len() <= TRANSACTIONAL_ID_BYTES_MAX,
            "ids are bounded at entry"
        );
        let mut out = Vec::with_capacity(4 + id.len());
        out.extend_from_slice(&KEY_VERSION.to_be_bytes());
        out.extend_from_slice(&(id.len() as u16).to_be_bytes());
        out.extend_from_slice(id);
        out
    }

    pub fn encode_value(&self) -> Option<Vec<u8>> {
        let m = self.value.as_ref()?;
        let mut out = Vec::with_capacity(40 + m.partitions.len() * 16);
        out.extend_from_slice(&VALUE_VERSION.to_be_bytes());
        out.extend_from_slice(&m.producer_id.0.to_be_bytes());
        out.extend_from_slice(&m.producer_epoch.0.to_be_bytes());
        out.extend_from_slice(&m.timeout_ms.to_be_bytes());
        out.push(m.state.code());
        out.extend_from_slice(&m.start_ms.to_be_bytes());
        out.extend_from_slice(&m.update_ms.to_be_bytes());
        out.extend_from_slice(&(m.partitions.len() as u32).to_be_bytes());
        for tp in &m.partitions {
            out.extend_from_slice(&(tp.topic.len() as u16).to_be_bytes());
            out.extend_from_slice(tp.topic.as_bytes());
            out.extend_from_slice(&tp.partition.0.to_be_bytes());
        }
        out.extend_from_slice(&m.transaction_number.to_be_bytes());
        Some(out)
    }

    pub fn decode(key: &[u8], value: Option<&[u8]>) -> Result<TxnRecord, TxnRecordError> {
        let mut k = Reader { bytes: key, at: 0 };
        let version = k.u16()?;
        if version != KEY_VERSION {
            return Err(TxnRecordError::UnknownVersion(version));
        }
        let transactional_id = k.string(TRANSACTIONAL_ID_BYTES_MAX)?;
        k.end()?;
        let Some(value) = value else {
            return Ok(TxnRecord {
                transactional_id,
                value: None,
            });
        };
        let mut v = Reader {
            bytes: value,
            at: 0,
        };
        let version = v.u16()?;
        if version != VALUE_VERSION && version != 0 {
            return Err(TxnRecordError::UnknownVersion(version));
        }
        let producer_id = ProducerId(v.i64()?);
        let producer_epoch = ProducerEpoch(v.i16()?);
        let timeout_ms = v.u32()?;
        let state = TxnState::from_code(v.take(1)?[0])?;
        let start_ms = v.i64()?;
        let update_ms = v.i64()?;
        let count = v.u32()? as usize;
        if count > TXN_PARTITIONS_MAX {
            return Err(TxnRecordError::Malformed("too many partitions"));
        }
        let mut partitions = Vec::with_capacity(count);
        for _ in 0..count {
            let topic = v.string(u16::MAX as usize)?;
            let partition = PartitionIndex(v.u32()?);
            partitions.push(TopicPartition { topic, partition });
        }
        let transaction_number = if version == 0 { 0 } else { v.i64()? };
        v.end()?;
        if transaction_number < 0 {
            return Err(TxnRecordError::Malformed("negative transaction number"));
        }
        if producer_id.0 < 0 || producer_epoch.0 < 0 {
            return Err(TxnRecordError::Malformed("negative producer id or epoch"));
        }
        if !partitions.windows(2).all(|w| w[0] < w[1]) {
            return Err(TxnRecordError::Malformed(
                "partitions not sorted and distinct",
            ));
        }
        // What the coordinator's invariants demand, so a loaded record can
        // never make it crash.
        let open = matches!(
            state,
            TxnState::Ongoing | TxnState::PrepareCommit | TxnState::PrepareAbort
        );
        // An open transaction leaves room for the epoch bump that fences it.
        let no_room = state == TxnState::Ongoing && producer_epoch.0 == i16::MAX;
        if no_room || open == partitions.is_empty() || (open && start_ms < 0) {
            return Err(TxnRecordError::Malformed(
                "partitions and start do not fit the state",
            ));
        }
        Ok(TxnRecord {
            transactional_id,
            value: Some(TxnMetadata {
                producer_id,
                producer_epoch,
                timeout_ms,
                state,
                start_ms,
                update_ms,
                partitions,
                transaction_number,
            }),
        })
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], TxnRecordError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|end| *end <= self.bytes.len())
            .ok_or(TxnRecordError::Malformed("ends early"))?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], TxnRecordError> {
        Ok(self.take(N)?.try_into().expect("length taken"))
    }

    fn u16(&mut self) -> Result<u16, TxnRecordError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    fn i16(&mut self) -> Result<i16, TxnRecordError> {
        Ok(i16::from_be_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, TxnRecordError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    fn i64(&mut self) -> Result<i64, TxnRecordError> {
        Ok(i64::from_be_bytes(self.array()?))
    }

    fn string(&mut self, bytes_max: usize) -> Result<String, TxnRecordError> {
        let len = usize::from(self.u16()?);
        if len > bytes_max {
            return Err(TxnRecordError::Malformed("string too long"));
        }
        String::from_utf8(self.take(len)?.to_vec())
            .map_err(|_| TxnRecordError::Malformed("string not UTF-8"))
    }

    fn end(&self) -> Result<(), TxnRecordError> {
        if self.at == self.bytes.len() {
            Ok(())
        } else {
            Err(TxnRecordError::Malformed("bytes after the end"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_damage_is_an_error() {
        let record = TxnRecord {
            transactional_id: "billing-1".into(),
            value: Some(TxnMetadata {
                producer_id: ProducerId(4_000),
                producer_epoch: ProducerEpoch(3),
                timeout_ms: 60_000,
                state: TxnState::PrepareCommit,
                start_ms: 1_000,
                update_ms: 1_500,
                partitions: vec![TopicPartition::new("a", 0), TopicPartition::new("b", 2)],
                transaction_number: 17,
            }),
        };
        let (key, value) = (record.encode_key(), record.encode_value().unwrap());
        assert_eq!(TxnRecord::decode(&key, Some(&value)), Ok(record.clone()));
        for cut in 0..value.len() {
            assert!(TxnRecord::decode(&key, Some(&value[..cut])).is_err());
        }
        for cut in 0..key.len() {
            assert!(TxnRecord::decode(&key[..cut], Some(&value)).is_err());
        }
        // A version 0 value: no transaction number.
        let mut old = value.clone();
        old[..2].copy_from_slice(&0u16.to_be_bytes());
        old.truncate(old.len() - 8);
        let mut expected = record.clone();
        expected.value.as_mut().unwrap().transaction_number = 0;
        assert_eq!(TxnRecord::decode(&key, Some(&old)), Ok(expected));
        let tombstone = TxnRecord {
            value: None,
            ..record
        };
        assert_eq!(TxnRecord::decode(&key, None), Ok(tombstone.clone()));
        // A record the coordinator could not hold is refused at decode.
        let open_without_partitions = TxnRecord {
            value: Some(TxnMetadata {
                producer_id: ProducerId(1),
                producer_epoch: ProducerEpoch(0),
                timeout_ms: 60_000,
                state: TxnState::Ongoing,
                start_ms: 5,
                update_ms: 5,
                partitions: Vec::new(),
                transaction_number: 1,
            }),
            ..tombstone
        };
        let value = open_without_partitions.encode_value().unwrap();
        assert!(TxnRecord::decode(&key, Some(&value)).is_err());
    }
}
