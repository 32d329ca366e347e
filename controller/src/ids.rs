//! The controller's ids, epochs and versions: the one definition of each is in
//! `protocol::ids`, shared with the broker and the clients.

pub use protocol::ids::{
    BrokerEpoch, BrokerId, LeaderEpoch, MetadataVersion, PartitionEpoch, PartitionIndex,
    ShardIndex, TopicId,
};
