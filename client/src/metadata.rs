//! Owned cluster metadata: brokers with their shard endpoints, topics and
//! partitions with leader, epoch and owning shard. Decoded once from the
//! Metadata response (see `messages.rs`); nothing here touches flatbuffers or
//! the network.

use protocol::ErrorCode;

use crate::error::{ClientError, Result};

/// One shard's listener on a broker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardEndpoint {
    pub shard: u16,
    pub host: String,
    pub port: u16,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerMetadata {
    pub node_id: i32,
    pub host: String,
    pub port: u16,
    pub shards: Vec<ShardEndpoint>,
}

impl BrokerMetadata {
    /// The broker's main listener.
    pub fn address(&self) -> String {
        join_host_port(&self.host, self.port)
    }

    /// The listener of `shard`, falling back to the main port when the
    /// broker advertises no endpoint for it.
    pub fn shard_address(&self, shard: u16) -> String {
        self.shards
            .iter()
            .find(|e| e.shard == shard)
            .map(|e| join_host_port(&e.host, e.port))
            .unwrap_or_else(|| self.address())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionMetadata {
    pub partition: i32,
    pub error: ErrorCode,
    /// Node id of the leader, -1 when there is none.
    pub leader: i32,
    pub leader_epoch: i32,
    /// The leader's shard that owns the partition.
    pub shard: u16,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicMetadata {
    pub name: String,
    pub error: ErrorCode,
    /// Sorted by partition id.
    pub partitions: Vec<PartitionMetadata>,
}

impl TopicMetadata {
    /// Constant time when ids run from 0 without gaps (the usual case), a
    /// binary search otherwise: producers and consumers ask once per batch or
    /// fetch entry, and a topic may have thousands of partitions.
    pub fn partition(&self, partition: i32) -> Option<&PartitionMetadata> {
        let at = usize::try_from(partition).ok()?;
        match self.partitions.get(at) {
            Some(p) if p.partition == partition => Some(p),
            _ => self
                .partitions
                .binary_search_by_key(&partition, |p| p.partition)
                .ok()
                .map(|i| &self.partitions[i]),
        }
    }

    pub fn partition_count(&self) -> usize {
        self.partitions.len()
    }
}

/// A snapshot of the cluster as one broker saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterMetadata {
    pub brokers: Vec<BrokerMetadata>,
    pub controller_id: i32,
    /// Sorted by name.
    pub topics: Vec<TopicMetadata>,
}

impl ClusterMetadata {
    pub fn topic(&self, name: &str) -> Option<&TopicMetadata> {
        self.topics
            .iter()
            .find(|t| t.name == name && t.error.is_ok())
    }

    pub fn broker(&self, node_id: i32) -> Option<&BrokerMetadata> {
        self.brokers.iter().find(|b| b.node_id == node_id)
    }

    /// The address to send a partition's produce, fetch and list-offsets
    /// requests to: its leader's shard endpoint (shard-aware routing).
    pub fn leader_address(&self, topic: &str, partition: i32) -> Result<String> {
        let topic_metadata = self
            .topic(topic)
            .ok_or_else(|| ClientError::UnknownTopic(topic.to_owned()))?;
        let partition_metadata =
            topic_metadata
                .partition(partition)
                .ok_or_else(|| ClientError::UnknownPartition {
                    topic: topic.to_owned(),
                    partition,
                })?;
        let no_leader = || ClientError::LeaderNotAvailable {
            topic: topic.to_owned(),
            partition,
        };
        if partition_metadata.leader < 0 {
            return Err(no_leader());
        }
        let broker = self
            .broker(partition_metadata.leader)
            .ok_or_else(no_leader)?;
        Ok(broker.shard_address(partition_metadata.shard))
    }
}

/// `HOST:PORT`, with brackets around an IPv6 host.
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> ClusterMetadata {
        ClusterMetadata {
            brokers: vec![BrokerMetadata {
                node_id: 1,
                host: "10.0.0.1".into(),
                port: 9092,
                shards: vec![ShardEndpoint {
                    shard: 1,
                    host: "10.0.0.1".into(),
                    port: 9101,
                }],
            }],
            controller_id: 1,
            topics: vec![TopicMetadata {
                name: "t".into(),
                error: ErrorCode::None,
                partitions: (0..3)
                    .map(|p| PartitionMetadata {
                        partition: p,
                        error: ErrorCode::None,
                        leader: if p == 2 { -1 } else { 1 },
                        leader_epoch: 0,
                        shard: p as u16,
                        replicas: vec![1],
                        isr: vec![1],
                    })
                    .collect(),
            }],
        }
    }

    #[test]
    fn routes_to_the_shard_endpoint_or_falls_back_to_the_main_port() {
        // Proves shard-aware routing: a partition goes to its leader's shard
        // listener, to the main port when that shard has none, and a
        // leaderless partition is a retriable error.
        let metadata = cluster();
        assert_eq!(metadata.leader_address("t", 1).unwrap(), "10.0.0.1:9101");
        assert_eq!(metadata.leader_address("t", 0).unwrap(), "10.0.0.1:9092");
        let error = metadata.leader_address("t", 2).unwrap_err();
        assert!(error.is_retriable() && error.needs_metadata_refresh());
        assert!(matches!(
            metadata.leader_address("missing", 0),
            Err(ClientError::UnknownTopic(_))
        ));
        assert_eq!(join_host_port("::1", 1), "[::1]:1");
    }

    #[test]
    fn finds_partitions_by_id_with_or_without_gaps() {
        let mut topic = cluster().topics.remove(0);
        assert_eq!(topic.partition(1).map(|p| p.partition), Some(1));
        assert!(topic.partition(3).is_none() && topic.partition(-1).is_none());
        // A response that left a partition out: ids no longer match places.
        topic.partitions.remove(0);
        for id in [1, 2] {
            assert_eq!(topic.partition(id).map(|p| p.partition), Some(id));
        }
        assert!(topic.partition(0).is_none());
    }
}
