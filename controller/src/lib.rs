//! Ringlog's control plane: the replicated cluster metadata (brokers, topics,
//! partitions, leaders, epochs, ISR) as a pure state machine, the placement of new
//! topics, and the durable Raft storage that openraft drives. No networking here yet.

pub mod command;
pub mod delta;
pub mod ids;
pub mod placement;
pub mod records;
pub mod state;
pub mod store;
mod validate;

pub use command::{Command, CommandError, Outcome, Reply};
pub use delta::{Delta, NeedSnapshot, VersionedDelta};
pub use ids::{
    BrokerEpoch, BrokerId, LeaderEpoch, MetadataVersion, PartitionEpoch, PartitionIndex,
    ShardIndex, TopicId,
};
pub use records::{BrokerEndpoints, BrokerRecord, PartitionRecord, Replica, TopicRecord};
pub use state::{ClusterState, MetadataImage, StateLimits};
