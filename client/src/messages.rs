//! The serialization boundary: builds request bodies and decodes response
//! bodies between flatbuffers and the client's own types. The only file of
//! the library that names `protocol::wire`; it performs no I/O.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use protocol::flatbuffers::{self, FlatBufferBuilder, ForwardsUOffset, Vector, WIPOffset};
use protocol::frame::payload_range;
use protocol::{wire, ErrorCode, GroupEpoch, MemberEpoch, ProducerEpoch, ProducerId};

use crate::accumulator::TopicPartition;
use crate::config::IsolationLevel;
use crate::error::{ClientError, Result};
use crate::group_types::{
    CommittedOffset, CoordinatorInfo, GroupDescription, GroupListing, GroupMemberDescription,
    HeartbeatRequest, HeartbeatResponse, GROUP_LISTINGS_MAX, GROUP_MEMBERS_MAX,
    GROUP_PARTITIONS_MAX,
};
use crate::metadata::{
    BrokerMetadata, ClusterMetadata, PartitionMetadata, ShardEndpoint, TopicMetadata,
};
use crate::topic_types::{PartitionDescription, TopicDescription, TopicSummary};

fn root<'a, T>(body: &'a [u8], what: &str) -> Result<T::Inner>
where
    T: flatbuffers::Follow<'a> + flatbuffers::Verifiable + 'a,
{
    flatbuffers::root::<T>(body).map_err(|e| ClientError::MalformedResponse(format!("{what}: {e}")))
}

fn finish<T>(mut fbb: FlatBufferBuilder<'_>, root: WIPOffset<T>) -> Vec<u8> {
    fbb.finish(root, None);
    fbb.finished_data().to_vec()
}

fn code(raw: u16) -> ErrorCode {
    ErrorCode::from_u16(raw)
}

// ---- Metadata ----

/// `topics` empty asks for every topic.
pub fn metadata_request(topics: &[String]) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let names: Vec<_> = topics.iter().map(|t| fbb.create_string(t)).collect();
    let topics = (!names.is_empty()).then(|| fbb.create_vector(&names));
    let request = wire::MetadataRequest::create(&mut fbb, &wire::MetadataRequestArgs { topics });
    finish(fbb, request)
}

pub fn metadata_response(body: &[u8]) -> Result<ClusterMetadata> {
    let response = root::<wire::MetadataResponse>(body, "metadata response")?;
    let brokers = response
        .brokers()
        .iter()
        .flatten()
        .map(|b| BrokerMetadata {
            node_id: b.node_id(),
            host: b.host().unwrap_or_default().to_owned(),
            port: b.port(),
            shards: b
                .shards()
                .iter()
                .flatten()
                .map(|s| ShardEndpoint {
                    shard: s.shard(),
                    host: s
                        .host()
                        .unwrap_or_else(|| b.host().unwrap_or_default())
                        .to_owned(),
                    port: s.port(),
                })
                .collect(),
        })
        .collect();
    let mut topics: Vec<TopicMetadata> = response
        .topics()
        .iter()
        .flatten()
        .map(|t| {
            let mut partitions: Vec<PartitionMetadata> = t
                .partitions()
                .iter()
                .flatten()
                .map(|p| PartitionMetadata {
                    partition: p.partition(),
                    error: code(p.error_code()),
                    leader: p.leader(),
                    leader_epoch: p.leader_epoch(),
                    shard: p.shard(),
                    replicas: p.replicas().iter().flatten().collect(),
                    isr: p.isr().iter().flatten().collect(),
                })
                .collect();
            partitions.sort_by_key(|p| p.partition);
            TopicMetadata {
                name: t.name().unwrap_or_default().to_owned(),
                error: code(t.error_code()),
                partitions,
            }
        })
        .collect();
    topics.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(ClusterMetadata {
        brokers,
        controller_id: response.controller_id(),
        topics,
    })
}

// ---- Admin ----

fn config_entries<'a>(
    fbb: &mut FlatBufferBuilder<'a>,
    configs: &[(String, String)],
) -> flatbuffers::WIPOffset<
    flatbuffers::Vector<'a, flatbuffers::ForwardsUOffset<wire::ConfigEntry<'a>>>,
> {
    let entries: Vec<_> = configs
        .iter()
        .map(|(k, v)| {
            let key = Some(fbb.create_string(k));
            let value = Some(fbb.create_string(v));
            wire::ConfigEntry::create(fbb, &wire::ConfigEntryArgs { key, value })
        })
        .collect();
    fbb.create_vector(&entries)
}

pub fn create_topics_request(
    name: &str,
    partitions: i32,
    replication_factor: i16,
    configs: &[(String, String)],
) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let configs = Some(config_entries(&mut fbb, configs));
    let name = Some(fbb.create_string(name));
    let topic = wire::CreateTopic::create(
        &mut fbb,
        &wire::CreateTopicArgs {
            name,
            partitions,
            replication_factor,
            configs,
        },
    );
    let topics = Some(fbb.create_vector(&[topic]));
    let request =
        wire::CreateTopicsRequest::create(&mut fbb, &wire::CreateTopicsRequestArgs { topics });
    finish(fbb, request)
}

/// The result for `name` in a create or delete response.
fn topic_result<'a>(
    results: Option<flatbuffers::Vector<'a, flatbuffers::ForwardsUOffset<wire::TopicResult<'a>>>>,
    name: &str,
) -> Result<()> {
    let result = results
        .iter()
        .flatten()
        .find(|r| r.name() == Some(name))
        .ok_or_else(|| ClientError::MalformedResponse(format!("no result for topic `{name}`")))?;
    match code(result.error_code()) {
        ErrorCode::None => Ok(()),
        error => Err(ClientError::broker(
            error,
            result.error_message().map(str::to_owned),
        )),
    }
}

pub fn create_topics_response(body: &[u8], name: &str) -> Result<()> {
    let response = root::<wire::CreateTopicsResponse>(body, "create topics response")?;
    topic_result(response.results(), name)
}

pub fn delete_topics_request(name: &str) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let name = fbb.create_string(name);
    let names = Some(fbb.create_vector(&[name]));
    let request =
        wire::DeleteTopicsRequest::create(&mut fbb, &wire::DeleteTopicsRequestArgs { names });
    finish(fbb, request)
}

pub fn delete_topics_response(body: &[u8], name: &str) -> Result<()> {
    let response = root::<wire::DeleteTopicsResponse>(body, "delete topics response")?;
    topic_result(response.results(), name)
}

pub fn alter_topic_configs_request(
    name: &str,
    set: &[(String, String)],
    remove: &[String],
) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let set = Some(config_entries(&mut fbb, set));
    let removed: Vec<_> = remove.iter().map(|k| fbb.create_string(k)).collect();
    let remove = Some(fbb.create_vector(&removed));
    let name = Some(fbb.create_string(name));
    let topic =
        wire::AlterTopicConfig::create(&mut fbb, &wire::AlterTopicConfigArgs { name, set, remove });
    let topics = Some(fbb.create_vector(&[topic]));
    let request = wire::AlterTopicConfigsRequest::create(
        &mut fbb,
        &wire::AlterTopicConfigsRequestArgs { topics },
    );
    finish(fbb, request)
}

pub fn alter_topic_configs_response(body: &[u8], name: &str) -> Result<()> {
    let response = root::<wire::AlterTopicConfigsResponse>(body, "alter topic configs response")?;
    topic_result(response.results(), name)
}

pub fn list_topics_request() -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let request = wire::ListTopicsRequest::create(&mut fbb, &wire::ListTopicsRequestArgs {});
    finish(fbb, request)
}

