//! The commands replicated through the Raft log, their outcomes and their typed
//! errors. A command carries everything `apply` needs, including the time: applying
//! it reads no clock and does no I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ids::{
    BrokerEpoch, BrokerId, LeaderEpoch, MetadataVersion, PartitionEpoch, PartitionIndex, TopicId,
};
use crate::records::{BrokerEndpoints, PartitionRecord};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// A broker process starts (or restarts). It gets a new epoch and starts fenced;
    /// an alive earlier incarnation is fenced first, since its unsynced records may be gone.
    RegisterBroker {
        broker_id: BrokerId,
        endpoints: BrokerEndpoints,
        now_ms: u64,
        session_timeout_ms: u64,
        /// The registering process; 0 from a broker that predates it (every
        /// registration is then a new incarnation).
        #[serde(default)]
        incarnation_id: u64,
    },
    /// Moves the broker's session deadline to `now_ms + session_timeout_ms`.
    BrokerHeartbeat {
        broker_id: BrokerId,
        broker_epoch: BrokerEpoch,
        now_ms: u64,
    },
    /// The broker is ready to serve: it becomes eligible for leadership and ISR.
    UnfenceBroker {
        broker_id: BrokerId,
        broker_epoch: BrokerEpoch,
    },
    /// A broker shutting down asks to be fenced now (controlled shutdown): its
    /// partitions get new leaders from their ISRs before it stops serving.
    FenceBroker {
        broker_id: BrokerId,
        broker_epoch: BrokerEpoch,
    },
    /// Issued periodically by the controller leader: fences every unfenced broker
    /// whose session deadline is at or before `now_ms`.
    FenceExpiredBrokers {
        now_ms: u64,
    },
    CreateTopic {
        name: String,
        partition_count: u32,
        replication_factor: u16,
        config: BTreeMap<String, String>,
    },
    DeleteTopic {
        name: String,
    },
    /// Sets and removes keys of a topic's config; the whole resulting config
    /// is validated as at creation and published as one delta.
    AlterTopicConfig {
        name: String,
        set: BTreeMap<String, String>,
        remove: Vec<String>,
    },
    /// A registered broker takes the next `PRODUCER_ID_BLOCK_COUNT` producer
    /// ids to hand out itself. The next free id is part of the replicated
    /// state, so no id is given twice, across controller failovers included.
    AllocateProducerIds {
        broker_id: BrokerId,
        broker_epoch: BrokerEpoch,
    },
    /// Compare-and-set of a partition's ISR by its leader.
    AlterIsr {
        topic_id: TopicId,
        partition: PartitionIndex,
        leader_id: BrokerId,
        leader_epoch: LeaderEpoch,
        partition_epoch: PartitionEpoch,
        new_isr: Vec<BrokerId>,
        /// Broker epochs of `new_isr`'s members as the leader saw them; empty
        /// skips the check (a leader that predates it).
        #[serde(default)]
        new_isr_epochs: Vec<BrokerEpoch>,
    },
}

impl Command {
    /// The command a leader's AlterIsr request asks for.
    pub fn alter_isr(request: &protocol::control::messages::AlterIsr) -> Command {
        Command::AlterIsr {
            topic_id: request.topic_id,
            partition: request.partition,
            leader_id: request.leader_id,
            leader_epoch: request.leader_epoch,
            partition_epoch: request.partition_epoch,
            new_isr: request.new_isr.clone(),
            new_isr_epochs: request.new_isr_epochs.clone(),
        }
    }
}

/// What a successful command did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// Raft blank and membership entries, which do not touch the cluster state.
    None,
    BrokerRegistered {
        broker_epoch: BrokerEpoch,
    },
    HeartbeatAccepted {
        fenced: bool,
    },
    BrokerUnfenced,
    BrokersFenced {
        broker_ids: Vec<BrokerId>,
    },
    TopicCreated {
        topic_id: TopicId,
    },
    TopicDeleted {
        topic_id: TopicId,
    },
    TopicConfigAltered {
        topic_id: TopicId,
    },
    /// The partition as it is after the change (unchanged if the ISR was already `new_isr`).
    IsrAltered {
        partition: PartitionRecord,
    },
    /// Producer ids `[first, first + count)` now belong to the asking broker.
    ProducerIdsAllocated {
        first: i64,
        count: u32,
    },
}

/// The reply to one applied log entry: the metadata version after it, and its result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    pub metadata_version: MetadataVersion,
    pub result: Result<Outcome, CommandError>,
}

/// Why a command was refused. A refused command changes nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum CommandError {
    #[error("unknown broker {0}")]
    UnknownBroker(BrokerId),
    #[error("broker {broker_id} epoch {got} is not the current epoch {current}")]
    StaleBrokerEpoch {
        broker_id: BrokerId,
        current: BrokerEpoch,
        got: BrokerEpoch,
    },
    #[error("invalid endpoints: {0}")]
    InvalidEndpoints(String),
    #[error("broker {broker_id} registered {previous} shards before and {got} now; reassignment is not supported")]
    ShardCountChanged {
        broker_id: BrokerId,
        previous: usize,
        got: usize,
    },
    #[error("session timeout {got} ms outside {min}..={max} ms")]
    SessionTimeoutOutOfRange { got: u64, min: u64, max: u64 },
    #[error("broker count would exceed {0}")]
    BrokerCountMax(usize),
    #[error("topic {0:?} already exists")]
    TopicExists(String),
    #[error("unknown topic {0:?}")]
    UnknownTopic(String),
    #[error("unknown topic id {0}")]
    UnknownTopicId(TopicId),
    #[error("invalid topic name {0:?}")]
    InvalidTopicName(String),
    #[error("partition count {got} outside 1..={max}")]
    InvalidPartitionCount { got: u32, max: u32 },
    #[error("replication factor {replication_factor} with {live_broker_count} live brokers")]
    InvalidReplicationFactor {
        replication_factor: u16,
        live_broker_count: usize,
    },
    #[error("invalid config {key:?}: {reason}")]
    InvalidConfig { key: String, reason: String },
    #[error("topic count would exceed {0}")]
    TopicCountMax(usize),
    #[error("total partition count would exceed {0}")]
    PartitionCountMax(usize),
    #[error("unknown partition {topic_id}/{partition}")]
    UnknownPartition {
        topic_id: TopicId,
        partition: PartitionIndex,
    },
    #[error("broker {got} is not the leader (leader is {current:?})")]
    NotLeader {
        current: Option<BrokerId>,
        got: BrokerId,
    },
    #[error("leader epoch {got} is not the current {current}")]
    StaleLeaderEpoch {
        current: LeaderEpoch,
        got: LeaderEpoch,
    },
    #[error("partition epoch {got} is not the current {current}")]
    StalePartitionEpoch {
        current: PartitionEpoch,
        got: PartitionEpoch,
    },
    #[error("new ISR does not include the leader {0}")]
    IsrMissingLeader(BrokerId),
    #[error("new ISR member {0} is not a replica")]
    IsrNotReplica(BrokerId),
    #[error("new ISR member {0} is fenced or unknown")]
    IsrIneligible(BrokerId),
    #[error("new ISR lists broker {0} twice")]
    IsrDuplicate(BrokerId),
    #[error("producer ids are exhausted")]
    ProducerIdsExhausted,
    #[error(
        "ISR member {broker_id} fetched at broker epoch {got}; its current epoch is {current}"
    )]
    IsrStaleBrokerEpoch {
        broker_id: BrokerId,
        current: BrokerEpoch,
        got: BrokerEpoch,
    },
}
