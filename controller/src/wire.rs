//! The flatbuffers codec of the controller API (protocol/schema/controller.fbs,
//! and admin.fbs for CreateTopics/DeleteTopics): request and response bodies to
//! and from the types in `messages.rs`. Both directions live here so the server,
//! the tests and a broker's controller client share one codec. Pure: no I/O.
//! Decoders verify the flatbuffer and bound every count before building values.

use std::collections::BTreeMap;

use protocol::flatbuffers::{self, FlatBufferBuilder, InvalidFlatbuffer, WIPOffset};
use protocol::{wire, ErrorCode};

use crate::delta::{Delta, VersionedDelta};
use crate::ids::{
    BrokerEpoch, BrokerId, LeaderEpoch, MetadataVersion, PartitionEpoch, PartitionIndex,
    ShardIndex, TopicId,
};
use crate::messages::{
    AlterIsr, ApiFailure, BrokerDescription, BrokerHeartbeat, BrokerView, ClusterDescription,
    ControllerDescription, CreateTopicSpec, DeltaView, FetchMetadata, ImageView, MetadataAnswer,
    MetadataUpdate, RegisterBroker, Registered, SessionState, TopicOutcome,
};
use crate::records::{BrokerEndpoints, BrokerRecord, PartitionRecord, Replica, TopicRecord};
use crate::state::MetadataImage;

/// Bound on the topics named in one CreateTopics or DeleteTopics request.
pub const TOPICS_PER_REQUEST_MAX: usize = 1_000;

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

type Fbb<'a> = FlatBufferBuilder<'a>;

fn finish<T>(mut fbb: Fbb<'_>, root: WIPOffset<T>) -> Vec<u8> {
    fbb.finish(root, None);
    fbb.finished_data().to_vec()
}

fn opt_str<'a>(fbb: &mut Fbb<'a>, s: Option<&str>) -> Option<WIPOffset<&'a str>> {
    s.map(|s| fbb.create_string(s))
}

/// The error triple every controller response carries.
struct ErrorFields<'a> {
    code: u16,
    message: Option<WIPOffset<&'a str>>,
    leader_endpoint: Option<WIPOffset<&'a str>>,
}

fn error_fields<'a, T>(fbb: &mut Fbb<'a>, result: &Result<T, ApiFailure>) -> ErrorFields<'a> {
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

fn failure(code: u16, message: Option<&str>, leader_endpoint: Option<&str>) -> Option<ApiFailure> {
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

fn bounded(field: &'static str, count: usize, count_max: usize) -> Result<(), WireError> {
    if count > count_max {
        return Err(WireError::TooMany {
            field,
            count,
            count_max,
        });
    }
    Ok(())
}

// ---- shared records -------------------------------------------------------

fn encode_endpoints<'a>(
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

fn decode_endpoints(e: Option<wire::BrokerEndpointSet<'_>>) -> Result<BrokerEndpoints, WireError> {
    let e = e.ok_or(WireError::Missing("endpoints"))?;
    Ok(BrokerEndpoints {
        client: e.client().ok_or(WireError::Missing("client"))?.to_owned(),
        shards: e
            .shards()
            .map(|v| v.iter().map(str::to_owned).collect())
            .unwrap_or_default(),
    })
}

fn encode_broker<'a>(fbb: &mut Fbb<'a>, b: &BrokerView) -> WIPOffset<wire::ControllerBroker<'a>> {
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

fn decode_broker(b: Option<wire::ControllerBroker<'_>>) -> Result<BrokerView, WireError> {
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

fn encode_partition<'a>(
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

fn decode_partition(
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

fn encode_configs<'a>(
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

fn decode_configs<'a>(
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

fn encode_topic<'a>(fbb: &mut Fbb<'a>, t: &TopicRecord) -> WIPOffset<wire::ControllerTopic<'a>> {
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

fn decode_topic(t: Option<wire::ControllerTopic<'_>>) -> Result<TopicRecord, WireError> {
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

fn encode_image<'a>(
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

fn decode_image(image: wire::ControllerMetadataImage<'_>) -> Result<ImageView, WireError> {
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

fn encode_delta<'a>(fbb: &mut Fbb<'a>, d: &VersionedDelta) -> WIPOffset<wire::MetadataDelta<'a>> {
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

fn decode_delta(d: wire::MetadataDelta<'_>) -> Result<(MetadataVersion, DeltaView), WireError> {
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
    } else {
        return Err(missing);
    };
    Ok((MetadataVersion(d.version()), view))
}

// ---- RegisterBroker -------------------------------------------------------

pub fn encode_register_broker_request(request: &RegisterBroker) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let endpoints = encode_endpoints(&mut fbb, &request.endpoints);
    let root = wire::RegisterBrokerRequest::create(
        &mut fbb,
        &wire::RegisterBrokerRequestArgs {
            broker_id: request.broker_id.0,
            endpoints: Some(endpoints),
            incarnation_id: request.incarnation_id,
        },
    );
    finish(fbb, root)
}

