//! Proves that no bytes make the journal ring's reader panic or accept a record it could not have written.
//!
//! The input is a ring image's record area behind a valid header (so the
//! fuzzer works on records, not on finding a header CRC), and, on its own, a
//! header block. A journal is read back at start-up after a crash, torn or
//! corrupt; what a scan accepts must be consecutive records with plain log
//! names and block-aligned chunks inside the ring, and replay must only ever
//! plan writes.
#![no_main]

use broker::log::journal::{
    replay_plan, scan, JournalHeader, JournalSeq, RecordBody, RingWriter, JOURNAL_BLOCK_BYTES,
    JOURNAL_CHUNK_BYTES_MAX, JOURNAL_RING_BYTES_MIN,
};
use libfuzzer_sys::fuzz_target;

/// The id the seed corpus's rounds carry (`cargo run --example seed_corpus`).
const FUZZ_RING_ID: u64 = 0xf022;

fuzz_target!(|data: &[u8]| {
    let _ = JournalHeader::decode_block(data);
    // Header and records together, as found on disk.
    let _ = scan(data).map(|found| replay_plan(&found.records).len());

    // The seeds' rounds are numbered from 0 (`cargo run --example seed_corpus`).
    let first_seq = 0u64;
    let area = data.len() as u64 + JOURNAL_BLOCK_BYTES;
    let ring_bytes = area
        .next_multiple_of(JOURNAL_BLOCK_BYTES)
        .max(JOURNAL_RING_BYTES_MIN);
    let writer =
        RingWriter::new(ring_bytes, JournalSeq(first_seq), FUZZ_RING_ID).expect("valid ring size");
    let mut ring = vec![0u8; ring_bytes as usize];
    ring[..JOURNAL_BLOCK_BYTES as usize].copy_from_slice(&writer.header().encode_block(None));
    let at = JOURNAL_BLOCK_BYTES as usize;
    ring[at..at + data.len()].copy_from_slice(data);

    let found = scan(&ring).expect("the header is valid");
    assert_eq!(found.header, writer.header());
    let records = &found.records;
    for (i, record) in records.iter().enumerate() {
        assert_eq!(record.seq.0, first_seq + i as u64);
        assert!(!record.log.is_empty() && !record.log.contains('/'));
        assert!(record.log != "." && record.log != "..");
        if let RecordBody::Write {
            segment_base,
            position,
            bytes,
        } = record.body
        {
            assert!(segment_base.0 >= 0);
            assert_eq!(position % JOURNAL_BLOCK_BYTES, 0);
            assert_eq!(bytes.len() as u64 % JOURNAL_BLOCK_BYTES, 0);
            assert!(bytes.len() <= JOURNAL_CHUNK_BYTES_MAX);
        }
    }
    for planned in replay_plan(records) {
        assert!(matches!(planned.body, RecordBody::Write { .. }));
    }
});
