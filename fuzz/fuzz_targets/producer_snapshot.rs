//! Proves that no bytes make the producer snapshot decoder panic, and that
//! whatever it accepts in the current version encodes back to the same
//! bytes (an older version is re-encoded in the current one).
//!
//! A log reads these files at open; a torn or corrupt one must come back as
//! a `SnapshotError` so the open falls back to an older snapshot.
#![no_main]

use broker::log::producer_state::ProducerStateTable;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((offset, table)) = ProducerStateTable::decode_snapshot(data) {
        let encoded = table.encode_snapshot(offset);
        if data[4..6] == encoded[4..6] {
            assert_eq!(encoded, data);
        } else {
            assert_eq!(ProducerStateTable::decode_snapshot(&encoded), Ok((offset, table)));
        }
    }
});
