//! The flatbuffers codec of the controller API (protocol/schema/controller.fbs,
//! and admin.fbs for CreateTopics/DeleteTopics): request and response bodies to
//! and from the types in `messages`. One module per API family (`session`:
//! RegisterBroker and BrokerHeartbeat; `metadata`: FetchMetadata; `isr`:
//! AlterIsr; `describe`: DescribeCluster; `topics`: CreateTopics and
//! DeleteTopics), each API behind the `ControllerApi` trait (`api`); this
//! module holds the errors, bounds and the records they share. Both directions live here so the controller, a broker's controller
//! link and the tools share one codec. Pure: no I/O. Decoders verify the
//! flatbuffer and bound every count before building values.

mod api;
mod describe;
mod isr;
mod metadata;
mod producer_ids;
mod session;
mod topics;

pub use api::*;
pub use describe::*;
pub use isr::*;
pub use metadata::*;
pub use producer_ids::*;
pub use session::*;
pub use topics::*;

use std::collections::BTreeMap;

use flatbuffers::{FlatBufferBuilder, InvalidFlatbuffer, WIPOffset};

use crate::{wire, ErrorCode};

use super::messages::{
    AllocateProducerIds, AlterIsr, AlterTopicConfigSpec, ApiFailure, BrokerDescription,
    BrokerHeartbeat, BrokerView, ClusterDescription, ControllerDescription, CreateTopicSpec,
    DeltaView, FetchMetadata, ImageView, MetadataAnswer, MetadataUpdate, ProducerIdBlock,
    RegisterBroker, Registered, SessionState, TopicOutcome,
};
use super::records::{
    BrokerEndpoints, BrokerRecord, Delta, MetadataImage, PartitionRecord, Replica, TopicRecord,
    VersionedDelta,
};
use crate::ids::{
    BrokerEpoch, BrokerId, LeaderEpoch, MetadataVersion, PartitionEpoch, PartitionIndex,
    ShardIndex, TopicId,
};

/// Bound on the topics named in one CreateTopics, DeleteTopics or
/// AlterTopicConfigs request.
pub const TOPICS_PER_REQUEST_MAX: usize = 1_000;
/// Bound on the keys one AlterTopicConfigs entry removes.
pub const CONFIG_KEYS_PER_TOPIC_MAX: usize = 1_000;

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("invalid flatbuffer: {0}")]
    Invalid(#[from] InvalidFlatbuffer),
    #[error("missing field {0}")]
    Missing(&'static str),
    #[error("field {field} out of range: {value}")]
    OutOfRange { field: &'static str, value: i64 },
    #[error("{field} has {count} entries, at most {count_max}")]
    TooMany {
        field: &'static str,
        count: usize,
        count_max: usize,
    },
}

pub(super) type Fbb<'a> = FlatBufferBuilder<'a>;

pub(super) fn finish<T>(mut fbb: Fbb<'_>, root: WIPOffset<T>) -> Vec<u8> {
    fbb.finish(root, None);
    fbb.finished_data().to_vec()
}

pub(super) fn opt_str<'a>(fbb: &mut Fbb<'a>, s: Option<&str>) -> Option<WIPOffset<&'a str>> {
    s.map(|s| fbb.create_string(s))
}

/// The error triple every controller response carries.
pub(super) struct ErrorFields<'a> {
    pub(super) code: u16,
    pub(super) message: Option<WIPOffset<&'a str>>,
    pub(super) leader_endpoint: Option<WIPOffset<&'a str>>,
}

pub(super) fn error_fields<'a, T>(
    fbb: &mut Fbb<'a>,
    result: &Result<T, ApiFailure>,
) -> ErrorFields<'a> {
    match result {
        Ok(_) => ErrorFields {
            code: ErrorCode::None.code(),
            message: None,
            leader_endpoint: None,
        },
        Err(failure) => ErrorFields {
            code: failure.code.code(),
            message: Some(fbb.create_string(&failure.message)),
            leader_endpoint: opt_str(fbb, failure.leader_endpoint.as_deref()),
        },
    }
}

pub(super) fn failure(
    code: u16,
    message: Option<&str>,
    leader_endpoint: Option<&str>,
) -> Option<ApiFailure> {
    let code = ErrorCode::from_u16(code);
    if code.is_ok() {
        return None;
    }
    Some(ApiFailure {
        code,
        message: message.unwrap_or_default().to_owned(),
        leader_endpoint: leader_endpoint.filter(|e| !e.is_empty()).map(str::to_owned),
    })
}

