//! The broker-facing controller API as the controller's own types: what
//! `wire.rs` decodes requests into and encodes responses from. No flatbuffers
//! and no I/O here; `service.rs` gives these their meaning.

use std::collections::BTreeMap;

use crate::ErrorCode;

use super::records::{BrokerEndpoints, MetadataImage, TopicRecord, VersionedDelta};
use crate::ids::{
    BrokerEpoch, BrokerId, LeaderEpoch, MetadataVersion, PartitionEpoch, PartitionIndex, TopicId,
};

/// Why a request failed, as it goes on the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiFailure {
    pub code: ErrorCode,
    pub message: String,
    /// With `NotController`: the leader's "host:port", when known.
    pub leader_endpoint: Option<String>,
}

impl ApiFailure {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiFailure {
        ApiFailure {
            code,
            message: message.into(),
            leader_endpoint: None,
        }
    }

    pub fn not_controller(leader_endpoint: Option<String>) -> ApiFailure {
        ApiFailure {
            code: ErrorCode::NotController,
            message: "this controller is not the leader".into(),
            leader_endpoint,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisterBroker {
    pub broker_id: BrokerId,
    pub endpoints: BrokerEndpoints,
    /// Random per broker process: the same incarnation registering again
    /// keeps its epoch.
    pub incarnation_id: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registered {
    pub broker_epoch: BrokerEpoch,
    pub session_timeout_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BrokerHeartbeat {
    pub broker_id: BrokerId,
    pub broker_epoch: BrokerEpoch,
    /// Unfence the broker if it is fenced.
    pub ready: bool,
    /// Controlled shutdown: fence the broker now.
    pub want_shutdown: bool,
}

/// A broker's session as a heartbeat reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionState {
    Alive,
    Fenced,
    /// Unknown id or an older epoch: the broker must register again.
    Unregistered,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FetchMetadata {
    pub from_version: MetadataVersion,
    pub max_wait_ms: u32,
    pub full_image: bool,
}

/// A broker as the wire shows it (no session deadline: that is the controller's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerView {
    pub id: BrokerId,
    pub epoch: BrokerEpoch,
    pub endpoints: BrokerEndpoints,
    pub fenced: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageView {
    pub metadata_version: MetadataVersion,
    pub brokers: Vec<BrokerView>,
    pub topics: Vec<TopicRecord>,
}

/// One change as the wire shows it; mirrors `Delta`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeltaView {
    BrokerRegistered(BrokerView),
    BrokerFenced(BrokerId),
    BrokerUnfenced(BrokerId),
    TopicCreated(TopicRecord),
    TopicDeleted {
        topic_id: TopicId,
        name: String,
    },
    PartitionChanged {
        topic_id: TopicId,
        partition: crate::ids::PartitionIndex,
        record: super::records::PartitionRecord,
    },
    TopicConfigChanged {
        topic_id: TopicId,
        config: BTreeMap<String, String>,
    },
}

/// What the server encodes: deltas borrowed from the state, or the whole image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetadataAnswer {
    Deltas {
        metadata_version: MetadataVersion,
        deltas: Vec<VersionedDelta>,
    },
    Image(MetadataImage),
}

/// What a client decodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetadataUpdate {
    Deltas {
        metadata_version: MetadataVersion,
        deltas: Vec<(MetadataVersion, DeltaView)>,
    },
    Image(ImageView),
}

/// A leader's compare-and-set ISR change (see `Command::AlterIsr`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlterIsr {
    pub leader_id: BrokerId,
    pub topic_id: TopicId,
    pub partition: PartitionIndex,
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: PartitionEpoch,
    pub new_isr: Vec<BrokerId>,
    /// The broker epoch the leader saw each member of `new_isr` fetch with,
    /// in the same order; empty when the sender does not know them.
    pub new_isr_epochs: Vec<BrokerEpoch>,
}

/// A broker asks for the next block of producer ids (see
/// `Command::AllocateProducerIds`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocateProducerIds {
    pub broker_id: BrokerId,
    pub broker_epoch: BrokerEpoch,
}

/// Producer ids `[first, first + count)`, for one broker alone to hand out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProducerIdBlock {
    pub first: i64,
    pub count: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateTopicSpec {
    pub name: String,
    pub partition_count: u32,
    pub replication_factor: u16,
    pub config: BTreeMap<String, String>,
}

/// What AlterTopicConfigs asks for one topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlterTopicConfigSpec {
    pub name: String,
    /// Keys to set, replacing their values.
    pub set: BTreeMap<String, String>,
    /// Keys to remove (the broker default applies again).
    pub remove: Vec<String>,
}

/// The result for one topic of CreateTopics or DeleteTopics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicOutcome {
    pub name: String,
    pub result: Result<(), ApiFailure>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerDescription {
    pub id: u64,
    pub endpoint: String,
    pub is_leader: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerDescription {
    pub broker: BrokerView,
    pub partitions_led: u32,
}

/// One controller's view of the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterDescription {
    pub node_id: u64,
    pub leader_id: Option<u64>,
    pub leader_endpoint: Option<String>,
    pub raft_term: u64,
    pub metadata_version: MetadataVersion,
    pub controllers: Vec<ControllerDescription>,
    pub brokers: Vec<BrokerDescription>,
}