pub fn decode_register_broker_request(body: &[u8]) -> Result<RegisterBroker, WireError> {
    let r = flatbuffers::root::<wire::RegisterBrokerRequest>(body)?;
    Ok(RegisterBroker {
        broker_id: BrokerId(r.broker_id()),
        endpoints: decode_endpoints(r.endpoints())?,
        incarnation_id: r.incarnation_id(),
    })
}

pub fn encode_register_broker_response(result: &Result<Registered, ApiFailure>) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let e = error_fields(&mut fbb, result);
    let ok = result.as_ref().ok();
    let root = wire::RegisterBrokerResponse::create(
        &mut fbb,
        &wire::RegisterBrokerResponseArgs {
            error_code: e.code,
            error_message: e.message,
            leader_endpoint: e.leader_endpoint,
            broker_epoch: ok.map_or(0, |r| r.broker_epoch.0),
            session_timeout_ms: ok.map_or(0, |r| r.session_timeout_ms),
        },
    );
    finish(fbb, root)
}

pub fn decode_register_broker_response(
    body: &[u8],
) -> Result<Result<Registered, ApiFailure>, WireError> {
    let r = flatbuffers::root::<wire::RegisterBrokerResponse>(body)?;
    if let Some(f) = failure(r.error_code(), r.error_message(), r.leader_endpoint()) {
        return Ok(Err(f));
    }
    Ok(Ok(Registered {
        broker_epoch: BrokerEpoch(r.broker_epoch()),
        session_timeout_ms: r.session_timeout_ms(),
    }))
}

// ---- BrokerHeartbeat ------------------------------------------------------

pub fn encode_broker_heartbeat_request(request: &BrokerHeartbeat) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let root = wire::BrokerHeartbeatRequest::create(
        &mut fbb,
        &wire::BrokerHeartbeatRequestArgs {
            broker_id: request.broker_id.0,
            broker_epoch: request.broker_epoch.0,
            ready: request.ready,
            want_shutdown: request.want_shutdown,
        },
    );
    finish(fbb, root)
}

pub fn decode_broker_heartbeat_request(body: &[u8]) -> Result<BrokerHeartbeat, WireError> {
    let r = flatbuffers::root::<wire::BrokerHeartbeatRequest>(body)?;
    Ok(BrokerHeartbeat {
        broker_id: BrokerId(r.broker_id()),
        broker_epoch: BrokerEpoch(r.broker_epoch()),
        ready: r.ready(),
        want_shutdown: r.want_shutdown(),
    })
}

pub fn encode_broker_heartbeat_response(result: &Result<SessionState, ApiFailure>) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let e = error_fields(&mut fbb, result);
    let state = match result {
        Ok(SessionState::Alive) => wire::BrokerSessionState::Alive,
        Ok(SessionState::Fenced) => wire::BrokerSessionState::Fenced,
        Ok(SessionState::Unregistered) | Err(_) => wire::BrokerSessionState::Unregistered,
    };
    let root = wire::BrokerHeartbeatResponse::create(
        &mut fbb,
        &wire::BrokerHeartbeatResponseArgs {
            error_code: e.code,
            error_message: e.message,
            leader_endpoint: e.leader_endpoint,
            state,
        },
    );
    finish(fbb, root)
}

pub fn decode_broker_heartbeat_response(
    body: &[u8],
) -> Result<Result<SessionState, ApiFailure>, WireError> {
    let r = flatbuffers::root::<wire::BrokerHeartbeatResponse>(body)?;
    if let Some(f) = failure(r.error_code(), r.error_message(), r.leader_endpoint()) {
        return Ok(Err(f));
    }
    Ok(Ok(match r.state() {
        wire::BrokerSessionState::Alive => SessionState::Alive,
        wire::BrokerSessionState::Fenced => SessionState::Fenced,
        _ => SessionState::Unregistered,
    }))
}

