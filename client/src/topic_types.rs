//! What topic admin reports (`Admin::list_topics`, `describe_topic`): plain
//! data shared by the admin client and the message codec.

use protocol::ErrorCode;

/// A topic as `list_topics` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicSummary {
    pub name: String,
    pub partitions: i32,
    pub replication_factor: i16,
}

/// One partition as `describe_topic` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionDescription {
    pub partition: i32,
    pub error: ErrorCode,
    /// Node id, -1 without a leader.
    pub leader: i32,
    pub leader_epoch: i32,
    pub shard: u16,
    pub log_start_offset: i64,
    pub log_end_offset: i64,
    pub high_watermark: i64,
    pub size_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicDescription {
    pub name: String,
    pub partition_count: i32,
    pub replication_factor: i16,
    /// Key/value strings, e.g. `retention.ms`, `flush.policy`.
    pub configs: Vec<(String, String)>,
    pub partitions: Vec<PartitionDescription>,
}
