//! Proves that no stored bytes make the `__transaction_state` record
//! decoder panic, and that whatever it accepts encodes back to the same
//! record.
//!
//! A transaction coordinator loads these records when it takes over a
//! partition; a corrupt one must come back as a `TxnRecordError`.
#![no_main]

use broker::txn::records::TxnRecord;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else { return };
    let split = usize::from(split).min(rest.len());
    let (key, value) = rest.split_at(split);
    for value in [None, Some(value)] {
        if let Ok(record) = TxnRecord::decode(key, value) {
            let key = record.encode_key();
            let value = record.encode_value();
            assert_eq!(TxnRecord::decode(&key, value.as_deref()), Ok(record));
        }
    }
});