// ---- FetchMetadata --------------------------------------------------------

pub fn encode_fetch_metadata_request(request: &FetchMetadata) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let root = wire::FetchMetadataRequest::create(
        &mut fbb,
        &wire::FetchMetadataRequestArgs {
            from_version: request.from_version.0,
            max_wait_ms: request.max_wait_ms,
            full_image: request.full_image,
        },
    );
    finish(fbb, root)
}

pub fn decode_fetch_metadata_request(body: &[u8]) -> Result<FetchMetadata, WireError> {
    let r = flatbuffers::root::<wire::FetchMetadataRequest>(body)?;
    Ok(FetchMetadata {
        from_version: MetadataVersion(r.from_version()),
        max_wait_ms: r.max_wait_ms(),
        full_image: r.full_image(),
    })
}

pub fn encode_fetch_metadata_response(result: &Result<MetadataAnswer, ApiFailure>) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let e = error_fields(&mut fbb, result);
    let mut args = wire::FetchMetadataResponseArgs {
        error_code: e.code,
        error_message: e.message,
        leader_endpoint: e.leader_endpoint,
        ..Default::default()
    };
    match result {
        Ok(MetadataAnswer::Deltas {
            metadata_version,
            deltas,
        }) => {
            let deltas: Vec<_> = deltas.iter().map(|d| encode_delta(&mut fbb, d)).collect();
            args.deltas = Some(fbb.create_vector(&deltas));
            args.metadata_version = metadata_version.0;
        }
        Ok(MetadataAnswer::Image(image)) => {
            args.image = Some(encode_image(&mut fbb, image));
            args.metadata_version = image.metadata_version.0;
        }
        Err(_) => {}
    }
    let root = wire::FetchMetadataResponse::create(&mut fbb, &args);
    finish(fbb, root)
}

/// Large images are legitimate here, so the verifier's table bound is raised
/// from flatbuffers' default; the frame bound still limits the bytes.
fn verifier_options() -> flatbuffers::VerifierOptions {
    flatbuffers::VerifierOptions {
        max_tables: 100_000_000,
        ..Default::default()
    }
}

pub fn decode_fetch_metadata_response(
    body: &[u8],
) -> Result<Result<MetadataUpdate, ApiFailure>, WireError> {
    let r = flatbuffers::root_with_opts::<wire::FetchMetadataResponse>(&verifier_options(), body)?;
    if let Some(f) = failure(r.error_code(), r.error_message(), r.leader_endpoint()) {
        return Ok(Err(f));
    }
    if let Some(image) = r.image() {
        return Ok(Ok(MetadataUpdate::Image(decode_image(image)?)));
    }
    let deltas = r
        .deltas()
        .iter()
        .flatten()
        .map(decode_delta)
        .collect::<Result<_, _>>()?;
    Ok(Ok(MetadataUpdate::Deltas {
        metadata_version: MetadataVersion(r.metadata_version()),
        deltas,
    }))
}

// ---- AlterIsr -------------------------------------------------------------

pub fn encode_alter_isr_request(request: &AlterIsr) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let isr: Vec<u32> = request.new_isr.iter().map(|b| b.0).collect();
    let new_isr = fbb.create_vector(&isr);
    let epochs: Vec<u64> = request.new_isr_epochs.iter().map(|e| e.0).collect();
    let new_isr_epochs = fbb.create_vector(&epochs);
    let root = wire::AlterIsrRequest::create(
        &mut fbb,
        &wire::AlterIsrRequestArgs {
            leader_id: request.leader_id.0,
            topic_id: request.topic_id.0,
            partition: request.partition.0,
            leader_epoch: request.leader_epoch.0,
            partition_epoch: request.partition_epoch.0,
            new_isr: Some(new_isr),
            new_isr_epochs: Some(new_isr_epochs),
        },
    );
    finish(fbb, root)
}

