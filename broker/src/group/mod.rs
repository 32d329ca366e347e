//! Consumer groups as pure decisions, without I/O: the records a group
//! coordinator keeps in `__consumer_offsets` (`records`), the assignors that
//! compute a group's target assignment (`assignor`), and the coordinator of
//! one `__consumer_offsets` partition (`coordinator`): requests and timer
//! ticks in, records to write and answers out. Every change to a group is
//! made by replaying the records it produced, so a coordinator loaded from the
//! log is the same as the one that wrote it. The shard drives it and does the
//! writing (acks=all) and the loading.

pub mod assignor;
pub mod coordinator;
pub mod records;

use std::fmt;

pub use protocol::{GroupEpoch, MemberEpoch, PartitionIndex};

/// Name of the internal compacted topic that holds committed offsets and
/// group state.
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";
/// Longest group id, member id, instance id, client id or host accepted.
pub const GROUP_ID_BYTES_MAX: usize = 255;
pub const MEMBER_ID_BYTES_MAX: usize = 64;
pub const CLIENT_ID_BYTES_MAX: usize = 255;
/// The commit metadata string a client may attach to an offset (Kafka's
/// `offset.metadata.max.bytes`).
pub const OFFSET_METADATA_BYTES_MAX: usize = 4096;
pub const MEMBERS_PER_GROUP_MAX: usize = 1000;
/// Groups one coordinator (one `__consumer_offsets` partition) holds; a new
/// group beyond it is refused, so random group ids cannot grow memory
/// without bound (groups without members or offsets are dropped at the next
/// tick anyway).
pub const GROUPS_PER_COORDINATOR_MAX: usize = 100_000;
pub const SUBSCRIBED_TOPICS_MAX: usize = 1000;
/// Partitions one request may name (owned partitions, commits, fetches).
pub const PARTITIONS_PER_REQUEST_MAX: usize = 100_000;
/// Offsets one producer's open transaction may commit in one coordinator.
pub const PENDING_TXN_OFFSETS_MAX: usize = 100_000;
/// Producers with offsets pending in one coordinator at once.
pub const PENDING_TXN_PRODUCERS_MAX: usize = 10_000;
/// A member's session: it is removed when no heartbeat came for this long.
pub const SESSION_TIMEOUT_MS_DEFAULT: u32 = 45_000;
pub const SESSION_TIMEOUT_MS_MIN: u32 = 1_000;
pub const SESSION_TIMEOUT_MS_MAX: u32 = 300_000;
/// How long a member may take to give up revoked partitions before it is
/// fenced (Kafka's `max.poll.interval.ms` plays this part).
pub const REBALANCE_TIMEOUT_MS_DEFAULT: u32 = 300_000;
pub const REBALANCE_TIMEOUT_MS_MIN: u32 = 1_000;
pub const REBALANCE_TIMEOUT_MS_MAX: u32 = 3_600_000;
/// Longest interval between heartbeats the coordinator asks for.
pub const HEARTBEAT_INTERVAL_MS_MAX: u32 = 5_000;

/// One partition of one topic, named as clients name it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicPartition {
    pub topic: String,
    pub partition: PartitionIndex,
}

impl TopicPartition {
    pub fn new(topic: impl Into<String>, partition: u32) -> TopicPartition {
        TopicPartition {
            topic: topic.into(),
            partition: PartitionIndex(partition),
        }
    }
}

/// Sorted partitions as runs per topic (topic, partition indexes), the
/// shape the wire's per-topic lists take.
pub fn runs_by_topic<'a>(
    partitions: impl IntoIterator<Item = &'a TopicPartition>,
) -> Vec<(&'a str, Vec<i32>)> {
    let mut by_topic: Vec<(&str, Vec<i32>)> = Vec::new();
    for tp in partitions {
        let index = i32::try_from(tp.partition.0).unwrap_or(i32::MAX);
        match by_topic.last_mut() {
            Some((topic, list)) if *topic == tp.topic => list.push(index),
            _ => by_topic.push((&tp.topic, vec![index])),
        }
    }
    by_topic
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.topic, self.partition)
    }
}

/// Which `__consumer_offsets` partition holds a group: a stable hash of the
/// id (CRC-32C), so every broker and every version agrees.
pub fn offsets_partition_for(group_id: &str, partition_count: u32) -> PartitionIndex {
    assert!(partition_count > 0, "__consumer_offsets has partitions");
    PartitionIndex(crc32c::crc32c(group_id.as_bytes()) % partition_count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_placement_is_stable() {
        // A wire contract between versions: pin one value.
        assert_eq!(offsets_partition_for("billing", 50), PartitionIndex(6));
        for n in 1..64 {
            assert!(offsets_partition_for("g", n).0 < n);
        }
    }
}