pub fn list_topics_response(body: &[u8]) -> Result<Vec<TopicSummary>> {
    let response = root::<wire::ListTopicsResponse>(body, "list topics response")?;
    let mut topics: Vec<TopicSummary> = response
        .topics()
        .iter()
        .flatten()
        .map(|t| TopicSummary {
            name: t.name().unwrap_or_default().to_owned(),
            partitions: t.partitions(),
            replication_factor: t.replication_factor(),
        })
        .collect();
    topics.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(topics)
}

pub fn describe_topic_request(name: &str) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let name = Some(fbb.create_string(name));
    let request =
        wire::DescribeTopicRequest::create(&mut fbb, &wire::DescribeTopicRequestArgs { name });
    finish(fbb, request)
}

pub fn describe_topic_response(body: &[u8]) -> Result<TopicDescription> {
    let response = root::<wire::DescribeTopicResponse>(body, "describe topic response")?;
    let error = code(response.error_code());
    if !error.is_ok() {
        return Err(ClientError::broker(
            error,
            response.error_message().map(str::to_owned),
        ));
    }
    let mut partitions: Vec<PartitionDescription> = response
        .partition_details()
        .iter()
        .flatten()
        .map(|p| PartitionDescription {
            partition: p.partition(),
            error: code(p.error_code()),
            leader: p.leader(),
            leader_epoch: p.leader_epoch(),
            shard: p.shard(),
            log_start_offset: p.log_start_offset(),
            log_end_offset: p.log_end_offset(),
            high_watermark: p.high_watermark(),
            size_bytes: p.size_bytes(),
        })
        .collect();
    partitions.sort_by_key(|p| p.partition);
    Ok(TopicDescription {
        name: response.name().unwrap_or_default().to_owned(),
        partition_count: response.partitions(),
        replication_factor: response.replication_factor(),
        configs: response
            .configs()
            .iter()
            .flatten()
            .map(|c| {
                (
                    c.key().unwrap_or_default().to_owned(),
                    c.value().unwrap_or_default().to_owned(),
                )
            })
            .collect(),
        partitions,
    })
}

// ---- Produce ----

/// One partition's batch in a produce request.
#[derive(Debug)]
pub struct ProduceEntry<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub batch: &'a [u8],
}

/// Builds the body; the payload is the entries' batches, concatenated in order.
pub fn produce_request(acks: i16, timeout_ms: i32, entries: &[ProduceEntry<'_>]) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let mut topics = Vec::new();
    let mut payload_offset: u32 = 0;
    let mut index = 0;
    while index < entries.len() {
        let topic = entries[index].topic;
        let mut partitions = Vec::new();
        while index < entries.len() && entries[index].topic == topic {
            let entry = &entries[index];
            let length = u32::try_from(entry.batch.len()).expect("batch under 4 GiB");
            let records = wire::ByteRange::new(payload_offset, length);
            payload_offset = payload_offset
                .checked_add(length)
                .expect("payload under 4 GiB");
            partitions.push(wire::ProducePartition::create(
                &mut fbb,
                &wire::ProducePartitionArgs {
                    partition: entry.partition,
                    records: Some(&records),
                },
            ));
            index += 1;
        }
        let name = Some(fbb.create_string(topic));
        let partitions = Some(fbb.create_vector(&partitions));
        topics.push(wire::ProduceTopic::create(
            &mut fbb,
            &wire::ProduceTopicArgs { name, partitions },
        ));
    }
    let topics = Some(fbb.create_vector(&topics));
    let request = wire::ProduceRequest::create(
        &mut fbb,
        &wire::ProduceRequestArgs {
            acks,
            timeout_ms,
            topics,
        },
    );
    finish(fbb, request)
}

/// One partition's outcome in a produce response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProduceOutcome {
    pub topic: String,
    pub partition: i32,
    pub error: ErrorCode,
    pub error_message: Option<String>,
    pub base_offset: i64,
}

pub fn produce_response(body: &[u8]) -> Result<Vec<ProduceOutcome>> {
    let response = root::<wire::ProduceResponse>(body, "produce response")?;
    let mut out = Vec::new();
    for topic in response.topics().iter().flatten() {
        let name = topic.name().unwrap_or_default();
        for p in topic.partitions().iter().flatten() {
            out.push(ProduceOutcome {
                topic: name.to_owned(),
                partition: p.partition(),
                error: code(p.error_code()),
                error_message: p.error_message().map(str::to_owned),
                base_offset: p.base_offset(),
            });
        }
    }
    Ok(out)
}

// ---- Fetch ----

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchEntry {
    pub topic: String,
    pub partition: i32,
    pub fetch_offset: i64,
    pub max_bytes: i32,
}

pub fn fetch_request(
    max_wait_ms: i32,
    min_bytes: i32,
    max_bytes: i32,
    isolation: IsolationLevel,
    entries: &[FetchEntry],
) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let mut topics = Vec::new();
    let mut index = 0;
    while index < entries.len() {
        let topic = entries[index].topic.as_str();
        let mut partitions = Vec::new();
        while index < entries.len() && entries[index].topic == topic {
            let entry = &entries[index];
            partitions.push(wire::FetchPartition::create(
                &mut fbb,
                &wire::FetchPartitionArgs {
                    partition: entry.partition,
                    fetch_offset: entry.fetch_offset,
                    max_bytes: entry.max_bytes,
                    current_leader_epoch: -1,
                    last_fetched_epoch: -1,
                },
            ));
            index += 1;
        }
        let name = Some(fbb.create_string(topic));
        let partitions = Some(fbb.create_vector(&partitions));
        topics.push(wire::FetchTopic::create(
            &mut fbb,
            &wire::FetchTopicArgs { name, partitions },
        ));
    }
    let topics = Some(fbb.create_vector(&topics));
    let request = wire::FetchRequest::create(
        &mut fbb,
        &wire::FetchRequestArgs {
            replica_id: -1,
            replica_epoch: -1,
            max_wait_ms,
            min_bytes,
            max_bytes,
            topics,
            isolation_level: isolation.wire(),
        },
    );
    finish(fbb, request)
}

/// A transaction aborted in a fetched partition: skip the producer's
/// transactional batches from `first_offset` to its abort marker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AbortedTransaction {
    pub producer_id: i64,
    pub first_offset: i64,
}

/// One partition's data in a fetch response; `records` shares the frame.
#[derive(Clone, Debug)]
pub struct FetchedPartition {
    pub topic: String,
    pub partition: i32,
    pub error: ErrorCode,
    pub high_watermark: i64,
    pub log_start_offset: i64,
    pub log_end_offset: i64,
    /// Where read_committed reads stop (-1 when not known).
    pub last_stable_offset: i64,
    /// read_committed only, oldest first.
    pub aborted: Vec<AbortedTransaction>,
    pub records: Bytes,
}

pub fn fetch_response(body: &[u8], payload: &Bytes) -> Result<Vec<FetchedPartition>> {
    let response = root::<wire::FetchResponse>(body, "fetch response")?;
    let mut out = Vec::new();
    for topic in response.topics().iter().flatten() {
        let name = topic.name().unwrap_or_default();
        for p in topic.partitions().iter().flatten() {
            let records = match p.records() {
                None => Bytes::new(),
                Some(range) => {
                    let slice = payload_range(payload, range.offset(), range.length()).ok_or_else(
                        || {
                            ClientError::MalformedResponse(format!(
                                "records range {}+{} outside a payload of {} bytes",
                                range.offset(),
                                range.length(),
                                payload.len()
                            ))
                        },
                    )?;
                    payload.slice_ref(slice)
                }
            };
            out.push(FetchedPartition {
                topic: name.to_owned(),
                partition: p.partition(),
                error: code(p.error_code()),
                high_watermark: p.high_watermark(),
                log_start_offset: p.log_start_offset(),
                log_end_offset: p.log_end_offset(),
                last_stable_offset: p.last_stable_offset(),
                aborted: p
                    .aborted_transactions()
                    .iter()
                    .flatten()
                    .map(|t| AbortedTransaction {
                        producer_id: t.producer_id(),
                        first_offset: t.first_offset(),
                    })
                    .collect(),
                records,
            });
        }
    }
    Ok(out)
}

