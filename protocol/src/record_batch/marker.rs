//! Transaction markers: the control batches that end a producer's
//! transaction in one partition, commit or abort, in Kafka's encoding (one
//! record; key `[version i16 = 0][type i16: 0 abort, 1 commit]`, value
//! `[version i16 = 0][coordinator epoch i32]` followed by Ringlog's
//! `[transaction number i64]`, which Kafka's readers skip; the batch is
//! transactional and control, uncompressed, with the producer's id and epoch
//! and no sequence). Only brokers write them; consumers never show them.

use super::{BatchBuilder, BatchError, Compression, Record, RecordBatch};
use crate::{ProducerEpoch, ProducerId, Sequence};

/// Bytes a marker's records section may decompress to: markers are never
/// compressed and hold 4 + 14 bytes of payload.
const MARKER_RECORDS_BYTES_MAX: usize = 1024;

const CONTROL_VERSION: i16 = 0;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MarkerKind {
    Abort,
    Commit,
}

impl MarkerKind {
    fn code(self) -> i16 {
        match self {
            MarkerKind::Abort => 0,
            MarkerKind::Commit => 1,
        }
    }

    fn from_code(code: i16) -> Result<MarkerKind, BatchError> {
        match code {
            0 => Ok(MarkerKind::Abort),
            1 => Ok(MarkerKind::Commit),
            _ => Err(BatchError::InvalidControl("unknown control record type")),
        }
    }
}

/// The end of one transaction in one partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxnMarker {
    pub kind: MarkerKind,
    /// The epoch of the coordinator that decided it: a partition refuses
    /// markers from a coordinator older than the last one it heard.
    pub coordinator_epoch: i32,
    /// Which of its transactional id's transactions this ends (counted by
    /// the coordinator from 1; 0 when unknown, as in markers without it): a
    /// partition that already took the marker of this transaction or a
    /// later one answers a resend without writing it again.
    pub transaction_number: i64,
}

/// Encodes the control batch that ends `producer_id`'s transaction.
pub fn build_marker_batch(
    producer_id: ProducerId,
    producer_epoch: ProducerEpoch,
    marker: TxnMarker,
    timestamp_ms: i64,
) -> Vec<u8> {
    let mut key = [0u8; 4];
    key[..2].copy_from_slice(&CONTROL_VERSION.to_be_bytes());
    key[2..].copy_from_slice(&marker.kind.code().to_be_bytes());
    let mut value = [0u8; 14];
    value[..2].copy_from_slice(&CONTROL_VERSION.to_be_bytes());
    value[2..6].copy_from_slice(&marker.coordinator_epoch.to_be_bytes());
    value[6..].copy_from_slice(&marker.transaction_number.to_be_bytes());
    let mut builder = BatchBuilder::new(Compression::None)
        .producer(producer_id, producer_epoch, Sequence::NONE)
        .transactional(true)
        .control();
    builder.push(&Record {
        timestamp_ms,
        key: Some(&key),
        value: Some(&value),
        headers: &[],
    });
    builder
        .build()
        .expect("a one-record uncompressed batch builds")
}

/// Decodes the marker a control batch carries.
pub fn parse_marker(batch: &RecordBatch<'_>) -> Result<TxnMarker, BatchError> {
    let header = batch.header();
    if !header.is_control() || !header.is_transactional() {
        return Err(BatchError::InvalidControl("not a transaction marker"));
    }
    let section = batch.records_section(MARKER_RECORDS_BYTES_MAX)?;
    let mut records = section.iter();
    let record = records
        .next()
        .ok_or(BatchError::InvalidControl("no control record"))??;
    let key = record
        .key
        .filter(|k| k.len() >= 4)
        .ok_or(BatchError::InvalidControl("control key too short"))?;
    if i16::from_be_bytes([key[0], key[1]]) != CONTROL_VERSION {
        return Err(BatchError::InvalidControl("unknown control key version"));
    }
    let kind = MarkerKind::from_code(i16::from_be_bytes([key[2], key[3]]))?;
    let value = record
        .value
        .filter(|v| v.len() >= 6)
        .ok_or(BatchError::InvalidControl("marker value too short"))?;
    let coordinator_epoch = i32::from_be_bytes([value[2], value[3], value[4], value[5]]);
    let transaction_number = match value.get(6..14) {
        Some(number) => i64::from_be_bytes(number.try_into().expect("8 bytes")),
        None => 0,
    };
    if transaction_number < 0 {
        return Err(BatchError::InvalidControl("negative transaction number"));
    }
    Ok(TxnMarker {
        kind,
        coordinator_epoch,
        transaction_number,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_round_trip_and_ordinary_batches_are_not_markers() {
        for kind in [MarkerKind::Abort, MarkerKind::Commit] {
            let marker = TxnMarker {
                kind,
                coordinator_epoch: 7,
                transaction_number: 12,
            };
            let bytes = build_marker_batch(ProducerId(42), ProducerEpoch(3), marker, 1_000);
            let batch = RecordBatch::parse(&bytes, 1 << 20).unwrap();
            let header = batch.header();
            assert!(header.is_control() && header.is_transactional());
            assert_eq!(header.producer_id, ProducerId(42));
            assert_eq!(header.producer_epoch, ProducerEpoch(3));
            assert_eq!(header.base_sequence, Sequence::NONE);
            assert_eq!(parse_marker(&batch), Ok(marker));
        }
        let mut plain = BatchBuilder::new(Compression::None).transactional(true);
        plain.push(&Record {
            timestamp_ms: 0,
            key: None,
            value: Some(b"v"),
            headers: &[],
        });
        let bytes = plain.build().unwrap();
        let batch = RecordBatch::parse(&bytes, 1 << 20).unwrap();
        assert!(parse_marker(&batch).is_err());
    }

    /// Kafka's markers end after the coordinator epoch: their transaction
    /// is unknown (0), so they are never taken for a resend.
    #[test]
    fn markers_without_a_transaction_number_read_as_zero() {
        let mut builder = BatchBuilder::new(Compression::None)
            .producer(ProducerId(1), ProducerEpoch(0), Sequence::NONE)
            .transactional(true)
            .control();
        builder.push(&Record {
            timestamp_ms: 0,
            key: Some(&[0, 0, 0, 1]),
            value: Some(&[0, 0, 0, 0, 0, 9]),
            headers: &[],
        });
        let bytes = builder.build().unwrap();
        let batch = RecordBatch::parse(&bytes, 1 << 20).unwrap();
        assert_eq!(
            parse_marker(&batch),
            Ok(TxnMarker {
                kind: MarkerKind::Commit,
                coordinator_epoch: 9,
                transaction_number: 0,
            })
        );
    }
}