/// Brokers named in one AlterIsr: no replica set is larger.
pub const ISR_ENTRIES_MAX: usize = 1024;

pub(super) fn bounded(
    field: &'static str,
    count: usize,
    count_max: usize,
) -> Result<(), WireError> {
    if count > count_max {
        return Err(WireError::TooMany {
            field,
            count,
            count_max,
        });
    }
    Ok(())
}

// The records several APIs carry.

pub(super) fn encode_endpoints<'a>(
    fbb: &mut Fbb<'a>,
    endpoints: &BrokerEndpoints,
) -> WIPOffset<wire::BrokerEndpointSet<'a>> {
    let client = fbb.create_string(&endpoints.client);
    let shards: Vec<_> = endpoints
        .shards
        .iter()
        .map(|s| fbb.create_string(s))
        .collect();
    let shards = fbb.create_vector(&shards);
    wire::BrokerEndpointSet::create(
        fbb,
        &wire::BrokerEndpointSetArgs {
            client: Some(client),
            shards: Some(shards),
        },
    )
}

pub(super) fn decode_endpoints(
    e: Option<wire::BrokerEndpointSet<'_>>,
) -> Result<BrokerEndpoints, WireError> {
    let e = e.ok_or(WireError::Missing("endpoints"))?;
    Ok(BrokerEndpoints {
        client: e.client().ok_or(WireError::Missing("client"))?.to_owned(),
        shards: e
            .shards()
            .map(|v| v.iter().map(str::to_owned).collect())
            .unwrap_or_default(),
    })
}

pub(super) fn encode_broker<'a>(
    fbb: &mut Fbb<'a>,
    b: &BrokerView,
) -> WIPOffset<wire::ControllerBroker<'a>> {
    let endpoints = encode_endpoints(fbb, &b.endpoints);
    wire::ControllerBroker::create(
        fbb,
        &wire::ControllerBrokerArgs {
            id: b.id.0,
            epoch: b.epoch.0,
            endpoints: Some(endpoints),
            fenced: b.fenced,
        },
    )
}

pub(super) fn decode_broker(
    b: Option<wire::ControllerBroker<'_>>,
) -> Result<BrokerView, WireError> {
    let b = b.ok_or(WireError::Missing("broker"))?;
    Ok(BrokerView {
        id: BrokerId(b.id()),
        epoch: BrokerEpoch(b.epoch()),
        endpoints: decode_endpoints(b.endpoints())?,
        fenced: b.fenced(),
    })
}

pub fn broker_view(record: &BrokerRecord) -> BrokerView {
    BrokerView {
        id: record.id,
        epoch: record.epoch,
        endpoints: record.endpoints.clone(),
        fenced: record.fenced,
    }
}

pub(super) fn encode_partition<'a>(
    fbb: &mut Fbb<'a>,
    index: PartitionIndex,
    p: &PartitionRecord,
) -> WIPOffset<wire::ControllerPartition<'a>> {
    let replicas: Vec<_> = p
        .replicas
        .iter()
        .map(|r| wire::ReplicaPlacement::new(r.broker_id.0, r.shard.0))
        .collect();
    let replicas = fbb.create_vector(&replicas);
    let isr: Vec<u32> = p.isr.iter().map(|b| b.0).collect();
    let isr = fbb.create_vector(&isr);
    wire::ControllerPartition::create(
        fbb,
        &wire::ControllerPartitionArgs {
            partition: index.0,
            replicas: Some(replicas),
            isr: Some(isr),
            leader: p.leader.map_or(-1, |b| i64::from(b.0)),
            leader_epoch: p.leader_epoch.0,
            partition_epoch: p.partition_epoch.0,
        },
    )
}