// ---- ListOffsets ----

/// Asks for the earliest offset.
pub const TIMESTAMP_EARLIEST: i64 = -2;
/// Asks for the log end offset.
pub const TIMESTAMP_LATEST: i64 = -1;

pub fn list_offsets_request(
    topic: &str,
    partitions: &[(i32, i64)],
    isolation: IsolationLevel,
) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let entries: Vec<_> = partitions
        .iter()
        .map(|&(partition, timestamp_ms)| {
            wire::ListOffsetsPartition::create(
                &mut fbb,
                &wire::ListOffsetsPartitionArgs {
                    partition,
                    timestamp_ms,
                },
            )
        })
        .collect();
    let name = Some(fbb.create_string(topic));
    let partitions = Some(fbb.create_vector(&entries));
    let topic =
        wire::ListOffsetsTopic::create(&mut fbb, &wire::ListOffsetsTopicArgs { name, partitions });
    let topics = Some(fbb.create_vector(&[topic]));
    let request = wire::ListOffsetsRequest::create(
        &mut fbb,
        &wire::ListOffsetsRequestArgs {
            topics,
            isolation_level: isolation.wire(),
        },
    );
    finish(fbb, request)
}

/// `(partition, error, offset)` for every partition of `topic` in the response.
pub fn list_offsets_response(body: &[u8], topic: &str) -> Result<Vec<(i32, ErrorCode, i64)>> {
    let response = root::<wire::ListOffsetsResponse>(body, "list offsets response")?;
    Ok(response
        .topics()
        .iter()
        .flatten()
        .filter(|t| t.name() == Some(topic))
        .flat_map(|t| t.partitions().into_iter().flatten())
        .map(|p| (p.partition(), code(p.error_code()), p.offset()))
        .collect())
}

// ---- DescribeCluster (a controller API) ----

/// One controller of the quorum, as the answering controller sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerDescription {
    pub id: u64,
    pub endpoint: String,
    pub is_leader: bool,
}

/// One registered broker, as the controllers' state has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterBrokerDescription {
    pub id: u32,
    pub epoch: u64,
    pub client_endpoint: String,
    pub shard_endpoints: Vec<String>,
    pub fenced: bool,
    pub partitions_led: u32,
}

/// The answer of `DescribeCluster`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterDescription {
    pub node_id: u64,
    /// `None` when the answering controller knows no leader.
    pub leader_id: Option<u64>,
    pub leader_endpoint: Option<String>,
    pub raft_term: u64,
    pub metadata_version: u64,
    pub controllers: Vec<ControllerDescription>,
    pub brokers: Vec<ClusterBrokerDescription>,
}

pub fn describe_cluster_request() -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let request =
        wire::DescribeClusterRequest::create(&mut fbb, &wire::DescribeClusterRequestArgs {});
    finish(fbb, request)
}

pub fn describe_cluster_response(body: &[u8]) -> Result<ClusterDescription> {
    let response = root::<wire::DescribeClusterResponse>(body, "describe cluster response")?;
    let error = code(response.error_code());
    if error != ErrorCode::None {
        return Err(ClientError::Broker {
            code: error,
            message: response.error_message().map(str::to_owned),
        });
    }
    let controllers = response
        .controllers()
        .iter()
        .flatten()
        .map(|c| ControllerDescription {
            id: c.id(),
            endpoint: c.endpoint().unwrap_or_default().to_owned(),
            is_leader: c.is_leader(),
        })
        .collect();
    let brokers = response
        .brokers()
        .iter()
        .flatten()
        .map(|b| {
            let endpoints = b.endpoints();
            ClusterBrokerDescription {
                id: b.id(),
                epoch: b.epoch(),
                client_endpoint: endpoints
                    .and_then(|e| e.client())
                    .unwrap_or_default()
                    .to_owned(),
                shard_endpoints: endpoints
                    .and_then(|e| e.shards())
                    .map(|s| s.iter().map(str::to_owned).collect())
                    .unwrap_or_default(),
                fenced: b.fenced(),
                partitions_led: b.partitions_led(),
            }
        })
        .collect();
    Ok(ClusterDescription {
        node_id: response.node_id(),
        leader_id: u64::try_from(response.leader_id()).ok(),
        leader_endpoint: response
            .leader_endpoint()
            .filter(|e| !e.is_empty())
            .map(str::to_owned),
        raft_term: response.raft_term(),
        metadata_version: response.metadata_version(),
        controllers,
        brokers,
    })
}

// ---- Consumer groups ----

fn malformed(what: &str, reason: impl std::fmt::Display) -> ClientError {
    ClientError::MalformedResponse(format!("{what}: {reason}"))
}

/// A response's top-level error code and message as a `Result`.
fn check_error(raw: u16, message: Option<&str>) -> Result<()> {
    match code(raw) {
        ErrorCode::None => Ok(()),
        error => Err(ClientError::broker(
            error,
            message.filter(|m| !m.is_empty()).map(str::to_owned),
        )),
    }
}

type TopicPartitionsVector<'a> = Vector<'a, ForwardsUOffset<wire::TopicPartitions<'a>>>;

/// Partitions grouped by topic, topics in name order.
fn topic_partitions_vector<'a, 'p>(
    fbb: &mut FlatBufferBuilder<'a>,
    partitions: impl IntoIterator<Item = &'p TopicPartition>,
) -> WIPOffset<TopicPartitionsVector<'a>> {
    let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for tp in partitions {
        by_topic.entry(&tp.topic).or_default().push(tp.partition);
    }
    let entries: Vec<_> = by_topic
        .iter()
        .map(|(topic, indexes)| {
            let topic = Some(fbb.create_string(topic));
            let partitions = Some(fbb.create_vector(indexes));
            wire::TopicPartitions::create(fbb, &wire::TopicPartitionsArgs { topic, partitions })
        })
        .collect();
    fbb.create_vector(&entries)
}

fn topic_partitions_from(
    list: Option<TopicPartitionsVector<'_>>,
    what: &str,
) -> Result<BTreeSet<TopicPartition>> {
    let mut out = BTreeSet::new();
    for entry in list.iter().flatten() {
        let topic = entry
            .topic()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| malformed(what, "a topic without a name"))?;
        for partition in entry.partitions().iter().flatten() {
            if partition < 0 {
                return Err(malformed(
                    what,
                    format!("partition {partition} of `{topic}`"),
                ));
            }
            if out.len() >= GROUP_PARTITIONS_MAX {
                return Err(malformed(
                    what,
                    format!("more than {GROUP_PARTITIONS_MAX} partitions"),
                ));
            }
            out.insert(TopicPartition::new(topic, partition));
        }
    }
    Ok(out)
}

fn strings_from(list: Option<Vector<'_, ForwardsUOffset<&str>>>) -> Vec<String> {
    list.iter().flatten().map(str::to_owned).collect()
}

fn optional_string(text: Option<&str>) -> Option<String> {
    text.filter(|t| !t.is_empty()).map(str::to_owned)
}

