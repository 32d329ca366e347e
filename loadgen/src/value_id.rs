//! `ValueId`: the unique identity the load generator gives every message,
//! packed into a u64 as producer (high 24 bits) and that producer's
//! sequence number (low 40 bits). Verification uses the producer half to
//! check per-producer order, and the pair to find losses and duplicates.

use std::fmt;

/// Bits of the sequence number: 2^40 messages per producer (12 days at 1M msg/s).
pub const SEQUENCE_BITS: u32 = 40;
/// Largest producer index (2^24 − 1).
pub const PRODUCER_MAX: u32 = (1 << (64 - SEQUENCE_BITS)) - 1;
/// Largest sequence number (2^40 − 1).
pub const SEQUENCE_MAX: u64 = (1 << SEQUENCE_BITS) - 1;

/// A message's identity: (producer, sequence) packed into a u64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u64);

impl ValueId {
    /// Panics when either part is out of range: callers bound producers and
    /// sequences up front, so overflow here is a bug.
    pub fn new(producer: u32, sequence: u64) -> ValueId {
        assert!(
            producer <= PRODUCER_MAX,
            "producer {producer} > {PRODUCER_MAX}"
        );
        assert!(
            sequence <= SEQUENCE_MAX,
            "sequence {sequence} > {SEQUENCE_MAX}"
        );
        ValueId((u64::from(producer) << SEQUENCE_BITS) | sequence)
    }

    pub fn producer(self) -> u32 {
        u32::try_from(self.0 >> SEQUENCE_BITS).expect("24 bits fit in u32")
    }

    pub fn sequence(self) -> u64 {
        self.0 & SEQUENCE_MAX
    }
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.producer(), self.sequence())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        // Packing is lossless for every in-range (producer, sequence).
        #[test]
        fn round_trip(producer in 0..=PRODUCER_MAX, sequence in 0..=SEQUENCE_MAX) {
            let id = ValueId::new(producer, sequence);
            prop_assert_eq!(id.producer(), producer);
            prop_assert_eq!(id.sequence(), sequence);
        }
    }

    // Within one producer, ids order like sequences.
    #[test]
    fn orders_by_sequence_within_producer() {
        assert!(ValueId::new(3, 9) < ValueId::new(3, 10));
        assert_eq!(ValueId::new(2, 5).to_string(), "2:5");
    }
}
