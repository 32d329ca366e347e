//! Round trips, corruption detection and no-panic decoding of record batches.

use super::*;
use proptest::prelude::*;

const SIZE_MAX: usize = 1 << 20;

#[derive(Clone, Debug)]
struct OwnedRecord {
    timestamp_ms: i64,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

fn record_strategy() -> impl Strategy<Value = OwnedRecord> {
    (
        0i64..4_000_000_000_000,
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..300)),
        proptest::collection::vec(
            (
                proptest::collection::vec(any::<u8>(), 0..10),
                proptest::option::of(proptest::collection::vec(any::<u8>(), 0..10)),
            ),
            0..3,
        ),
    )
        .prop_map(|(timestamp_ms, key, value, headers)| OwnedRecord {
            timestamp_ms,
            key,
            value,
            headers,
        })
}

fn build(records: &[OwnedRecord], compression: Compression) -> Vec<u8> {
    build_with_capacity(records, compression, 0)
}

fn build_with_capacity(
    records: &[OwnedRecord],
    compression: Compression,
    capacity_bytes: usize,
) -> Vec<u8> {
    let mut builder = BatchBuilder::new(compression)
        .with_capacity_bytes(capacity_bytes)
        .producer(ProducerId(7), ProducerEpoch(1), Sequence(42));
    for r in records {
        let headers: Vec<RecordHeader<'_>> = r
            .headers
            .iter()
            .map(|(k, v)| RecordHeader {
                key: k,
                value: v.as_deref(),
            })
            .collect();
        builder.push(&Record {
            timestamp_ms: r.timestamp_ms,
            key: r.key.as_deref(),
            value: r.value.as_deref(),
            headers: &headers,
        });
    }
    builder.build().expect("non-empty batch builds")
}

