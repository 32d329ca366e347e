//! The records held by the replicated cluster state: brokers, topics, partitions.
//! Plain data with read-only helpers; every mutation goes through `ClusterState::apply`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ids::{
    BrokerEpoch, BrokerId, LeaderEpoch, MetadataVersion, PartitionEpoch, PartitionIndex,
    ShardIndex, TopicId,
};

/// Topic config key that allows electing a leader outside the ISR (possible data loss).
pub const UNCLEAN_LEADER_ELECTION_ENABLE: &str = "unclean.leader.election.enable";

/// Where a broker listens: one client endpoint and one endpoint per shard, each
/// "host:port". The number of shard endpoints is the broker's shard count.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerEndpoints {
    pub client: String,
    pub shards: Vec<String>,
}

/// One registered broker. A fenced broker leads nothing and is in no ISR (except as
/// the last member of an offline partition's ISR, see `ClusterState::fence_broker`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerRecord {
    pub id: BrokerId,
    pub epoch: BrokerEpoch,
    pub endpoints: BrokerEndpoints,
    pub fenced: bool,
    pub session_timeout_ms: u64,
    /// The broker is fenced by `FenceExpiredBrokers { now_ms }` once `now_ms` reaches
    /// this deadline without a heartbeat having moved it.
    pub session_deadline_ms: u64,
    /// The process that holds this registration (see `RegisterBroker`).
    #[serde(default)]
    pub incarnation_id: u64,
}

impl BrokerRecord {
    pub fn shard_count(&self) -> usize {
        self.endpoints.shards.len()
    }
}

/// One replica of a partition: the broker holding it and the shard that owns it there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replica {
    pub broker_id: BrokerId,
    pub shard: ShardIndex,
}

/// The replicated record of one partition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionRecord {
    /// Assigned replicas; the first is the preferred leader. Never changes today
    /// (reassignment is not built yet).
    pub replicas: Vec<Replica>,
    /// In-sync replicas, sorted by broker id. Never empty.
    pub isr: Vec<BrokerId>,
    /// `None` while the partition is offline (no eligible replica alive).
    pub leader: Option<BrokerId>,
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: PartitionEpoch,
}

impl PartitionRecord {
    pub fn has_replica(&self, broker_id: BrokerId) -> bool {
        self.replicas.iter().any(|r| r.broker_id == broker_id)
    }

    pub fn replica_on(&self, broker_id: BrokerId) -> Option<Replica> {
        self.replicas
            .iter()
            .copied()
            .find(|r| r.broker_id == broker_id)
    }
}

/// The replicated record of one topic and its partitions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicRecord {
    pub id: TopicId,
    pub name: String,
    pub replication_factor: u16,
    pub config: BTreeMap<String, String>,
    /// Indexed by `PartitionIndex`.
    pub partitions: Vec<PartitionRecord>,
}

impl TopicRecord {
    pub fn partition_count(&self) -> usize {
        self.partitions.len()
    }

    /// Defaults to false: an unclean election can lose acknowledged records.
    pub fn unclean_leader_election_enable(&self) -> bool {
        self.config
            .get(UNCLEAN_LEADER_ELECTION_ENABLE)
            .map(String::as_str)
            == Some("true")
    }
}

/// One change a broker can see. A command produces one or more deltas, all tagged
/// with the version it created.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Delta {
    BrokerRegistered(BrokerRecord),
    BrokerFenced(BrokerId),
    BrokerUnfenced(BrokerId),
    TopicCreated(TopicRecord),
    TopicDeleted {
        topic_id: TopicId,
        name: String,
    },
    PartitionChanged {
        topic_id: TopicId,
        partition: PartitionIndex,
        record: PartitionRecord,
    },
    /// The topic's whole config after an AlterTopicConfigs.
    TopicConfigChanged {
        topic_id: TopicId,
        config: BTreeMap<String, String>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionedDelta {
    pub version: MetadataVersion,
    pub delta: Delta,
}

/// A copy of everything a broker needs, at one version: what a broker loads when
/// the controller no longer holds the deltas since its version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataImage {
    pub metadata_version: MetadataVersion,
    pub brokers: Vec<BrokerRecord>,
    pub topics: Vec<TopicRecord>,
}
