//! Proves that no byte string makes a record batch v2 decoder panic or break its invariants.
//!
//! Covered: the header parser, the length peek, framing and CRC check, the
//! (zstd) records section, the per-record iterator and the zig-zag varint readers.
//!
//! Arbitrary bytes almost never carry a correct CRC-32C, which would stop the
//! fuzzer at the checksum. So every input is decoded twice: once as it is, and
//! once with the CRC field rewritten to the checksum of the bytes the header
//! claims, so that the records section and every record decoder behind the
//! checksum are reached too. Besides "no panic", it checks a few invariants the
//! callers rely on (spans, record offsets within the header's range).
#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol::record_batch::{compute_crc, field, peek_total_bytes};
use protocol::varint::{get_varint, get_varlong, put_varint, put_varlong};
use protocol::{BatchHeader, RecordBatch, BATCH_HEADER_BYTES};

/// Bound on batch size and on the decompressed records section, as the brief's callers use.
const BYTES_MAX: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    varints(data);

    let _ = peek_total_bytes(data);
    let header = BatchHeader::parse(data);
    if let Ok(header) = &header {
        // Accessors that only read checked fields.
        let _ = header.total_bytes();
        let _ = header.compression();
        let _ = header.is_transactional();
        let _ = header.is_control();
        let _ = header.check_producer_batch();
    }

    decode(data);

    // Same bytes with a correct CRC, to get past the checksum.
    if let Ok(header) = header {
        let total = header.total_bytes();
        if total <= data.len() {
            let mut fixed = data.to_vec();
            let crc = compute_crc(&fixed[..total]);
            fixed[field::CRC..field::CRC + 4].copy_from_slice(&crc.to_be_bytes());
            decode(&fixed);
        }
    }
});

fn decode(data: &[u8]) {
    let _ = RecordBatch::parse(data, BYTES_MAX);
    let Ok((batch, used)) = RecordBatch::parse_prefix(data, BYTES_MAX) else {
        return;
    };
    let header = *batch.header();
    assert!(used >= BATCH_HEADER_BYTES && used <= data.len() && used <= BYTES_MAX);
    assert_eq!(used, header.total_bytes());
    assert_eq!(batch.as_bytes().len(), used);

    let validated = batch.validate_records(BYTES_MAX);

    let iterated = match batch.records_section(BYTES_MAX) {
        Err(e) => Err(e),
        Ok(section) => {
            assert!(section.len_bytes() <= BYTES_MAX);
            let mut result = Ok(());
            let mut count: i64 = 0;
            let mut previous: Option<i64> = None;
            for record in section.iter() {
                match record {
                    Ok(record) => {
                        count += 1;
                        let offset = record.offset.0;
                        // Offsets rise strictly and stay within base..=base+last_offset_delta.
                        assert!(offset >= header.base_offset.0);
                        assert!(
                            i128::from(offset)
                                <= i128::from(header.base_offset.0)
                                    + i128::from(header.last_offset_delta)
                        );
                        if let Some(p) = previous {
                            assert!(offset > p);
                        }
                        previous = Some(offset);
                        let _ = (record.key, record.value, record.timestamp_ms);
                        for h in &record.headers {
                            let _ = (h.key, h.value);
                        }
                    }
                    Err(e) => {
                        assert!(result.is_ok(), "iterator yielded a second error");
                        result = Err(e);
                    }
                }
            }
            assert!(count <= i64::from(header.record_count));
            if result.is_ok() {
                assert_eq!(count, i64::from(header.record_count));
            }
            result
        }
    };
    // The deep check and a hand iteration agree.
    assert_eq!(validated, iterated);
}

fn varints(data: &[u8]) {
    // Every suffix, so varints at every alignment are exercised.
    for start in 0..data.len().min(16) {
        let input = &data[start..];
        if let Some((v, used)) = get_varint(input) {
            assert!(used >= 1 && used <= input.len() && used <= 5);
            let mut buf = Vec::new();
            put_varint(&mut buf, v);
            assert_eq!(get_varint(&buf), Some((v, buf.len())));
        }
        if let Some((v, used)) = get_varlong(input) {
            assert!(used >= 1 && used <= input.len() && used <= 10);
            let mut buf = Vec::new();
            put_varlong(&mut buf, v);
            assert_eq!(get_varlong(&buf), Some((v, buf.len())));
        }
    }
}