pub(super) fn decode_partition(
    p: Option<wire::ControllerPartition<'_>>,
) -> Result<(PartitionIndex, PartitionRecord), WireError> {
    let p = p.ok_or(WireError::Missing("partition"))?;
    let leader = match p.leader() {
        -1 => None,
        id => Some(BrokerId(u32::try_from(id).map_err(|_| {
            WireError::OutOfRange {
                field: "leader",
                value: id,
            }
        })?)),
    };
    let record = PartitionRecord {
        replicas: p
            .replicas()
            .map(|v| {
                v.iter()
                    .map(|r| Replica {
                        broker_id: BrokerId(r.broker_id()),
                        shard: ShardIndex(r.shard()),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        isr: p
            .isr()
            .map(|v| v.iter().map(BrokerId).collect())
            .unwrap_or_default(),
        leader,
        leader_epoch: LeaderEpoch(p.leader_epoch()),
        partition_epoch: PartitionEpoch(p.partition_epoch()),
    };
    Ok((PartitionIndex(p.partition()), record))
}

pub(super) fn encode_configs<'a>(
    fbb: &mut Fbb<'a>,
    config: &BTreeMap<String, String>,
) -> WIPOffset<flatbuffers::Vector<'a, flatbuffers::ForwardsUOffset<wire::ConfigEntry<'a>>>> {
    let entries: Vec<_> = config
        .iter()
        .map(|(k, v)| {
            let key = fbb.create_string(k);
            let value = fbb.create_string(v);
            wire::ConfigEntry::create(
                fbb,
                &wire::ConfigEntryArgs {
                    key: Some(key),
                    value: Some(value),
                },
            )
        })
        .collect();
    fbb.create_vector(&entries)
}

pub(super) fn decode_configs<'a>(
    configs: Option<flatbuffers::Vector<'a, flatbuffers::ForwardsUOffset<wire::ConfigEntry<'a>>>>,
) -> Result<BTreeMap<String, String>, WireError> {
    let mut config = BTreeMap::new();
    for entry in configs.iter().flatten() {
        let key = entry.key().ok_or(WireError::Missing("config key"))?;
        let value = entry.value().ok_or(WireError::Missing("config value"))?;
        config.insert(key.to_owned(), value.to_owned());
    }
    Ok(config)
}

pub(super) fn encode_topic<'a>(
    fbb: &mut Fbb<'a>,
    t: &TopicRecord,
) -> WIPOffset<wire::ControllerTopic<'a>> {
    let name = fbb.create_string(&t.name);
    let configs = encode_configs(fbb, &t.config);
    let partitions: Vec<_> = t
        .partitions
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let index = PartitionIndex(u32::try_from(i).expect("partition count fits u32"));
            encode_partition(fbb, index, p)
        })
        .collect();
    let partitions = fbb.create_vector(&partitions);
    wire::ControllerTopic::create(
        fbb,
        &wire::ControllerTopicArgs {
            id: t.id.0,
            name: Some(name),
            replication_factor: t.replication_factor,
            configs: Some(configs),
            partitions: Some(partitions),
        },
    )
}

pub(super) fn decode_topic(t: Option<wire::ControllerTopic<'_>>) -> Result<TopicRecord, WireError> {
    let t = t.ok_or(WireError::Missing("topic"))?;
    let mut partitions = Vec::new();
    for (i, p) in t.partitions().iter().flatten().enumerate() {
        let (index, record) = decode_partition(Some(p))?;
        if index.0 as usize != i {
            return Err(WireError::OutOfRange {
                field: "partition",
                value: i64::from(index.0),
            });
        }
        partitions.push(record);
    }
    Ok(TopicRecord {
        id: TopicId(t.id()),
        name: t.name().ok_or(WireError::Missing("name"))?.to_owned(),
        replication_factor: t.replication_factor(),
        config: decode_configs(t.configs())?,
        partitions,
    })
}

pub(super) fn encode_image<'a>(
    fbb: &mut Fbb<'a>,
    image: &MetadataImage,
) -> WIPOffset<wire::ControllerMetadataImage<'a>> {
    let brokers: Vec<_> = image
        .brokers
        .iter()
        .map(|b| encode_broker(fbb, &broker_view(b)))
        .collect();
    let brokers = fbb.create_vector(&brokers);
    let topics: Vec<_> = image.topics.iter().map(|t| encode_topic(fbb, t)).collect();
    let topics = fbb.create_vector(&topics);
    wire::ControllerMetadataImage::create(
        fbb,
        &wire::ControllerMetadataImageArgs {
            metadata_version: image.metadata_version.0,
            brokers: Some(brokers),
            topics: Some(topics),
        },
    )
}

pub(super) fn decode_image(
    image: wire::ControllerMetadataImage<'_>,
) -> Result<ImageView, WireError> {
    Ok(ImageView {
        metadata_version: MetadataVersion(image.metadata_version()),
        brokers: image
            .brokers()
            .iter()
            .flatten()
            .map(|b| decode_broker(Some(b)))
            .collect::<Result<_, _>>()?,
        topics: image
            .topics()
            .iter()
            .flatten()
            .map(|t| decode_topic(Some(t)))
            .collect::<Result<_, _>>()?,
    })
}