pub fn decode_alter_isr_request(body: &[u8]) -> Result<AlterIsr, WireError> {
    let r = flatbuffers::root::<wire::AlterIsrRequest>(body)?;
    let isr = r.new_isr().ok_or(WireError::Missing("new_isr"))?;
    bounded("new_isr", isr.len(), ISR_ENTRIES_MAX)?;
    let epochs: Vec<BrokerEpoch> = r
        .new_isr_epochs()
        .map(|e| e.iter().map(BrokerEpoch).collect())
        .unwrap_or_default();
    if !epochs.is_empty() && epochs.len() != isr.len() {
        return Err(WireError::OutOfRange {
            field: "new_isr_epochs",
            value: epochs.len() as i64,
        });
    }
    Ok(AlterIsr {
        leader_id: BrokerId(r.leader_id()),
        topic_id: TopicId(r.topic_id()),
        partition: PartitionIndex(r.partition()),
        leader_epoch: LeaderEpoch(r.leader_epoch()),
        partition_epoch: PartitionEpoch(r.partition_epoch()),
        new_isr: isr.iter().map(BrokerId).collect(),
        new_isr_epochs: epochs,
    })
}

pub fn encode_alter_isr_response(
    result: &Result<(PartitionIndex, PartitionRecord), ApiFailure>,
) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let e = error_fields(&mut fbb, result);
    let partition = result
        .as_ref()
        .ok()
        .map(|(index, record)| encode_partition(&mut fbb, *index, record));
    let root = wire::AlterIsrResponse::create(
        &mut fbb,
        &wire::AlterIsrResponseArgs {
            error_code: e.code,
            error_message: e.message,
            leader_endpoint: e.leader_endpoint,
            partition,
        },
    );
    finish(fbb, root)
}

pub fn decode_alter_isr_response(
    body: &[u8],
) -> Result<Result<(PartitionIndex, PartitionRecord), ApiFailure>, WireError> {
    let r = flatbuffers::root::<wire::AlterIsrResponse>(body)?;
    if let Some(f) = failure(r.error_code(), r.error_message(), r.leader_endpoint()) {
        return Ok(Err(f));
    }
    Ok(Ok(decode_partition(r.partition())?))
}

// ---- DescribeCluster ------------------------------------------------------

pub fn encode_describe_cluster_request() -> Vec<u8> {
    let mut fbb = Fbb::new();
    let root = wire::DescribeClusterRequest::create(&mut fbb, &wire::DescribeClusterRequestArgs {});
    finish(fbb, root)
}

pub fn decode_describe_cluster_request(body: &[u8]) -> Result<(), WireError> {
    flatbuffers::root::<wire::DescribeClusterRequest>(body)?;
    Ok(())
}

pub fn encode_describe_cluster_response(c: &ClusterDescription) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let controllers: Vec<_> = c
        .controllers
        .iter()
        .map(|n| {
            let endpoint = fbb.create_string(&n.endpoint);
            wire::ControllerNode::create(
                &mut fbb,
                &wire::ControllerNodeArgs {
                    id: n.id,
                    endpoint: Some(endpoint),
                    is_leader: n.is_leader,
                },
            )
        })
        .collect();
    let controllers = fbb.create_vector(&controllers);
    let brokers: Vec<_> = c
        .brokers
        .iter()
        .map(|b| {
            let endpoints = encode_endpoints(&mut fbb, &b.broker.endpoints);
            wire::ClusterBroker::create(
                &mut fbb,
                &wire::ClusterBrokerArgs {
                    id: b.broker.id.0,
                    epoch: b.broker.epoch.0,
                    endpoints: Some(endpoints),
                    fenced: b.broker.fenced,
                    partitions_led: b.partitions_led,
                },
            )
        })
        .collect();
    let brokers = fbb.create_vector(&brokers);
    let leader_endpoint = opt_str(&mut fbb, c.leader_endpoint.as_deref());
    let root = wire::DescribeClusterResponse::create(
        &mut fbb,
        &wire::DescribeClusterResponseArgs {
            error_code: ErrorCode::None.code(),
            error_message: None,
            node_id: c.node_id,
            leader_id: c
                .leader_id
                .map_or(-1, |id| i64::try_from(id).expect("node id fits i64")),
            leader_endpoint,
            raft_term: c.raft_term,
            metadata_version: c.metadata_version.0,
            controllers: Some(controllers),
            brokers: Some(brokers),
        },
    );
    finish(fbb, root)
}