proptest! {
    #[test]
    fn a_value_written_in_place_makes_the_same_bytes_as_a_pushed_one(
        records in proptest::collection::vec(record_strategy(), 1..20),
        zstd in any::<bool>(),
    ) {
        let compression = if zstd { Compression::Zstd } else { Compression::None };
        let records: Vec<OwnedRecord> = records
            .into_iter()
            .map(|r| OwnedRecord { value: Some(r.value.unwrap_or_default()), headers: Vec::new(), ..r })
            .collect();
        let mut builder = BatchBuilder::new(compression)
            .producer(ProducerId(7), ProducerEpoch(1), Sequence(42));
        for r in &records {
            let value = r.value.as_deref().expect("every value present");
            let expected_size = builder.record_size_bytes(&Record {
                timestamp_ms: r.timestamp_ms,
                key: r.key.as_deref(),
                value: Some(value),
                headers: &[],
            });
            let size = builder.push_written(r.timestamp_ms, r.key.as_deref(), value.len(), |out| {
                out.extend_from_slice(value)
            });
            prop_assert_eq!(size, expected_size);
        }
        prop_assert_eq!(builder.build().expect("non-empty batch builds"), build(&records, compression));
    }

    #[test]
    fn reserved_capacity_changes_no_byte(
        records in proptest::collection::vec(record_strategy(), 1..20),
        zstd in any::<bool>(),
        capacity_bytes in 0usize..100_000,
    ) {
        let compression = if zstd { Compression::Zstd } else { Compression::None };
        prop_assert_eq!(
            build_with_capacity(&records, compression, capacity_bytes),
            build(&records, compression)
        );
    }

    #[test]
    fn build_then_read_returns_the_same_records(
        records in proptest::collection::vec(record_strategy(), 1..20),
        zstd in any::<bool>(),
        base in 0i64..1_000_000,
        epoch in 0i32..100,
    ) {
        let compression = if zstd { Compression::Zstd } else { Compression::None };
        let mut bytes = build(&records, compression);
        stamp(&mut bytes, Offset(base), LeaderEpoch(epoch));
        let batch = RecordBatch::parse(&bytes, SIZE_MAX).expect("valid batch");
        let h = batch.header();
        prop_assert_eq!(h.base_offset, Offset(base));
        prop_assert_eq!(h.partition_leader_epoch, LeaderEpoch(epoch));
        prop_assert_eq!(h.record_count as usize, records.len());
        prop_assert_eq!(h.compression(), compression);
        prop_assert_eq!(h.producer_id, ProducerId(7));
        prop_assert_eq!(h.base_sequence, Sequence(42));
        prop_assert_eq!(h.max_timestamp_ms, records.iter().map(|r| r.timestamp_ms).max().unwrap());
        h.check_producer_batch().unwrap();
        let section = batch.records_section(SIZE_MAX).unwrap();
        let decoded: Vec<_> = section.iter().collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(decoded.len(), records.len());
        for (i, (d, r)) in decoded.iter().zip(&records).enumerate() {
            prop_assert_eq!(d.offset, Offset(base + i as i64));
            prop_assert_eq!(d.timestamp_ms, r.timestamp_ms);
            prop_assert_eq!(d.key, r.key.as_deref());
            prop_assert_eq!(d.value, r.value.as_deref());
            prop_assert_eq!(d.headers.len(), r.headers.len());
            for (dh, (k, v)) in d.headers.iter().zip(&r.headers) {
                prop_assert_eq!(dh.key, &k[..]);
                prop_assert_eq!(dh.value, v.as_deref());
            }
        }
    }

    #[test]
    fn retained_records_keep_their_offsets_and_the_batch_its_identity(
        records in proptest::collection::vec(record_strategy(), 1..20),
        keep_mask in proptest::collection::vec(any::<bool>(), 20),
        zstd in any::<bool>(),
        base in 0i64..1_000_000,
    ) {
        let compression = if zstd { Compression::Zstd } else { Compression::None };
        let mut bytes = build(&records, compression);
        stamp(&mut bytes, Offset(base), LeaderEpoch(3));
        let batch = RecordBatch::parse(&bytes, SIZE_MAX).unwrap();
        let retained = retain_records(&batch, SIZE_MAX, 1, |r| keep_mask[(r.offset.0 - base) as usize]).unwrap();
        let kept: Vec<usize> = (0..records.len()).filter(|&i| keep_mask[i]).collect();
        let rewritten = match retained {
            Retained::All => {
                prop_assert_eq!(kept.len(), records.len());
                return Ok(());
            }
            Retained::Rewritten(rewritten) => rewritten,
        };
        prop_assert!(kept.len() < records.len());
        let out = RecordBatch::parse(&rewritten, SIZE_MAX).expect("a rewritten batch is valid");
        let (h, o) = (batch.header(), out.header());
        prop_assert_eq!(o.base_offset, h.base_offset);
        prop_assert_eq!(o.next_offset(), h.next_offset());
        prop_assert_eq!(o.partition_leader_epoch, h.partition_leader_epoch);
        prop_assert_eq!(o.compression(), h.compression());
        prop_assert_eq!((o.producer_id, o.producer_epoch, o.base_sequence), (h.producer_id, h.producer_epoch, h.base_sequence));
        prop_assert_eq!((o.base_timestamp_ms, o.max_timestamp_ms), (h.base_timestamp_ms, h.max_timestamp_ms));
        prop_assert_eq!(o.record_count as usize, kept.len());
        let section = out.records_section(SIZE_MAX).unwrap();
        let decoded: Vec<_> = section.iter().collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(decoded.len(), kept.len());
        for (d, &i) in decoded.iter().zip(&kept) {
            prop_assert_eq!(d.offset, Offset(base + i as i64));
            prop_assert_eq!(d.timestamp_ms, records[i].timestamp_ms);
            prop_assert_eq!(d.key, records[i].key.as_deref());
            prop_assert_eq!(d.value, records[i].value.as_deref());
            prop_assert_eq!(d.headers.len(), records[i].headers.len());
        }
    }

    #[test]
    fn any_flipped_byte_under_the_crc_is_detected(
        records in proptest::collection::vec(record_strategy(), 1..5),
        position_seed in any::<usize>(),
        flip in 1u8..=255,
    ) {
        let mut bytes = build(&records, Compression::None);
        let position = field::ATTRIBUTES + position_seed % (bytes.len() - field::ATTRIBUTES);
        bytes[position] ^= flip;
        prop_assert!(RecordBatch::parse(&bytes, SIZE_MAX).is_err());
    }

    #[test]
    fn every_truncation_is_an_error(records in proptest::collection::vec(record_strategy(), 1..5), cut_seed in any::<usize>()) {
        let bytes = build(&records, Compression::Zstd);
        let cut = cut_seed % bytes.len();
        let error = RecordBatch::parse(&bytes[..cut], SIZE_MAX).unwrap_err();
        let is_truncation = matches!(error, BatchError::Truncated { .. });
        prop_assert!(is_truncation, "{:?}", error);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        if let Ok((batch, _)) = RecordBatch::parse_prefix(&bytes, SIZE_MAX) {
            let _ = batch.validate_records(SIZE_MAX);
        }
    }
}