/// Committed offsets (CommittedTopic lists) of OffsetFetch and
/// DescribeGroup; entries with offset -1 (nothing committed) are left out.
fn committed_from<'a>(
    topics: Option<Vector<'a, ForwardsUOffset<wire::CommittedTopic<'a>>>>,
    what: &str,
) -> Result<BTreeMap<TopicPartition, CommittedOffset>> {
    let mut out = BTreeMap::new();
    let mut seen = 0usize;
    for topic in topics.iter().flatten() {
        let name = topic
            .name()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| malformed(what, "a topic without a name"))?;
        for p in topic.partitions().iter().flatten() {
            seen += 1;
            if seen > GROUP_PARTITIONS_MAX {
                return Err(malformed(
                    what,
                    format!("more than {GROUP_PARTITIONS_MAX} partitions"),
                ));
            }
            if p.partition() < 0 || p.offset() < -1 {
                return Err(malformed(
                    what,
                    format!(
                        "partition {} of `{name}` at offset {}",
                        p.partition(),
                        p.offset()
                    ),
                ));
            }
            if p.offset() >= 0 {
                out.insert(
                    TopicPartition::new(name, p.partition()),
                    CommittedOffset {
                        offset: p.offset(),
                        metadata: p.metadata().unwrap_or_default().to_owned(),
                        commit_time_ms: p.commit_time_ms(),
                    },
                );
            }
        }
    }
    Ok(out)
}

/// InitProducerId for an idempotent (not transactional) producer.
/// For an idempotent producer (`None`), or a transactional one: its id and
/// transaction timeout.
pub fn init_producer_id_request(transactional: Option<(&str, u32)>) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let transactional_id = transactional.map(|(id, _)| fbb.create_string(id));
    let request = wire::InitProducerIdRequest::create(
        &mut fbb,
        &wire::InitProducerIdRequestArgs {
            transactional_id,
            transaction_timeout_ms: transactional
                .map_or(0, |(_, ms)| i32::try_from(ms).unwrap_or(i32::MAX)),
        },
    );
    finish(fbb, request)
}

/// The producer id and epoch a broker gave.
pub fn init_producer_id_response(body: &[u8]) -> Result<(ProducerId, ProducerEpoch)> {
    const WHAT: &str = "init producer id response";
    let response = root::<wire::InitProducerIdResponse>(body, WHAT)?;
    check_error(response.error_code(), response.error_message())?;
    if response.producer_id() < 0 || response.producer_epoch() < 0 {
        return Err(malformed(WHAT, "negative producer id or epoch"));
    }
    Ok((
        ProducerId(response.producer_id()),
        ProducerEpoch(response.producer_epoch()),
    ))
}

// ---- Transaction coordinator ----

fn txn_topics<'a>(
    fbb: &mut FlatBufferBuilder<'a>,
    partitions: &[TopicPartition],
) -> flatbuffers::WIPOffset<
    flatbuffers::Vector<'a, flatbuffers::ForwardsUOffset<wire::TxnMarkerTopic<'a>>>,
> {
    let mut by_topic: std::collections::BTreeMap<&str, Vec<i32>> = Default::default();
    for tp in partitions {
        by_topic.entry(&tp.topic).or_default().push(tp.partition);
    }
    let topics: Vec<_> = by_topic
        .into_iter()
        .map(|(name, partitions)| {
            let name = Some(fbb.create_string(name));
            let partitions = Some(fbb.create_vector(&partitions));
            wire::TxnMarkerTopic::create(fbb, &wire::TxnMarkerTopicArgs { name, partitions })
        })
        .collect();
    fbb.create_vector(&topics)
}

fn read_txn_topics<'a>(
    topics: Option<flatbuffers::Vector<'a, flatbuffers::ForwardsUOffset<wire::TxnMarkerTopic<'a>>>>,
) -> Vec<TopicPartition> {
    let mut out = Vec::new();
    for topic in topics.iter().flatten() {
        let name = topic.name().unwrap_or_default();
        for p in topic.partitions().iter().flatten() {
            out.push(TopicPartition::new(name, p));
        }
    }
    out
}

pub fn add_partitions_to_txn_request(
    transactional_id: &str,
    producer: (ProducerId, ProducerEpoch),
    partitions: &[TopicPartition],
) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let id = Some(fbb.create_string(transactional_id));
    let topics = Some(txn_topics(&mut fbb, partitions));
    let request = wire::AddPartitionsToTxnRequest::create(
        &mut fbb,
        &wire::AddPartitionsToTxnRequestArgs {
            transactional_id: id,
            producer_id: producer.0 .0,
            producer_epoch: producer.1 .0,
            topics,
        },
    );
    finish(fbb, request)
}

pub fn add_partitions_to_txn_response(body: &[u8]) -> Result<()> {
    let response =
        root::<wire::AddPartitionsToTxnResponse>(body, "add partitions to txn response")?;
    check_error(response.error_code(), response.error_message())
}

pub fn add_offsets_to_txn_request(
    transactional_id: &str,
    producer: (ProducerId, ProducerEpoch),
    group_id: &str,
) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let id = Some(fbb.create_string(transactional_id));
    let group_id = Some(fbb.create_string(group_id));
    let request = wire::AddOffsetsToTxnRequest::create(
        &mut fbb,
        &wire::AddOffsetsToTxnRequestArgs {
            transactional_id: id,
            producer_id: producer.0 .0,
            producer_epoch: producer.1 .0,
            group_id,
        },
    );
    finish(fbb, request)
}

pub fn add_offsets_to_txn_response(body: &[u8]) -> Result<()> {
    let response = root::<wire::AddOffsetsToTxnResponse>(body, "add offsets to txn response")?;
    check_error(response.error_code(), response.error_message())
}

/// A consumer group member's offsets, committed in a producer's
/// transaction (to the group's coordinator).
pub fn txn_offset_commit_request(
    transactional_id: &str,
    producer: (ProducerId, ProducerEpoch),
    group: &ConsumerGroupMetadata,
    offsets: &BTreeMap<TopicPartition, i64>,
) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let topics = Some(commit_topics(&mut fbb, offsets));
    let id = Some(fbb.create_string(transactional_id));
    let group_id = Some(fbb.create_string(&group.group_id));
    let member_id = Some(fbb.create_string(&group.member_id));
    let request = wire::TxnOffsetCommitRequest::create(
        &mut fbb,
        &wire::TxnOffsetCommitRequestArgs {
            transactional_id: id,
            group_id,
            producer_id: producer.0 .0,
            producer_epoch: producer.1 .0,
            member_id,
            member_epoch: group.member_epoch.0,
            topics,
        },
    );
    finish(fbb, request)
}

pub fn txn_offset_commit_response(body: &[u8]) -> Result<()> {
    let response = root::<wire::TxnOffsetCommitResponse>(body, "txn offset commit response")?;
    check_error(response.error_code(), response.error_message())
}

/// Who commits a group's offsets in a transaction: the group and the
/// member (id and epoch) whose records were processed, so a fenced member's
/// transaction cannot commit offsets over the partitions' new owners.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerGroupMetadata {
    pub group_id: String,
    pub member_id: String,
    pub member_epoch: MemberEpoch,
}

pub fn end_txn_request(
    transactional_id: &str,
    producer: (ProducerId, ProducerEpoch),
    commit: bool,
) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let id = Some(fbb.create_string(transactional_id));
    let request = wire::EndTxnRequest::create(
        &mut fbb,
        &wire::EndTxnRequestArgs {
            transactional_id: id,
            producer_id: producer.0 .0,
            producer_epoch: producer.1 .0,
            commit,
        },
    );
    finish(fbb, request)
}

pub fn end_txn_response(body: &[u8]) -> Result<()> {
    let response = root::<wire::EndTxnResponse>(body, "end txn response")?;
    check_error(response.error_code(), response.error_message())
}