pub fn decode_describe_cluster_response(
    body: &[u8],
) -> Result<Result<ClusterDescription, ApiFailure>, WireError> {
    let r = flatbuffers::root::<wire::DescribeClusterResponse>(body)?;
    if let Some(f) = failure(r.error_code(), r.error_message(), r.leader_endpoint()) {
        return Ok(Err(f));
    }
    let controllers = r
        .controllers()
        .iter()
        .flatten()
        .map(|n| ControllerDescription {
            id: n.id(),
            endpoint: n.endpoint().unwrap_or_default().to_owned(),
            is_leader: n.is_leader(),
        })
        .collect();
    let mut brokers = Vec::new();
    for b in r.brokers().iter().flatten() {
        brokers.push(BrokerDescription {
            broker: BrokerView {
                id: BrokerId(b.id()),
                epoch: BrokerEpoch(b.epoch()),
                endpoints: decode_endpoints(b.endpoints())?,
                fenced: b.fenced(),
            },
            partitions_led: b.partitions_led(),
        });
    }
    Ok(Ok(ClusterDescription {
        node_id: r.node_id(),
        leader_id: u64::try_from(r.leader_id()).ok(),
        leader_endpoint: r.leader_endpoint().map(str::to_owned),
        raft_term: r.raft_term(),
        metadata_version: MetadataVersion(r.metadata_version()),
        controllers,
        brokers,
    }))
}

// ---- CreateTopics / DeleteTopics (admin.fbs) ------------------------------

pub fn encode_create_topics_request(specs: &[CreateTopicSpec]) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let topics: Vec<_> = specs
        .iter()
        .map(|s| {
            let name = fbb.create_string(&s.name);
            let configs = encode_configs(&mut fbb, &s.config);
            wire::CreateTopic::create(
                &mut fbb,
                &wire::CreateTopicArgs {
                    name: Some(name),
                    partitions: i32::try_from(s.partition_count).unwrap_or(i32::MAX),
                    replication_factor: i16::try_from(s.replication_factor).unwrap_or(i16::MAX),
                    configs: Some(configs),
                },
            )
        })
        .collect();
    let topics = fbb.create_vector(&topics);
    let root = wire::CreateTopicsRequest::create(
        &mut fbb,
        &wire::CreateTopicsRequestArgs {
            topics: Some(topics),
        },
    );
    finish(fbb, root)
}

pub fn decode_create_topics_request(body: &[u8]) -> Result<Vec<CreateTopicSpec>, WireError> {
    let r = flatbuffers::root::<wire::CreateTopicsRequest>(body)?;
    let topics = r.topics().ok_or(WireError::Missing("topics"))?;
    bounded("topics", topics.len(), TOPICS_PER_REQUEST_MAX)?;
    topics
        .iter()
        .map(|t| {
            let partitions = t.partitions();
            let rf = t.replication_factor();
            Ok(CreateTopicSpec {
                name: t.name().ok_or(WireError::Missing("name"))?.to_owned(),
                partition_count: u32::try_from(partitions).map_err(|_| WireError::OutOfRange {
                    field: "partitions",
                    value: i64::from(partitions),
                })?,
                replication_factor: u16::try_from(rf).map_err(|_| WireError::OutOfRange {
                    field: "replication_factor",
                    value: i64::from(rf),
                })?,
                config: decode_configs(t.configs())?,
            })
        })
        .collect()
}

pub fn encode_delete_topics_request(names: &[String]) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let names: Vec<_> = names.iter().map(|n| fbb.create_string(n)).collect();
    let names = fbb.create_vector(&names);
    let root = wire::DeleteTopicsRequest::create(
        &mut fbb,
        &wire::DeleteTopicsRequestArgs { names: Some(names) },
    );
    finish(fbb, root)
}

pub fn decode_delete_topics_request(body: &[u8]) -> Result<Vec<String>, WireError> {
    let r = flatbuffers::root::<wire::DeleteTopicsRequest>(body)?;
    let names = r.names().ok_or(WireError::Missing("names"))?;
    bounded("names", names.len(), TOPICS_PER_REQUEST_MAX)?;
    Ok(names.iter().map(str::to_owned).collect())
}

