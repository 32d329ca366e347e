//! Newtypes for every id, epoch, offset and version the processes exchange, one
//! definition each, so that kinds of numbers that share a machine type cannot
//! be mixed up. The cluster ids serialize as their bare number (the
//! controller's replicated state stores them).

use std::fmt;

use serde::{Deserialize, Serialize};

macro_rules! id_newtype {
    ($(#[$doc:meta])* $name:ident($inner:ty)) => {
        $(#[$doc])*
        #[derive(
            Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

id_newtype!(
    /// The epoch of a partition's leadership: bumped by the controller on every
    /// leader change (including to no leader) and stamped by the leader into
    /// each batch it appends.
    LeaderEpoch(i32)
);
id_newtype!(
    /// Identifies a broker process across restarts; chosen by the operator.
    BrokerId(u32)
);
id_newtype!(
    /// Identifies one registration (incarnation) of a broker. A new registration
    /// gets a larger epoch, so requests from an older incarnation can be refused.
    BrokerEpoch(u64)
);
id_newtype!(
    /// Identifies a topic for its whole life; never reused, even after deletion.
    TopicId(u64)
);
id_newtype!(
    /// Index of a partition within its topic, `0..partition_count`.
    PartitionIndex(u32)
);
id_newtype!(
    /// Index of a shard (pinned core) within a broker, `0..shard_count`.
    ShardIndex(u16)
);
id_newtype!(
    /// Epoch of a partition's whole record (leader, ISR, replicas); bumped on every
    /// change, and used as the compare-and-set version of `AlterIsr`.
    PartitionEpoch(i32)
);
id_newtype!(
    /// Version of the cluster metadata; bumped once per applied command that changed
    /// anything a broker can see.
    MetadataVersion(u64)
);

id_newtype!(
    /// Epoch of a consumer group: bumped whenever its members, their
    /// subscriptions or the partitions of the topics they subscribe to change,
    /// and stamped on the target assignment computed for that state.
    GroupEpoch(i32)
);
id_newtype!(
    /// Epoch of one member of a consumer group: the group epoch of the target
    /// assignment the member has reconciled to. 0 asks to join, -1 leaves,
    /// -2 leaves for a while (a static member); a request carrying another
    /// member epoch than the coordinator's is fenced.
    MemberEpoch(i32)
);

impl GroupEpoch {
    pub fn next(self) -> GroupEpoch {
        GroupEpoch(self.0.checked_add(1).expect("group epoch overflow"))
    }
}

impl MemberEpoch {
    /// Sent by a member that wants to join (or rejoin after being fenced).
    pub const JOIN: MemberEpoch = MemberEpoch(0);
    /// Sent by a member that leaves the group for good.
    pub const LEAVE: MemberEpoch = MemberEpoch(-1);
    /// Sent by a static member that leaves and means to come back: its
    /// partitions stay its own until its session times out.
    pub const LEAVE_STATIC: MemberEpoch = MemberEpoch(-2);
}

impl BrokerEpoch {
    /// No registration known: a broker that has not registered yet, or the
    /// wire's -1.
    pub const UNKNOWN: BrokerEpoch = BrokerEpoch(0);

    /// The epoch as the wire carries it, where a negative value says unknown.
    pub fn from_wire(epoch: i64) -> BrokerEpoch {
        u64::try_from(epoch).map_or(BrokerEpoch::UNKNOWN, BrokerEpoch)
    }
}

impl LeaderEpoch {
    /// No epoch: asked about or answered for a log that has none (Kafka's -1).
    pub const NONE: LeaderEpoch = LeaderEpoch(-1);

    /// Epoch overflow is a bug: an epoch is bumped once per leader change.
    pub fn next(self) -> LeaderEpoch {
        LeaderEpoch(self.0.checked_add(1).expect("leader epoch overflow"))
    }
}

impl PartitionEpoch {
    pub fn next(self) -> PartitionEpoch {
        PartitionEpoch(self.0.checked_add(1).expect("partition epoch overflow"))
    }
}

impl MetadataVersion {
    pub fn next(self) -> MetadataVersion {
        MetadataVersion(self.0.checked_add(1).expect("metadata version overflow"))
    }
}

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

    /// The sequence `records` after this one. Sequences wrap past `i32::MAX`
    /// to 0, as Kafka's clients and brokers agree.
    /// Total on any input: a peer's malformed sequence must not crash us.
    pub fn advanced_by(self, records: i64) -> Sequence {
        let sum = i64::from(self.0).saturating_add(records);
        Sequence(sum.rem_euclid(i64::from(i32::MAX) + 1) as i32)
    }
}