/// A transactional id as its coordinator holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransactionDescription {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// Empty, Ongoing, PrepareCommit, PrepareAbort, CompleteCommit or
    /// CompleteAbort.
    pub state: String,
    pub timeout_ms: i32,
    /// Wall-clock ms the open transaction began; -1 when none.
    pub start_ms: i64,
    pub update_ms: i64,
    pub partitions: Vec<TopicPartition>,
}

fn read_transaction(t: wire::TransactionState<'_>) -> TransactionDescription {
    TransactionDescription {
        transactional_id: t.transactional_id().unwrap_or_default().to_owned(),
        producer_id: t.producer_id(),
        producer_epoch: t.producer_epoch(),
        state: t.state().unwrap_or_default().to_owned(),
        timeout_ms: t.timeout_ms(),
        start_ms: t.start_ms(),
        update_ms: t.update_ms(),
        partitions: read_txn_topics(t.topics()),
    }
}

pub fn list_transactions_request(states: &[&str]) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let names: Vec<_> = states.iter().map(|s| fbb.create_string(s)).collect();
    let states = Some(fbb.create_vector(&names));
    let request = wire::ListTransactionsRequest::create(
        &mut fbb,
        &wire::ListTransactionsRequestArgs { states },
    );
    finish(fbb, request)
}

pub fn list_transactions_response(body: &[u8]) -> Result<Vec<TransactionDescription>> {
    let response = root::<wire::ListTransactionsResponse>(body, "list transactions response")?;
    check_error(response.error_code(), response.error_message())?;
    Ok(response
        .transactions()
        .iter()
        .flatten()
        .map(read_transaction)
        .collect())
}

pub fn describe_transaction_request(transactional_id: &str) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let id = Some(fbb.create_string(transactional_id));
    let request = wire::DescribeTransactionRequest::create(
        &mut fbb,
        &wire::DescribeTransactionRequestArgs {
            transactional_id: id,
        },
    );
    finish(fbb, request)
}

pub fn describe_transaction_response(body: &[u8]) -> Result<TransactionDescription> {
    const WHAT: &str = "describe transaction response";
    let response = root::<wire::DescribeTransactionResponse>(body, WHAT)?;
    check_error(response.error_code(), response.error_message())?;
    response
        .transaction()
        .map(read_transaction)
        .ok_or_else(|| malformed(WHAT, "no transaction"))
}

// ---- WriteTxnMarkers ----

/// One transaction's end to write to `partitions`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnMarkerEntry {
    pub producer_id: ProducerId,
    pub producer_epoch: ProducerEpoch,
    pub commit: bool,
    pub coordinator_epoch: i32,
    pub partitions: Vec<TopicPartition>,
    /// The transaction's number at its coordinator (0: unknown, always
    /// written).
    pub transaction_number: i64,
}

pub fn write_txn_markers_request(markers: &[TxnMarkerEntry], timeout_ms: i32) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let mut encoded = Vec::with_capacity(markers.len());
    for m in markers {
        let topics = Some(txn_topics(&mut fbb, &m.partitions));
        encoded.push(wire::WritableTxnMarker::create(
            &mut fbb,
            &wire::WritableTxnMarkerArgs {
                producer_id: m.producer_id.0,
                producer_epoch: m.producer_epoch.0,
                commit: m.commit,
                coordinator_epoch: m.coordinator_epoch,
                topics,
                transaction_number: m.transaction_number,
            },
        ));
    }
    let markers = Some(fbb.create_vector(&encoded));
    let request = wire::WriteTxnMarkersRequest::create(
        &mut fbb,
        &wire::WriteTxnMarkersRequestArgs {
            markers,
            timeout_ms,
        },
    );
    finish(fbb, request)
}

/// Per marker partition (producer id, partition) the broker's answer.
pub fn write_txn_markers_response(body: &[u8]) -> Result<Vec<(i64, TopicPartition, ErrorCode)>> {
    let response = root::<wire::WriteTxnMarkersResponse>(body, "write txn markers response")?;
    let mut out = Vec::new();
    for marker in response.markers().iter().flatten() {
        for topic in marker.topics().iter().flatten() {
            let name = topic.name().unwrap_or_default();
            for p in topic.partitions().iter().flatten() {
                out.push((
                    marker.producer_id(),
                    TopicPartition::new(name, p.partition()),
                    code(p.error_code()),
                ));
            }
        }
    }
    Ok(out)
}

/// Whose coordinator FindCoordinator looks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoordinatorKey {
    Group,
    Transaction,
}

pub fn find_coordinator_request(key: &str, key_type: CoordinatorKey) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let group_id = Some(fbb.create_string(key));
    let request = wire::FindCoordinatorRequest::create(
        &mut fbb,
        &wire::FindCoordinatorRequestArgs {
            group_id,
            key_type: match key_type {
                CoordinatorKey::Group => 0,
                CoordinatorKey::Transaction => 1,
            },
        },
    );
    finish(fbb, request)
}

pub fn find_coordinator_response(body: &[u8]) -> Result<CoordinatorInfo> {
    const WHAT: &str = "find coordinator response";
    let response = root::<wire::FindCoordinatorResponse>(body, WHAT)?;
    check_error(response.error_code(), response.error_message())?;
    let host = response
        .host()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| malformed(WHAT, "no host"))?;
    if response.port() == 0 {
        return Err(malformed(WHAT, "port 0"));
    }
    Ok(CoordinatorInfo {
        node_id: response.node_id(),
        host: host.to_owned(),
        port: response.port(),
        shard: response.shard(),
    })
}

pub fn group_heartbeat_request(request: &HeartbeatRequest) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let subscribed_topics = request.subscribed_topics.as_ref().map(|topics| {
        let names: Vec<_> = topics.iter().map(|t| fbb.create_string(t)).collect();
        fbb.create_vector(&names)
    });
    let owned = request
        .owned
        .as_ref()
        .map(|owned| topic_partitions_vector(&mut fbb, owned));
    let group_id = Some(fbb.create_string(&request.group_id));
    let member_id = Some(fbb.create_string(&request.member_id));
    let instance_id = request.instance_id.as_deref().map(|i| fbb.create_string(i));
    let client_id = Some(fbb.create_string(&request.client_id));
    let assignor = request.assignor.as_deref().map(|a| fbb.create_string(a));
    let heartbeat = wire::GroupHeartbeatRequest::create(
        &mut fbb,
        &wire::GroupHeartbeatRequestArgs {
            group_id,
            member_id,
            member_epoch: request.member_epoch.0,
            instance_id,
            client_id,
            session_timeout_ms: request.session_timeout_ms,
            rebalance_timeout_ms: request.rebalance_timeout_ms,
            subscribed_topics,
            assignor,
            owned,
        },
    );
    finish(fbb, heartbeat)
}

/// An absent assignment is an empty one: the field is the member's whole
/// assignment, never "unchanged".
pub fn group_heartbeat_response(body: &[u8]) -> Result<HeartbeatResponse> {
    const WHAT: &str = "group heartbeat response";
    let response = root::<wire::GroupHeartbeatResponse>(body, WHAT)?;
    check_error(response.error_code(), response.error_message())?;
    Ok(HeartbeatResponse {
        member_id: response.member_id().unwrap_or_default().to_owned(),
        member_epoch: MemberEpoch(response.member_epoch()),
        heartbeat_interval_ms: response.heartbeat_interval_ms(),
        assignment: topic_partitions_from(response.assignment(), WHAT)?,
    })
}