/// A NOT_CONTROLLER result carries the leader's endpoint as its error message,
/// since admin.fbs' `TopicResult` has no field for it.
fn encode_topic_results<'a>(
    fbb: &mut Fbb<'a>,
    outcomes: &[TopicOutcome],
) -> WIPOffset<flatbuffers::Vector<'a, flatbuffers::ForwardsUOffset<wire::TopicResult<'a>>>> {
    let results: Vec<_> = outcomes
        .iter()
        .map(|o| {
            let name = fbb.create_string(&o.name);
            let (code, message) = match &o.result {
                Ok(()) => (ErrorCode::None, None),
                Err(f) if f.code == ErrorCode::NotController => {
                    (f.code, f.leader_endpoint.as_deref())
                }
                Err(f) => (f.code, Some(f.message.as_str())),
            };
            let message = opt_str(fbb, message);
            wire::TopicResult::create(
                fbb,
                &wire::TopicResultArgs {
                    name: Some(name),
                    error_code: code.code(),
                    error_message: message,
                },
            )
        })
        .collect();
    fbb.create_vector(&results)
}

fn decode_topic_results<'a>(
    results: Option<flatbuffers::Vector<'a, flatbuffers::ForwardsUOffset<wire::TopicResult<'a>>>>,
) -> Vec<TopicOutcome> {
    results
        .iter()
        .flatten()
        .map(|r| {
            let message = r.error_message();
            let result = match failure(r.error_code(), message, None) {
                None => Ok(()),
                Some(mut f) => {
                    if f.code == ErrorCode::NotController {
                        f.leader_endpoint = message.filter(|m| !m.is_empty()).map(str::to_owned);
                    }
                    Err(f)
                }
            };
            TopicOutcome {
                name: r.name().unwrap_or_default().to_owned(),
                result,
            }
        })
        .collect()
}

pub fn encode_create_topics_response(outcomes: &[TopicOutcome]) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let results = encode_topic_results(&mut fbb, outcomes);
    let root = wire::CreateTopicsResponse::create(
        &mut fbb,
        &wire::CreateTopicsResponseArgs {
            results: Some(results),
        },
    );
    finish(fbb, root)
}

pub fn decode_create_topics_response(body: &[u8]) -> Result<Vec<TopicOutcome>, WireError> {
    let r = flatbuffers::root::<wire::CreateTopicsResponse>(body)?;
    Ok(decode_topic_results(r.results()))
}

pub fn encode_delete_topics_response(outcomes: &[TopicOutcome]) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let results = encode_topic_results(&mut fbb, outcomes);
    let root = wire::DeleteTopicsResponse::create(
        &mut fbb,
        &wire::DeleteTopicsResponseArgs {
            results: Some(results),
        },
    );
    finish(fbb, root)
}