/// A well-formed batch whose records section lies (valid CRC over bad records)
/// must fail record validation, never panic.
#[test]
fn corrupt_records_under_a_valid_crc_fail_validation() {
    let records = vec![OwnedRecord {
        timestamp_ms: 5,
        key: Some(b"k".to_vec()),
        value: Some(b"value".to_vec()),
        headers: vec![],
    }];
    let mut bytes = build(&records, Compression::None);
    // Claim a record length far past the section's end, then fix up the CRC.
    bytes[BATCH_HEADER_BYTES] = 0x7e;
    let crc = compute_crc(&bytes);
    bytes[field::CRC..field::CRC + 4].copy_from_slice(&crc.to_be_bytes());
    let batch = RecordBatch::parse(&bytes, SIZE_MAX).unwrap();
    assert!(matches!(
        batch.validate_records(SIZE_MAX),
        Err(BatchError::CorruptRecord { index: 0, .. })
    ));
}

/// A zstd bomb: a small batch that inflates past the bound is refused without
/// allocating the inflated size.
#[test]
fn decompression_is_bounded() {
    let value = vec![b'a'; 200_000];
    let records = vec![OwnedRecord {
        timestamp_ms: 1,
        key: None,
        value: Some(value),
        headers: vec![],
    }];
    let bytes = build(&records, Compression::Zstd);
    assert!(bytes.len() < 1_000, "compresses well: {}", bytes.len());
    let batch = RecordBatch::parse(&bytes, SIZE_MAX).unwrap();
    assert_eq!(
        batch.records_section(100_000).unwrap_err(),
        BatchError::DecompressedTooLarge {
            decompressed_bytes_max: 100_000
        }
    );
    assert!(batch.records_section(300_000).is_ok());
}

#[test]
fn header_checks_reject_bad_fields() {
    let records = vec![OwnedRecord {
        timestamp_ms: 1,
        key: None,
        value: Some(b"v".to_vec()),
        headers: vec![],
    }];
    let good = build(&records, Compression::None);

    let mut bad_magic = good.clone();
    bad_magic[field::MAGIC] = 1;
    assert_eq!(
        BatchHeader::parse(&bad_magic),
        Err(BatchError::UnsupportedMagic(1))
    );

    let mut bad_codec = good.clone();
    bad_codec[field::ATTRIBUTES + 1] = 2;
    assert_eq!(
        BatchHeader::parse(&bad_codec),
        Err(BatchError::UnsupportedCodec(2))
    );

    let mut bad_length = good.clone();
    bad_length[field::BATCH_LENGTH..field::BATCH_LENGTH + 4]
        .copy_from_slice(&(-5i32).to_be_bytes());
    assert_eq!(
        BatchHeader::parse(&bad_length),
        Err(BatchError::InvalidLength(-5))
    );

    let mut huge_base = good.clone();
    huge_base[field::BASE_OFFSET..field::BASE_OFFSET + 8].copy_from_slice(&i64::MAX.to_be_bytes());
    assert_eq!(
        BatchHeader::parse(&huge_base),
        Err(BatchError::InvalidBaseOffset(i64::MAX))
    );

    assert!(matches!(
        RecordBatch::parse(&good, 20),
        Err(BatchError::TooLarge {
            size_bytes_max: 20,
            ..
        })
    ));
    assert_eq!(
        BatchBuilder::new(Compression::None).build(),
        Err(BatchError::Empty)
    );
}