/// A member commits with its id and epoch; a tool with an empty id and
/// `MemberEpoch::LEAVE` (-1), accepted only by a group without members.
/// The offsets of an OffsetCommit or TxnOffsetCommit request, by topic.
fn commit_topics<'a>(
    fbb: &mut FlatBufferBuilder<'a>,
    offsets: &BTreeMap<TopicPartition, i64>,
) -> WIPOffset<Vector<'a, ForwardsUOffset<wire::OffsetCommitTopic<'a>>>> {
    let mut topics = Vec::new();
    let mut entries = offsets.iter().peekable();
    while let Some((first, _)) = entries.peek() {
        let topic = first.topic.clone();
        let mut partitions = Vec::new();
        while let Some((tp, offset)) = entries.next_if(|(tp, _)| tp.topic == topic) {
            partitions.push(wire::OffsetCommitPartition::create(
                fbb,
                &wire::OffsetCommitPartitionArgs {
                    partition: tp.partition,
                    offset: *offset,
                    metadata: None,
                },
            ));
        }
        let name = Some(fbb.create_string(&topic));
        let partitions = Some(fbb.create_vector(&partitions));
        topics.push(wire::OffsetCommitTopic::create(
            fbb,
            &wire::OffsetCommitTopicArgs { name, partitions },
        ));
    }
    fbb.create_vector(&topics)
}

pub fn offset_commit_request(
    group_id: &str,
    member_id: &str,
    member_epoch: MemberEpoch,
    offsets: &BTreeMap<TopicPartition, i64>,
) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let topics = Some(commit_topics(&mut fbb, offsets));
    let group_id = Some(fbb.create_string(group_id));
    let member_id = Some(fbb.create_string(member_id));
    let request = wire::OffsetCommitRequest::create(
        &mut fbb,
        &wire::OffsetCommitRequestArgs {
            group_id,
            member_id,
            member_epoch: member_epoch.0,
            topics,
        },
    );
    finish(fbb, request)
}

pub fn offset_commit_response(body: &[u8]) -> Result<()> {
    let response = root::<wire::OffsetCommitResponse>(body, "offset commit response")?;
    check_error(response.error_code(), response.error_message())
}

/// `partitions` `None` asks for every committed offset of the group.
pub fn offset_fetch_request(group_id: &str, partitions: Option<&[TopicPartition]>) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let topics = partitions.map(|p| topic_partitions_vector(&mut fbb, p));
    let group_id = Some(fbb.create_string(group_id));
    let request = wire::OffsetFetchRequest::create(
        &mut fbb,
        &wire::OffsetFetchRequestArgs { group_id, topics },
    );
    finish(fbb, request)
}

/// The committed offsets in the answer; partitions without one are absent.
pub fn offset_fetch_response(body: &[u8]) -> Result<BTreeMap<TopicPartition, CommittedOffset>> {
    const WHAT: &str = "offset fetch response";
    let response = root::<wire::OffsetFetchResponse>(body, WHAT)?;
    check_error(response.error_code(), response.error_message())?;
    committed_from(response.topics(), WHAT)
}

pub fn list_groups_request() -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let request = wire::ListGroupsRequest::create(&mut fbb, &wire::ListGroupsRequestArgs {});
    finish(fbb, request)
}

pub fn list_groups_response(body: &[u8]) -> Result<Vec<GroupListing>> {
    const WHAT: &str = "list groups response";
    let response = root::<wire::ListGroupsResponse>(body, WHAT)?;
    check_error(response.error_code(), response.error_message())?;
    let groups = response.groups().unwrap_or_default();
    if groups.len() > GROUP_LISTINGS_MAX {
        return Err(malformed(
            WHAT,
            format!("more than {GROUP_LISTINGS_MAX} groups"),
        ));
    }
    groups
        .iter()
        .map(|g| {
            Ok(GroupListing {
                group_id: g
                    .group_id()
                    .filter(|id| !id.is_empty())
                    .ok_or_else(|| malformed(WHAT, "a group without an id"))?
                    .to_owned(),
                state: g.state().unwrap_or_default().to_owned(),
                members: g.members(),
            })
        })
        .collect()
}

pub fn describe_group_request(group_id: &str) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let group_id = Some(fbb.create_string(group_id));
    let request =
        wire::DescribeGroupRequest::create(&mut fbb, &wire::DescribeGroupRequestArgs { group_id });
    finish(fbb, request)
}

