//! Proves that no bytes make the transaction index decoder panic, and that
//! whatever it accepts encodes back to the same bytes.
//!
//! A log reads these files at open; a torn or corrupt one must come back as
//! a `TxnIndexError` so the log rebuilds the file's aborts from its segment.
#![no_main]

use broker::log::txn_index::AbortedIndex;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(entries) = AbortedIndex::decode_file(data) {
        assert_eq!(AbortedIndex::encode_file(&entries), data);
    }
});