/// The layout matches Kafka's v2 format byte for byte for a known batch.
#[test]
#[should_panic(expected = "a written value has its declared length")]
fn a_value_written_short_of_its_declared_length_is_a_bug() {
    let mut builder = BatchBuilder::new(Compression::None);
    builder.push_written(0, None, 4, |out| out.extend_from_slice(b"abc"));
}

#[test]
fn known_layout() {
    let mut builder = BatchBuilder::new(Compression::None);
    builder.push(&Record {
        timestamp_ms: 1000,
        key: Some(b"k"),
        value: Some(b"v"),
        headers: &[],
    });
    let bytes = builder.build().unwrap();
    // record: attributes 0, ts delta 0, offset delta 0, key len 1 'k', value len 1 'v', 0 headers
    let record_body = [0u8, 0, 0, 2, b'k', 2, b'v', 0];
    assert_eq!(bytes.len(), BATCH_HEADER_BYTES + 1 + record_body.len());
    assert_eq!(bytes[BATCH_HEADER_BYTES], (record_body.len() as u8) << 1);
    assert_eq!(&bytes[BATCH_HEADER_BYTES + 1..], &record_body);
    assert_eq!(bytes[field::MAGIC], 2);
    assert_eq!(
        i32::from_be_bytes(bytes[8..12].try_into().unwrap()),
        (bytes.len() - 12) as i32
    );
    assert_eq!(i32::from_be_bytes(bytes[12..16].try_into().unwrap()), -1);
}

#[test]
fn a_producer_stamp_keeps_the_batch_valid() {
    let records = vec![OwnedRecord {
        timestamp_ms: 5,
        key: Some(b"k".to_vec()),
        value: Some(b"v".to_vec()),
        headers: Vec::new(),
    }];
    let mut bytes = build(&records, Compression::None);
    stamp_producer(&mut bytes, ProducerId(77), ProducerEpoch(3), Sequence(41));
    let batch = RecordBatch::parse(&bytes, 1 << 20).expect("the CRC was recomputed");
    assert_eq!(batch.header().producer_id, ProducerId(77));
    assert_eq!(batch.header().producer_epoch, ProducerEpoch(3));
    assert_eq!(batch.header().base_sequence, Sequence(41));
    // Without the recomputation the CRC no longer matches.
    bytes[field::BASE_SEQUENCE + 3] ^= 1;
    assert!(RecordBatch::parse(&bytes, 1 << 20).is_err());
}

#[test]
fn a_batch_built_without_its_crc_is_valid_only_once_sealed_or_stamped() {
    let record = Record {
        timestamp_ms: 5,
        key: Some(b"k"),
        value: Some(b"v"),
        headers: &[],
    };
    let builder = || {
        let mut builder = BatchBuilder::new(Compression::Zstd);
        builder.push(&record);
        builder
    };
    let whole = builder().build().unwrap();
    let mut unsealed = builder().build_without_crc().unwrap();
    assert!(RecordBatch::parse(&unsealed, 1 << 20).is_err());
    let mut stamped = unsealed.clone();
    seal_crc(&mut unsealed);
    assert_eq!(unsealed, whole);
    stamp_producer(&mut stamped, ProducerId(9), ProducerEpoch(1), Sequence(0));
    assert_eq!(
        RecordBatch::parse(&stamped, 1 << 20)
            .unwrap()
            .header()
            .producer_id,
        ProducerId(9)
    );
}