/// Everything but `partitions`, which is left empty for `Admin` to fill.
pub fn describe_group_response(body: &[u8]) -> Result<GroupDescription> {
    const WHAT: &str = "describe group response";
    let response = root::<wire::DescribeGroupResponse>(body, WHAT)?;
    check_error(response.error_code(), response.error_message())?;
    let members = response.members().unwrap_or_default();
    if members.len() > GROUP_MEMBERS_MAX {
        return Err(malformed(
            WHAT,
            format!("more than {GROUP_MEMBERS_MAX} members"),
        ));
    }
    let members = members
        .iter()
        .map(|m| {
            Ok(GroupMemberDescription {
                member_id: m
                    .member_id()
                    .filter(|id| !id.is_empty())
                    .ok_or_else(|| malformed(WHAT, "a member without an id"))?
                    .to_owned(),
                instance_id: optional_string(m.instance_id()),
                client_id: m.client_id().unwrap_or_default().to_owned(),
                client_host: m.client_host().unwrap_or_default().to_owned(),
                member_epoch: MemberEpoch(m.member_epoch()),
                state: m.state().unwrap_or_default().to_owned(),
                subscribed_topics: strings_from(m.subscribed_topics()),
                assigned: topic_partitions_from(m.assigned(), WHAT)?,
                pending_revocation: topic_partitions_from(m.pending_revocation(), WHAT)?,
                target: topic_partitions_from(m.target(), WHAT)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(GroupDescription {
        group_id: response.group_id().unwrap_or_default().to_owned(),
        state: response.state().unwrap_or_default().to_owned(),
        group_epoch: GroupEpoch(response.group_epoch()),
        target_epoch: GroupEpoch(response.target_epoch()),
        assignor: response.assignor().unwrap_or_default().to_owned(),
        members,
        offsets: committed_from(response.offsets(), WHAT)?,
        partitions: Vec::new(),
    })
}

pub fn delete_group_request(group_id: &str) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let group_id = Some(fbb.create_string(group_id));
    let request =
        wire::DeleteGroupRequest::create(&mut fbb, &wire::DeleteGroupRequestArgs { group_id });
    finish(fbb, request)
}

pub fn delete_group_response(body: &[u8]) -> Result<()> {
    let response = root::<wire::DeleteGroupResponse>(body, "delete group response")?;
    check_error(response.error_code(), response.error_message())
}

pub fn delete_group_offsets_request(group_id: &str, topic: &str) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let group_id = Some(fbb.create_string(group_id));
    let topic = Some(fbb.create_string(topic));
    let request = wire::DeleteGroupOffsetsRequest::create(
        &mut fbb,
        &wire::DeleteGroupOffsetsRequestArgs { group_id, topic },
    );
    finish(fbb, request)
}

pub fn delete_group_offsets_response(body: &[u8]) -> Result<()> {
    let response = root::<wire::DeleteGroupOffsetsResponse>(body, "delete group offsets response")?;
    check_error(response.error_code(), response.error_message())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(topic: &str, partition: i32) -> TopicPartition {
        TopicPartition::new(topic, partition)
    }

    /// Builds a `[TopicPartitions]` the way a coordinator would.
    fn wire_partitions<'a>(
        fbb: &mut FlatBufferBuilder<'a>,
        list: &[(&str, &[i32])],
    ) -> WIPOffset<TopicPartitionsVector<'a>> {
        let entries: Vec<_> = list
            .iter()
            .map(|(topic, partitions)| {
                let topic = Some(fbb.create_string(topic));
                let partitions = Some(fbb.create_vector(partitions));
                wire::TopicPartitions::create(fbb, &wire::TopicPartitionsArgs { topic, partitions })
            })
            .collect();
        fbb.create_vector(&entries)
    }

    fn heartbeat_answer(error: ErrorCode, assignment: &[(&str, &[i32])]) -> Vec<u8> {
        let mut fbb = FlatBufferBuilder::new();
        let assignment = Some(wire_partitions(&mut fbb, assignment));
        let member_id = Some(fbb.create_string("m1"));
        let error_message = Some(fbb.create_string("why"));
        let response = wire::GroupHeartbeatResponse::create(
            &mut fbb,
            &wire::GroupHeartbeatResponseArgs {
                error_code: error.code(),
                error_message,
                member_id,
                member_epoch: 7,
                heartbeat_interval_ms: 1_500,
                assignment,
            },
        );
        finish(fbb, response)
    }

    #[test]
    fn heartbeat_request_carries_what_the_member_sets() {
        // Proves the heartbeat builder writes every field, groups owned
        // partitions by topic, and leaves "unchanged" fields absent rather
        // than empty (an empty owned list means "owns nothing").
        let request = HeartbeatRequest {
            group_id: "g".into(),
            member_id: "m1".into(),
            member_epoch: MemberEpoch(3),
            instance_id: Some("host-1".into()),
            client_id: "c".into(),
            session_timeout_ms: 6_000,
            rebalance_timeout_ms: 60_000,
            subscribed_topics: Some(vec!["a".into(), "b".into()]),
            assignor: None,
            owned: Some(vec![tp("a", 0), tp("b", 2), tp("a", 1)]),
        };
        let body = group_heartbeat_request(&request);
        let decoded = flatbuffers::root::<wire::GroupHeartbeatRequest>(&body).unwrap();
        assert_eq!(decoded.group_id(), Some("g"));
        assert_eq!(decoded.member_id(), Some("m1"));
        assert_eq!(decoded.member_epoch(), 3);
        assert_eq!(decoded.instance_id(), Some("host-1"));
        assert_eq!(decoded.session_timeout_ms(), 6_000);
        assert_eq!(decoded.rebalance_timeout_ms(), 60_000);
        assert_eq!(strings_from(decoded.subscribed_topics()), vec!["a", "b"]);
        assert!(decoded.assignor().is_none());
        let owned = topic_partitions_from(decoded.owned(), "test").unwrap();
        assert_eq!(
            owned.into_iter().collect::<Vec<_>>(),
            vec![tp("a", 0), tp("a", 1), tp("b", 2)]
        );
        assert_eq!(decoded.owned().unwrap().len(), 2, "one entry per topic");

        let leave = HeartbeatRequest {
            member_epoch: MemberEpoch::LEAVE,
            instance_id: None,
            subscribed_topics: None,
            owned: None,
            ..request.clone()
        };
        let body = group_heartbeat_request(&leave);
        let decoded = flatbuffers::root::<wire::GroupHeartbeatRequest>(&body).unwrap();
        assert_eq!(decoded.member_epoch(), -1);
        assert!(decoded.owned().is_none() && decoded.subscribed_topics().is_none());
        assert!(decoded.instance_id().is_none());
        let join = HeartbeatRequest {
            owned: Some(Vec::new()),
            ..request
        };
        let body = group_heartbeat_request(&join);
        let decoded = flatbuffers::root::<wire::GroupHeartbeatRequest>(&body).unwrap();
        assert_eq!(decoded.owned().map(|o| o.len()), Some(0));
    }

    #[test]
    fn heartbeat_response_decodes_and_fails_cleanly() {
        // Proves the answer decodes into the member's whole assignment, an
        // error code becomes a broker error with its message, and bad input
        // (negative partition, garbage) is a malformed response.
        let answer = group_heartbeat_response(&heartbeat_answer(
            ErrorCode::None,
            &[("a", &[1, 0]), ("b", &[3])],
        ))
        .unwrap();
        assert_eq!(answer.member_id, "m1");
        assert_eq!(answer.member_epoch, MemberEpoch(7));
        assert_eq!(answer.heartbeat_interval_ms, 1_500);
        assert_eq!(
            answer.assignment.into_iter().collect::<Vec<_>>(),
            vec![tp("a", 0), tp("a", 1), tp("b", 3)]
        );
        match group_heartbeat_response(&heartbeat_answer(ErrorCode::FencedMemberEpoch, &[])) {
            Err(ClientError::Broker { code, message }) => {
                assert_eq!(code, ErrorCode::FencedMemberEpoch);
                assert_eq!(message.as_deref(), Some("why"));
            }
            other => panic!("expected a broker error, got {other:?}"),
        }
        assert!(matches!(
            group_heartbeat_response(&heartbeat_answer(ErrorCode::None, &[("a", &[-1])])),
            Err(ClientError::MalformedResponse(_))
        ));
        assert!(matches!(
            group_heartbeat_response(&heartbeat_answer(ErrorCode::None, &[("", &[0])])),
            Err(ClientError::MalformedResponse(_))
        ));
        assert!(matches!(
            group_heartbeat_response(b"\x01\x02"),
            Err(ClientError::MalformedResponse(_))
        ));
        let mut fbb = FlatBufferBuilder::new();
        let empty = wire::GroupHeartbeatResponse::create(
            &mut fbb,
            &wire::GroupHeartbeatResponseArgs {
                member_epoch: 2,
                ..Default::default()
            },
        );
        let answer = group_heartbeat_response(&finish(fbb, empty)).unwrap();
        assert!(answer.assignment.is_empty(), "absent is empty");
    }

    #[test]
    fn find_coordinator_round_trip() {
        // Proves the request names the group, the answer becomes the shard
        // endpoint, and a missing endpoint or COORDINATOR_NOT_AVAILABLE are
        // told apart (malformed vs retriable).
        let body = find_coordinator_request("billing", CoordinatorKey::Group);
        let decoded = flatbuffers::root::<wire::FindCoordinatorRequest>(&body).unwrap();
        assert_eq!(decoded.group_id(), Some("billing"));
        assert_eq!(decoded.key_type(), 0);
        let body = find_coordinator_request("etl-1", CoordinatorKey::Transaction);
        let decoded = flatbuffers::root::<wire::FindCoordinatorRequest>(&body).unwrap();
        assert_eq!((decoded.group_id(), decoded.key_type()), (Some("etl-1"), 1));
        let answer = |error: ErrorCode, host: Option<&str>, port: u16| {
            let mut fbb = FlatBufferBuilder::new();
            let host = host.map(|h| fbb.create_string(h));
            let response = wire::FindCoordinatorResponse::create(
                &mut fbb,
                &wire::FindCoordinatorResponseArgs {
                    error_code: error.code(),
                    error_message: None,
                    node_id: 2,
                    host,
                    port,
                    shard: 3,
                },
            );
            finish(fbb, response)
        };
        let info =
            find_coordinator_response(&answer(ErrorCode::None, Some("10.0.0.2"), 9103)).unwrap();
        assert_eq!(info.address(), "10.0.0.2:9103");
        assert_eq!((info.node_id, info.shard), (2, 3));
        assert!(matches!(
            find_coordinator_response(&answer(ErrorCode::None, None, 9103)),
            Err(ClientError::MalformedResponse(_))
        ));
        assert!(matches!(
            find_coordinator_response(&answer(ErrorCode::None, Some("h"), 0)),
            Err(ClientError::MalformedResponse(_))
        ));
        let unavailable =
            find_coordinator_response(&answer(ErrorCode::CoordinatorNotAvailable, None, 0))
                .unwrap_err();
        assert!(unavailable.is_retriable());
    }

    #[test]
    fn offset_commit_and_fetch_round_trip() {
        // Proves commits are grouped by topic with the member's id and epoch
        // (or a tool's empty id and -1), and that fetched offsets of -1
        // (nothing committed) are left out.
        let offsets: BTreeMap<TopicPartition, i64> =
            [(tp("a", 0), 5), (tp("a", 1), 6), (tp("b", 0), 7)].into();
        let body = offset_commit_request("g", "m1", MemberEpoch(4), &offsets);
        let decoded = flatbuffers::root::<wire::OffsetCommitRequest>(&body).unwrap();
        assert_eq!(decoded.member_id(), Some("m1"));
        assert_eq!(decoded.member_epoch(), 4);
        let mut seen = BTreeMap::new();
        for topic in decoded.topics().unwrap() {
            for p in topic.partitions().unwrap() {
                seen.insert(tp(topic.name().unwrap(), p.partition()), p.offset());
            }
        }
        assert_eq!(seen, offsets);
        assert_eq!(decoded.topics().unwrap().len(), 2);
        let tool = offset_commit_request("g", "", MemberEpoch::LEAVE, &offsets);
        let decoded = flatbuffers::root::<wire::OffsetCommitRequest>(&tool).unwrap();
        assert_eq!(
            (decoded.member_id(), decoded.member_epoch()),
            (Some(""), -1)
        );

        let body = offset_fetch_request("g", Some(&[tp("a", 0)]));
        let decoded = flatbuffers::root::<wire::OffsetFetchRequest>(&body).unwrap();
        assert_eq!(decoded.topics().unwrap().len(), 1);
        let all = offset_fetch_request("g", None);
        assert!(flatbuffers::root::<wire::OffsetFetchRequest>(&all)
            .unwrap()
            .topics()
            .is_none());

        let mut fbb = FlatBufferBuilder::new();
        let committed: Vec<_> = [(0, 5), (1, -1)]
            .iter()
            .map(|&(partition, offset)| {
                let metadata = Some(fbb.create_string("meta"));
                wire::CommittedOffset::create(
                    &mut fbb,
                    &wire::CommittedOffsetArgs {
                        partition,
                        offset,
                        metadata,
                        commit_time_ms: 99,
                    },
                )
            })
            .collect();
        let partitions = Some(fbb.create_vector(&committed));
        let name = Some(fbb.create_string("a"));
        let topic =
            wire::CommittedTopic::create(&mut fbb, &wire::CommittedTopicArgs { name, partitions });
        let topics = Some(fbb.create_vector(&[topic]));
        let response = wire::OffsetFetchResponse::create(
            &mut fbb,
            &wire::OffsetFetchResponseArgs {
                error_code: 0,
                error_message: None,
                topics,
            },
        );
        let fetched = offset_fetch_response(&finish(fbb, response)).unwrap();
        assert_eq!(fetched.len(), 1);
        let committed = &fetched[&tp("a", 0)];
        assert_eq!(
            (
                committed.offset,
                committed.metadata.as_str(),
                committed.commit_time_ms
            ),
            (5, "meta", 99)
        );

        let mut fbb = FlatBufferBuilder::new();
        let error_message = Some(fbb.create_string("member epoch 3 is stale"));
        let response = wire::OffsetCommitResponse::create(
            &mut fbb,
            &wire::OffsetCommitResponseArgs {
                error_code: ErrorCode::StaleMemberEpoch.code(),
                error_message,
            },
        );
        let error = offset_commit_response(&finish(fbb, response)).unwrap_err();
        assert!(
            !error.is_retriable(),
            "a stale epoch is surfaced, not retried"
        );
    }

    #[test]
    fn group_admin_answers_decode() {
        // Proves ListGroups and DescribeGroup answers decode into the
        // client's types (members, their partitions, committed offsets), and
        // that the delete answers map their error codes.
        let mut fbb = FlatBufferBuilder::new();
        let listings: Vec<_> = [("g1", "stable", 2u32), ("g2", "empty", 0)]
            .iter()
            .map(|&(id, state, members)| {
                let group_id = Some(fbb.create_string(id));
                let state = Some(fbb.create_string(state));
                wire::GroupListing::create(
                    &mut fbb,
                    &wire::GroupListingArgs {
                        group_id,
                        state,
                        members,
                    },
                )
            })
            .collect();
        let groups = Some(fbb.create_vector(&listings));
        let response = wire::ListGroupsResponse::create(
            &mut fbb,
            &wire::ListGroupsResponseArgs {
                error_code: 0,
                error_message: None,
                groups,
            },
        );
        let groups = list_groups_response(&finish(fbb, response)).unwrap();
        assert_eq!(groups.len(), 2);
        assert_eq!(
            groups[0],
            GroupListing {
                group_id: "g1".into(),
                state: "stable".into(),
                members: 2
            }
        );

        let mut fbb = FlatBufferBuilder::new();
        let assigned = Some(wire_partitions(&mut fbb, &[("t", &[0, 1])]));
        let pending_revocation = Some(wire_partitions(&mut fbb, &[("t", &[2])]));
        let target = Some(wire_partitions(&mut fbb, &[("t", &[0, 1])]));
        let subscribed = [fbb.create_string("t")];
        let subscribed_topics = Some(fbb.create_vector(&subscribed));
        let member_id = Some(fbb.create_string("m1"));
        let client_id = Some(fbb.create_string("c"));
        let state = Some(fbb.create_string("unrevoked_partitions"));
        let member = wire::GroupMember::create(
            &mut fbb,
            &wire::GroupMemberArgs {
                member_id,
                instance_id: None,
                client_id,
                client_host: None,
                member_epoch: 4,
                state,
                subscribed_topics,
                assigned,
                pending_revocation,
                target,
            },
        );
        let members = Some(fbb.create_vector(&[member]));
        let group_id = Some(fbb.create_string("g1"));
        let state = Some(fbb.create_string("reconciling"));
        let assignor = Some(fbb.create_string("sticky"));
        let response = wire::DescribeGroupResponse::create(
            &mut fbb,
            &wire::DescribeGroupResponseArgs {
                error_code: 0,
                error_message: None,
                group_id,
                state,
                group_epoch: 5,
                target_epoch: 5,
                assignor,
                members,
                offsets: None,
            },
        );
        let description = describe_group_response(&finish(fbb, response)).unwrap();
        assert_eq!(description.group_epoch, GroupEpoch(5));
        assert_eq!(description.assignor, "sticky");
        let member = &description.members[0];
        assert_eq!(member.member_epoch, MemberEpoch(4));
        assert_eq!(member.instance_id, None);
        assert_eq!(member.subscribed_topics, vec!["t"]);
        assert_eq!(member.assigned.len(), 2);
        assert_eq!(
            description.owner_of(&tp("t", 2)),
            Some("m1"),
            "revoking still owns"
        );
        assert_eq!(description.owner_of(&tp("t", 3)), None);
        assert!(description.offsets.is_empty() && description.partitions.is_empty());

        for (build, decode) in [
            (
                delete_group_request("g") as Vec<u8>,
                delete_group_response as fn(&[u8]) -> Result<()>,
            ),
            (
                delete_group_offsets_request("g", "t"),
                delete_group_offsets_response,
            ),
        ] {
            assert!(!build.is_empty());
            let mut fbb = FlatBufferBuilder::new();
            let response = wire::DeleteGroupResponse::create(
                &mut fbb,
                &wire::DeleteGroupResponseArgs {
                    error_code: ErrorCode::NonEmptyGroup.code(),
                    error_message: None,
                },
            );
            let body = finish(fbb, response);
            assert!(matches!(
                decode(&body),
                Err(ClientError::Broker {
                    code: ErrorCode::NonEmptyGroup,
                    ..
                })
            ));
        }
    }
}
