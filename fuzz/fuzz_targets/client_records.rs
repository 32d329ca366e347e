//! Proves that no fetched bytes make the client's record decoder
//! (`client::consumer_record::decode_records`) panic or hand out records
//! that break what a consumer relies on.
//!
//! A consumer decodes whatever a broker (or something posing as one) sends
//! in a fetch answer; a corrupt batch must come back as an error, never as a
//! crash or an allocation sized by a count the bytes cannot hold. The first
//! input byte picks the fetch offset and whether an aborted transaction is
//! listed; the rest is decoded as it is and, as in `record_batch`, once more
//! with the first batch's CRC rewritten so the decoder behind it is reached.
#![no_main]

use bytes::Bytes;
use client::consumer_record::decode_records;
use client::messages::AbortedTransaction;
use libfuzzer_sys::fuzz_target;
use protocol::record_batch::{compute_crc, field};
use protocol::BatchHeader;

/// Bound on one batch and on a decompressed records section, as the
/// consumer's defaults.
const BYTES_MAX: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Some((&control, rest)) = data.split_first() else {
        return;
    };
    let fetch_offset = i64::from(control & 0x7f) - 4;
    let aborted = if control & 0x80 != 0 {
        vec![AbortedTransaction {
            producer_id: 7,
            first_offset: fetch_offset,
        }]
    } else {
        Vec::new()
    };
    decode(rest, fetch_offset, &aborted);

    if let Ok(header) = BatchHeader::parse(rest) {
        let total = header.total_bytes();
        if total <= rest.len() {
            let mut fixed = rest.to_vec();
            let crc = compute_crc(&fixed[..total]);
            fixed[field::CRC..field::CRC + 4].copy_from_slice(&crc.to_be_bytes());
            decode(&fixed, fetch_offset, &aborted);
        }
    }
});

fn decode(bytes: &[u8], fetch_offset: i64, aborted: &[AbortedTransaction]) {
    let bytes = Bytes::copy_from_slice(bytes);
    let Ok(decoded) = decode_records("t", 0, &bytes, fetch_offset, BYTES_MAX, BYTES_MAX, aborted)
    else {
        return;
    };
    assert!(decoded.next_fetch_offset >= fetch_offset);
    for record in &decoded.records {
        assert!(record.offset >= fetch_offset);
        assert!(record.offset < decoded.next_fetch_offset);
        assert_eq!(&*record.topic, "t");
    }
    assert!(decoded
        .records
        .windows(2)
        .all(|w| w[0].offset < w[1].offset));
}
