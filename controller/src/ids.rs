//! Newtypes for the controller's ids, epochs and versions, so that numbers of
//! different kinds cannot be mixed up. Owns no behaviour beyond ordering and display.

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
    /// Epoch of a partition's leadership; bumped on every leader change (including
    /// to no leader). Same meaning as `protocol::LeaderEpoch`, kept separate so the
    /// controller's replicated state does not depend on the wire crate.
    LeaderEpoch(i32)
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

impl LeaderEpoch {
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
