//! `ConsumerRecord` and the decoding of fetched record batches into them.
//! Batches arrive exactly as stored, so one may start before the offset the
//! consumer asked for: records below it are skipped here. Every batch is
//! validated (header, CRC, each record) before a record is handed out.
//! Control batches (transaction markers) are never handed out, and under
//! read_committed the batches of aborted transactions are skipped.

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use protocol::record_batch::marker::{parse_marker, MarkerKind};
use protocol::{BatchError, Compression, RecordBatch};

use crate::messages::AbortedTransaction;

use crate::error::{ClientError, Result};
use crate::record::Header;

/// The smallest encoded record: a length, the attributes, the timestamp and
/// offset deltas, the key and value lengths and a header count, one byte each.
const RECORD_BYTES_MIN: usize = 7;

/// A record as the consumer returns it. Key, value and header values of
/// uncompressed batches share the fetch response's buffer, and the records
/// of one fetch share one topic name (an allocation per record would cost a
/// consumer at a million records a second more than its decoding).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerRecord {
    pub topic: Arc<str>,
    pub partition: i32,
    pub offset: i64,
    pub timestamp_ms: i64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<Header>,
}

/// Records of one partition's fetched bytes at or above `fetch_offset`, and
/// the offset to fetch next (after the last whole batch).
#[derive(Debug)]
pub struct DecodedRecords {
    pub records: Vec<ConsumerRecord>,
    pub next_fetch_offset: i64,
}