pub(super) fn encode_delta<'a>(
    fbb: &mut Fbb<'a>,
    d: &VersionedDelta,
) -> WIPOffset<wire::MetadataDelta<'a>> {
    use wire::MetadataDeltaBody as Body;
    let (body_type, body) = match &d.delta {
        Delta::BrokerRegistered(record) => {
            let broker = encode_broker(fbb, &broker_view(record));
            let args = wire::BrokerRegisteredDeltaArgs {
                broker: Some(broker),
            };
            let body = wire::BrokerRegisteredDelta::create(fbb, &args);
            (Body::BrokerRegisteredDelta, body.as_union_value())
        }
        Delta::BrokerFenced(id) => {
            let args = wire::BrokerFencedDeltaArgs { broker_id: id.0 };
            let body = wire::BrokerFencedDelta::create(fbb, &args);
            (Body::BrokerFencedDelta, body.as_union_value())
        }
        Delta::BrokerUnfenced(id) => {
            let args = wire::BrokerUnfencedDeltaArgs { broker_id: id.0 };
            let body = wire::BrokerUnfencedDelta::create(fbb, &args);
            (Body::BrokerUnfencedDelta, body.as_union_value())
        }
        Delta::TopicCreated(topic) => {
            let topic = encode_topic(fbb, topic);
            let args = wire::TopicCreatedDeltaArgs { topic: Some(topic) };
            let body = wire::TopicCreatedDelta::create(fbb, &args);
            (Body::TopicCreatedDelta, body.as_union_value())
        }
        Delta::TopicDeleted { topic_id, name } => {
            let name = fbb.create_string(name);
            let args = wire::TopicDeletedDeltaArgs {
                topic_id: topic_id.0,
                name: Some(name),
            };
            let body = wire::TopicDeletedDelta::create(fbb, &args);
            (Body::TopicDeletedDelta, body.as_union_value())
        }
        Delta::PartitionChanged {
            topic_id,
            partition,
            record,
        } => {
            let partition = encode_partition(fbb, *partition, record);
            let args = wire::PartitionChangedDeltaArgs {
                topic_id: topic_id.0,
                partition: Some(partition),
            };
            let body = wire::PartitionChangedDelta::create(fbb, &args);
            (Body::PartitionChangedDelta, body.as_union_value())
        }
        Delta::TopicConfigChanged { topic_id, config } => {
            let configs = encode_configs(fbb, config);
            let args = wire::TopicConfigChangedDeltaArgs {
                topic_id: topic_id.0,
                configs: Some(configs),
            };
            let body = wire::TopicConfigChangedDelta::create(fbb, &args);
            (Body::TopicConfigChangedDelta, body.as_union_value())
        }
    };
    wire::MetadataDelta::create(
        fbb,
        &wire::MetadataDeltaArgs {
            version: d.version.0,
            body_type,
            body: Some(body),
        },
    )
}

pub(super) fn decode_delta(
    d: wire::MetadataDelta<'_>,
) -> Result<(MetadataVersion, DeltaView), WireError> {
    let missing = WireError::Missing("delta body");
    let view = if let Some(b) = d.body_as_broker_registered_delta() {
        DeltaView::BrokerRegistered(decode_broker(b.broker())?)
    } else if let Some(b) = d.body_as_broker_fenced_delta() {
        DeltaView::BrokerFenced(BrokerId(b.broker_id()))
    } else if let Some(b) = d.body_as_broker_unfenced_delta() {
        DeltaView::BrokerUnfenced(BrokerId(b.broker_id()))
    } else if let Some(t) = d.body_as_topic_created_delta() {
        DeltaView::TopicCreated(decode_topic(t.topic())?)
    } else if let Some(t) = d.body_as_topic_deleted_delta() {
        DeltaView::TopicDeleted {
            topic_id: TopicId(t.topic_id()),
            name: t.name().ok_or(WireError::Missing("name"))?.to_owned(),
        }
    } else if let Some(p) = d.body_as_partition_changed_delta() {
        let (partition, record) = decode_partition(p.partition())?;
        DeltaView::PartitionChanged {
            topic_id: TopicId(p.topic_id()),
            partition,
            record,
        }
    } else if let Some(c) = d.body_as_topic_config_changed_delta() {
        DeltaView::TopicConfigChanged {
            topic_id: TopicId(c.topic_id()),
            config: decode_configs(c.configs())?,
        }
    } else {
        return Err(missing);
    };
    Ok((MetadataVersion(d.version()), view))
}
