//! Ringlog's async Rust client, for ordinary tokio applications: `Admin`
//! (topics and consumer groups), `Producer` (batched, partitioned, retried
//! appends with a future per record), `Consumer` (assigned partitions, seek,
//! prefetching poll) and `GroupConsumer` (a consumer group member: the
//! coordinator assigns partitions, offsets are committed), all sharing a
//! `Cluster` (metadata cache, shard-aware routing, one pipelined
//! `Connection` per endpoint). It depends only on `protocol`.
//!
//! Data path: `Producer::enqueue` → `Accumulator` (per-partition batches,
//! built once with `protocol::BatchBuilder`) → one Produce request per leader
//! shard endpoint → per-record futures resolve. `Consumer::poll` → one Fetch
//! per leader shard endpoint in flight → stored batches validated and decoded
//! (`consumer_record.rs`) → records at or above the requested offset.
//! `GroupConsumer::poll` → a heartbeat task to the group's coordinator
//! (`coordinator.rs`) → its answer into `Membership` (membership.rs, pure) →
//! revoked partitions committed and unassigned, new ones positioned at their
//! committed offsets → the same `Consumer` fetch path for what it owns.

pub mod accumulator;
pub mod admin;
pub mod cluster;
pub mod config;
pub mod connection;
pub mod consumer;
pub mod consumer_record;
pub mod coordinator;
pub mod error;
pub mod group;
pub mod group_types;
pub mod membership;
pub mod messages;
pub mod metadata;
pub mod partitioner;
pub mod producer;
pub mod record;
pub mod topic_types;
pub mod transaction;

pub use accumulator::TopicPartition;
pub use admin::{Admin, PartitionDescription, TopicDescription, TopicSummary};
pub use cluster::Cluster;
pub use config::{
    Acks, ClientConfig, ConsumerConfig, GroupConfig, IsolationLevel, OffsetReset, ProducerConfig,
};
pub use connection::{Connection, Response, ResponseFuture};
pub use consumer::{Consumer, SeekTo};
pub use consumer_record::ConsumerRecord;
pub use error::{ClientError, Result};
pub use group::{GroupConsumer, GroupEvent};
pub use group_types::{
    CommittedOffset, CoordinatorInfo, GroupDescription, GroupListing, GroupMemberDescription,
    GroupPartitionDescription, PartitionReset, ResetTo,
};
pub use metadata::{
    BrokerMetadata, ClusterMetadata, PartitionMetadata, ShardEndpoint, TopicMetadata,
};
pub use partitioner::{murmur2, Partitioner};
pub use producer::{Delivery, DeliveryFuture, Header, Producer, ProducerRecord};
pub use protocol::Compression;
