//! Ringlog's control plane: the replicated cluster metadata (brokers, topics,
//! partitions, leaders, epochs, ISR) as a pure state machine, the placement of new
//! topics, and the durable Raft storage that openraft drives; and the controller
//! process's parts: the Raft network between controllers, the broker-facing API
//! (codec, service, server), the fencing timer and the config. The binary's
//! composition root is `main.rs`.

pub mod command;
pub mod config;
pub mod delta;
pub mod fencer;
pub mod frame_io;
pub mod ids;
pub mod limits;
pub mod messages;
pub mod node;
pub mod placement;
pub mod process;
pub mod raft_network;
pub mod records;
pub mod server;
pub mod service;
pub mod state;
pub mod store;
mod validate;
pub mod wire;
#[cfg(test)]
mod wire_tests;

pub use command::{Command, CommandError, Outcome, Reply};
pub use delta::{Delta, NeedSnapshot, VersionedDelta};
pub use ids::{
    BrokerEpoch, BrokerId, LeaderEpoch, MetadataVersion, PartitionEpoch, PartitionIndex,
    ShardIndex, TopicId,
};
pub use records::{BrokerEndpoints, BrokerRecord, PartitionRecord, Replica, TopicRecord};
pub use state::{ClusterState, MetadataImage, StateLimits};
