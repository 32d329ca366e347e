//! Proves that no byte string makes the offset or time index decoders panic or accept a bad index.
//!
//! Whatever they accept is sorted, in bounds and re-encodes to the same bytes.
//! Index files are read back from disk at recovery, where they may be torn or
//! corrupt; a bad file must come back as an `IndexError` (and be rebuilt), never
//! as a panic, and an accepted file must satisfy what lookups assume.
#![no_main]

use broker::log::index::{OffsetIndex, TimeIndex};
use libfuzzer_sys::fuzz_target;

const SEGMENT_BYTES: u64 = 1 << 20;
const OFFSET_SPAN: u64 = 1 << 20;

fuzz_target!(|data: &[u8]| {
    if let Ok(index) = OffsetIndex::decode(data, SEGMENT_BYTES, OFFSET_SPAN) {
        let entries = index.entries();
        for pair in entries.windows(2) {
            assert!(pair[0].relative_offset < pair[1].relative_offset);
            assert!(pair[0].position < pair[1].position);
        }
        for e in entries {
            assert!(u64::from(e.position) < SEGMENT_BYTES);
            assert!(u64::from(e.relative_offset) < OFFSET_SPAN);
        }
        assert_eq!(index.encode(), data);
        // Lookups on an accepted index never panic.
        let _ = index.lookup(0);
        let _ = index.lookup(u32::MAX);
        if let Some(last) = index.last() {
            assert_eq!(index.lookup(last.relative_offset), last);
        }
    }

    if let Ok(index) = TimeIndex::decode(data, OFFSET_SPAN) {
        let entries = index.entries();
        for pair in entries.windows(2) {
            assert!(pair[0].relative_offset < pair[1].relative_offset);
            assert!(pair[0].timestamp_ms < pair[1].timestamp_ms);
        }
        for e in entries {
            assert!(u64::from(e.relative_offset) < OFFSET_SPAN);
        }
        assert_eq!(index.encode(), data);
        let _ = index.scan_start(i64::MIN);
        let _ = index.scan_start(i64::MAX);
    }
});