pub fn decode_delete_topics_response(body: &[u8]) -> Result<Vec<TopicOutcome>, WireError> {
    let r = flatbuffers::root::<wire::DeleteTopicsResponse>(body)?;
    Ok(decode_topic_results(r.results()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::Command;
    use crate::state::ClusterState;

    fn state() -> ClusterState {
        let mut state = ClusterState::default();
        for id in 1..=3 {
            let reply = state.apply(&Command::RegisterBroker {
                broker_id: BrokerId(id),
                endpoints: BrokerEndpoints {
                    client: format!("h:{id}"),
                    shards: vec![format!("h:{}", 100 + id), format!("h:{}", 200 + id)],
                },
                now_ms: 0,
                session_timeout_ms: 1_000,
                incarnation_id: 0,
            });
            let Ok(crate::Outcome::BrokerRegistered { broker_epoch }) = reply.result else {
                panic!("{reply:?}");
            };
            state.apply(&Command::UnfenceBroker {
                broker_id: BrokerId(id),
                broker_epoch,
            });
        }
        let config = BTreeMap::from([("retention.ms".to_owned(), "1000".to_owned())]);
        state.apply(&Command::CreateTopic {
            name: "t".into(),
            partition_count: 4,
            replication_factor: 3,
            config,
        });
        state.apply(&Command::FenceExpiredBrokers { now_ms: 5_000 });
        state
    }

    // The image and every kind of delta survive encode and decode unchanged.
    #[test]
    fn metadata_round_trips() {
        let state = state();
        let image = state.image();
        let body = encode_fetch_metadata_response(&Ok(MetadataAnswer::Image(image.clone())));
        let Ok(Ok(MetadataUpdate::Image(view))) = decode_fetch_metadata_response(&body) else {
            panic!("image expected");
        };
        assert_eq!(view.metadata_version, image.metadata_version);
        assert_eq!(view.topics, image.topics);
        let brokers: Vec<BrokerView> = image.brokers.iter().map(broker_view).collect();
        assert_eq!(view.brokers, brokers);

        let deltas = state.deltas_since(MetadataVersion(0)).expect("retained");
        let answer = MetadataAnswer::Deltas {
            metadata_version: state.metadata_version(),
            deltas: deltas.clone(),
        };
        let body = encode_fetch_metadata_response(&Ok(answer));
        let Ok(Ok(MetadataUpdate::Deltas { deltas: views, .. })) =
            decode_fetch_metadata_response(&body)
        else {
            panic!("deltas expected");
        };
        assert_eq!(views.len(), deltas.len());
        for ((version, view), delta) in views.iter().zip(&deltas) {
            assert_eq!(*version, delta.version);
            let same = match (&delta.delta, view) {
                (Delta::BrokerRegistered(r), DeltaView::BrokerRegistered(v)) => {
                    broker_view(r) == *v
                }
                (Delta::BrokerFenced(a), DeltaView::BrokerFenced(b))
                | (Delta::BrokerUnfenced(a), DeltaView::BrokerUnfenced(b)) => a == b,
                (Delta::TopicCreated(a), DeltaView::TopicCreated(b)) => a == b,
                (
                    Delta::PartitionChanged {
                        topic_id,
                        partition,
                        record,
                    },
                    DeltaView::PartitionChanged {
                        topic_id: t,
                        partition: p,
                        record: r,
                    },
                ) => topic_id == t && partition == p && record == r,
                _ => false,
            };
            assert!(same, "{delta:?} decoded as {view:?}");
        }
    }

    // A NOT_CONTROLLER failure keeps the leader's endpoint, in both response shapes.
    #[test]
    fn not_controller_carries_the_leader() {
        let failure = ApiFailure::not_controller(Some("h:9".into()));
        let body = encode_broker_heartbeat_response(&Err(failure.clone()));
        let decoded = decode_broker_heartbeat_response(&body)
            .unwrap()
            .unwrap_err();
        assert_eq!(decoded.leader_endpoint.as_deref(), Some("h:9"));
        let outcome = TopicOutcome {
            name: "t".into(),
            result: Err(failure),
        };
        let body = encode_create_topics_response(&[outcome]);
        let decoded = decode_create_topics_response(&body).unwrap();
        let failure = decoded[0].result.clone().unwrap_err();
        assert_eq!(failure.code, ErrorCode::NotController);
        assert_eq!(failure.leader_endpoint.as_deref(), Some("h:9"));
    }

    #[test]
    fn alter_isr_round_trips() {
        let request = AlterIsr {
            leader_id: BrokerId(2),
            topic_id: TopicId(9),
            partition: PartitionIndex(3),
            leader_epoch: LeaderEpoch(4),
            partition_epoch: PartitionEpoch(7),
            new_isr: vec![BrokerId(1), BrokerId(2)],
            new_isr_epochs: vec![BrokerEpoch(11), BrokerEpoch(12)],
        };
        let decoded = decode_alter_isr_request(&encode_alter_isr_request(&request)).unwrap();
        assert_eq!(decoded, request);
        let record = PartitionRecord {
            replicas: vec![Replica {
                broker_id: BrokerId(2),
                shard: ShardIndex(1),
            }],
            isr: vec![BrokerId(2)],
            leader: Some(BrokerId(2)),
            leader_epoch: LeaderEpoch(4),
            partition_epoch: PartitionEpoch(8),
        };
        let ok = Ok((PartitionIndex(3), record));
        assert_eq!(
            decode_alter_isr_response(&encode_alter_isr_response(&ok)).unwrap(),
            ok
        );
        let stale = Err(ApiFailure::new(ErrorCode::StaleLeaderEpoch, "old"));
        assert_eq!(
            decode_alter_isr_response(&encode_alter_isr_response(&stale)).unwrap(),
            stale
        );
    }

    #[test]
    fn decoders_never_panic_on_garbage() {
        for len in 0..64u8 {
            let bytes: Vec<u8> = (0..len).map(|i| i.wrapping_mul(37)).collect();
            let _ = decode_fetch_metadata_response(&bytes);
            let _ = decode_register_broker_request(&bytes);
            let _ = decode_create_topics_request(&bytes);
            let _ = decode_alter_isr_request(&bytes);
            let _ = decode_alter_isr_response(&bytes);
        }
    }
}