/// Decodes whole batches from `bytes`. A partial batch at the end (cut by a
/// byte bound) is left for the next fetch; a partial first batch is an error,
/// because fetching again from the same offset would return it again.
/// `aborted` (oldest first, from a read_committed fetch): a producer's
/// transactional batches are skipped from an aborted transaction's first
/// offset up to its abort marker.
pub fn decode_records(
    topic: &str,
    partition: i32,
    bytes: &Bytes,
    fetch_offset: i64,
    batch_bytes_max: usize,
    decompressed_bytes_max: usize,
    aborted: &[AbortedTransaction],
) -> Result<DecodedRecords> {
    let mut aborted = aborted.to_vec();
    aborted.sort_by_key(|t| t.first_offset);
    let mut aborted = aborted.into_iter().peekable();
    let mut aborting: HashSet<i64> = HashSet::new();
    let topic: Arc<str> = Arc::from(topic);
    let mut records = Vec::new();
    let mut next_fetch_offset = fetch_offset;
    let mut rest: &[u8] = bytes;
    let mut batches_parsed = 0usize;
    while !rest.is_empty() {
        let (batch, used) = match RecordBatch::parse_prefix(rest, batch_bytes_max) {
            Ok(parsed) => parsed,
            Err(BatchError::Truncated { .. }) if batches_parsed > 0 => break,
            Err(error) => return Err(ClientError::Batch(error)),
        };
        rest = &rest[used..];
        batches_parsed += 1;
        let header = *batch.header();
        if header.next_offset().0 <= next_fetch_offset {
            // Entirely below the requested offset.
            continue;
        }
        while let Some(t) = aborted.next_if(|t| t.first_offset <= header.last_offset().0) {
            aborting.insert(t.producer_id);
        }
        if header.is_control() {
            let abort = parse_marker(&batch).is_ok_and(|m| m.kind == MarkerKind::Abort);
            if abort {
                aborting.remove(&header.producer_id.0);
            }
            next_fetch_offset = header.next_offset().0;
            continue;
        }
        if header.is_transactional() && aborting.contains(&header.producer_id.0) {
            next_fetch_offset = header.next_offset().0;
            continue;
        }
        // Records below what earlier batches of this answer reached are
        // skipped as those below the fetch offset are: a broker never sends
        // overlapping batches, but a consumer must not hand out an offset
        // twice or go back if one does.
        let floor = next_fetch_offset;
        let zero_copy = header.compression() == Compression::None;
        let section = batch.records_section(decompressed_bytes_max)?;
        // The count comes from the wire: room for no more records than the
        // section's bytes can hold.
        let count = usize::try_from(header.record_count).unwrap_or(0);
        records.reserve(count.min(section.len_bytes() / RECORD_BYTES_MIN));
        let share = |slice: &[u8]| {
            if zero_copy {
                bytes.slice_ref(slice)
            } else {
                Bytes::copy_from_slice(slice)
            }
        };
        for record in section.iter() {
            let record = record?;
            if record.offset.0 < floor {
                continue;
            }
            records.push(ConsumerRecord {
                topic: topic.clone(),
                partition,
                offset: record.offset.0,
                timestamp_ms: record.timestamp_ms,
                key: record.key.map(share),
                value: record.value.map(share),
                headers: record
                    .headers
                    .iter()
                    .map(|h| Header {
                        key: String::from_utf8_lossy(h.key).into_owned(),
                        value: h.value.map(share),
                    })
                    .collect(),
            });
        }
        next_fetch_offset = header.next_offset().0;
    }
    assert!(records.windows(2).all(|w| w[0].offset < w[1].offset));
    Ok(DecodedRecords {
        records,
        next_fetch_offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::record_batch::marker::{build_marker_batch, TxnMarker};
    use protocol::record_batch::stamp;
    use protocol::{
        BatchBuilder, LeaderEpoch, Offset, ProducerEpoch, ProducerId, Record, Sequence,
    };

    fn batch(base_offset: i64, values: &[&str], compression: Compression) -> Vec<u8> {
        let mut builder = BatchBuilder::new(compression);
        for v in values {
            builder.push(&Record {
                timestamp_ms: 5,
                key: Some(b"k"),
                value: Some(v.as_bytes()),
                headers: &[],
            });
        }
        let mut bytes = builder.build().unwrap();
        stamp(&mut bytes, Offset(base_offset), LeaderEpoch(0));
        bytes
    }

    #[test]
    fn skips_records_below_the_fetch_offset_and_keeps_whole_batches() {
        // Proves a batch that starts before the requested offset yields only
        // the records at or after it, compressed batches decode too, and a
        // batch cut short at the end is left for the next fetch.
        let mut bytes = batch(10, &["a", "b", "c"], Compression::None);
        bytes.extend(batch(13, &["d", "e"], Compression::Zstd));
        let third = batch(15, &["f"], Compression::None);
        bytes.extend(&third[..third.len() - 3]);
        let bytes = Bytes::from(bytes);
        let decoded = decode_records("t", 0, &bytes, 12, 1 << 20, 1 << 20, &[]).unwrap();
        let offsets: Vec<i64> = decoded.records.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, vec![12, 13, 14]);
        let values: Vec<&[u8]> = decoded
            .records
            .iter()
            .map(|r| r.value.as_deref().unwrap())
            .collect();
        assert_eq!(values, vec![&b"c"[..], b"d", b"e"]);
        assert_eq!(decoded.next_fetch_offset, 15);
        // One topic name for the whole fetch, not one allocation per record.
        assert_eq!(&*decoded.records[0].topic, "t");
        assert!(decoded
            .records
            .windows(2)
            .all(|w| Arc::ptr_eq(&w[0].topic, &w[1].topic)));
    }

    #[test]
    fn corrupt_or_oversized_first_batch_is_an_error() {
        // Proves a damaged batch is never handed out and a first batch that
        // does not fit is reported instead of fetched forever.
        let mut bytes = batch(0, &["a"], Compression::None);
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        let result = decode_records("t", 0, &Bytes::from(bytes), 0, 1 << 20, 1 << 20, &[]);
        assert!(matches!(
            result,
            Err(ClientError::Batch(BatchError::CrcMismatch { .. }))
        ));
        let whole = batch(0, &["a"], Compression::None);
        let cut = Bytes::copy_from_slice(&whole[..whole.len() - 1]);
        assert!(decode_records("t", 0, &cut, 0, 1 << 20, 1 << 20, &[]).is_err());
    }

    #[test]
    fn overlapping_batches_hand_out_each_offset_once_and_in_order() {
        // Proves an answer whose batches overlap (which a broker never sends)
        // yields every offset once, in order, instead of going back.
        let mut bytes = batch(10, &["a", "b", "c"], Compression::None);
        bytes.extend(batch(11, &["x", "y", "z"], Compression::None));
        bytes.extend(batch(10, &["p"], Compression::None));
        let decoded =
            decode_records("t", 0, &Bytes::from(bytes), 10, 1 << 20, 1 << 20, &[]).unwrap();
        let seen: Vec<(i64, &[u8])> = decoded
            .records
            .iter()
            .map(|r| (r.offset, r.value.as_deref().unwrap()))
            .collect();
        assert_eq!(
            seen,
            vec![(10, &b"a"[..]), (11, b"b"), (12, b"c"), (13, b"z")]
        );
        assert_eq!(decoded.next_fetch_offset, 14);
    }

    #[test]
    fn a_record_count_the_batch_cannot_hold_is_an_error_not_a_huge_allocation() {
        // Proves the count a batch header claims (CRC and all consistent)
        // sizes nothing beyond what its bytes can hold: the batch is refused
        // by its records, with no attempt to reserve room for 2^31 of them.
        use protocol::record_batch::{field, seal_crc};
        let mut bytes = batch(0, &["a"], Compression::None);
        let count = i32::MAX;
        bytes[field::LAST_OFFSET_DELTA..field::LAST_OFFSET_DELTA + 4]
            .copy_from_slice(&(count - 1).to_be_bytes());
        bytes[field::RECORD_COUNT..field::RECORD_COUNT + 4].copy_from_slice(&count.to_be_bytes());
        seal_crc(&mut bytes);
        let result = decode_records("t", 0, &Bytes::from(bytes), 0, 1 << 20, 1 << 20, &[]);
        assert!(matches!(result, Err(ClientError::Batch(_))), "{result:?}");
    }

    fn txn_batch(base_offset: i64, producer_id: i64, values: &[&str]) -> Vec<u8> {
        let mut builder = BatchBuilder::new(Compression::None)
            .transactional(true)
            .producer(ProducerId(producer_id), ProducerEpoch(0), Sequence(0));
        for v in values {
            builder.push(&Record {
                timestamp_ms: 5,
                key: None,
                value: Some(v.as_bytes()),
                headers: &[],
            });
        }
        let mut bytes = builder.build().unwrap();
        stamp(&mut bytes, Offset(base_offset), LeaderEpoch(0));
        bytes
    }

    fn marker(base_offset: i64, producer_id: i64, kind: MarkerKind) -> Vec<u8> {
        let marker = TxnMarker {
            kind,
            coordinator_epoch: 0,
            transaction_number: 0,
        };
        let mut bytes = build_marker_batch(ProducerId(producer_id), ProducerEpoch(0), marker, 5);
        stamp(&mut bytes, Offset(base_offset), LeaderEpoch(0));
        bytes
    }

    #[test]
    fn aborted_transactions_and_markers_are_never_handed_out() {
        // Proves read_committed decoding skips exactly the aborted
        // producer's batches up to its abort marker (a later transaction of
        // the same producer is shown), another producer's interleaved
        // committed batches are shown, and markers never are.
        let mut bytes = txn_batch(0, 1, &["a0", "a1"]);
        bytes.extend(txn_batch(2, 2, &["b0"]));
        bytes.extend(txn_batch(3, 1, &["a2"]));
        bytes.extend(marker(4, 1, MarkerKind::Abort));
        bytes.extend(marker(5, 2, MarkerKind::Commit));
        bytes.extend(txn_batch(6, 1, &["c0"]));
        bytes.extend(marker(7, 1, MarkerKind::Commit));
        let bytes = Bytes::from(bytes);
        let aborted = [AbortedTransaction {
            producer_id: 1,
            first_offset: 0,
        }];
        let values = |aborted: &[AbortedTransaction]| -> Vec<String> {
            let decoded = decode_records("t", 0, &bytes, 0, 1 << 20, 1 << 20, aborted).unwrap();
            assert_eq!(decoded.next_fetch_offset, 8);
            decoded
                .records
                .iter()
                .map(|r| String::from_utf8(r.value.clone().unwrap().to_vec()).unwrap())
                .collect()
        };
        assert_eq!(values(&aborted), vec!["b0", "c0"]);
        assert_eq!(values(&[]), vec!["a0", "a1", "b0", "a2", "c0"]);
    }
}
