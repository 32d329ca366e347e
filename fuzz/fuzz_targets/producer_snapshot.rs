//! Proves that no bytes make the producer snapshot decoder panic, and that
//! whatever it accepts encodes back to the same bytes.
//!
//! A log reads these files at open; a torn or corrupt one must come back as
//! a `SnapshotError` so the open falls back to an older snapshot.
#![no_main]

use broker::log::producer_state::ProducerStateTable;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((offset, table)) = ProducerStateTable::decode_snapshot(data) {
        assert_eq!(table.encode_snapshot(offset), data);
    }
});
