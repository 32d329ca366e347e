//! Newtypes for offsets, epochs and producer ids, so that kinds of numbers that
//! share a machine type cannot be mixed up.

use std::fmt;

/// A position in a partition log, counted in records from the first record ever
/// appended. Offsets are dense: every offset below the log end names one record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Offset(pub i64);

impl Offset {
    pub const ZERO: Offset = Offset(0);

    pub fn get(self) -> i64 {
        self.0
    }

    /// Offset arithmetic that overflows is a bug: offsets never approach i64::MAX.
    pub fn plus(self, delta: i64) -> Offset {
        Offset(self.0.checked_add(delta).expect("offset overflow"))
    }
}

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The epoch of the partition leader that appended a batch; bumped on every
/// leadership change and stamped into each stored batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaderEpoch(pub i32);

impl fmt::Display for LeaderEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Identifies an idempotent producer session; -1 when the producer is not idempotent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProducerId(pub i64);

impl ProducerId {
    pub const NONE: ProducerId = ProducerId(-1);
}

/// Fences older instances of the same producer id; -1 when unused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProducerEpoch(pub i16);

impl ProducerEpoch {
    pub const NONE: ProducerEpoch = ProducerEpoch(-1);
}

/// Per-partition sequence number of a producer's first record in a batch; -1 when unused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Sequence(pub i32);

impl Sequence {
    pub const NONE: Sequence = Sequence(-1);
}
