//! The serialization boundary: builds request bodies and decodes response
//! bodies between flatbuffers and the client's own types. The only file of
//! the library that names `protocol::wire`; it performs no I/O.

use bytes::Bytes;
use protocol::flatbuffers::{self, FlatBufferBuilder, WIPOffset};
use protocol::frame::payload_range;
use protocol::{wire, ErrorCode};

use crate::admin::{PartitionDescription, TopicDescription, TopicSummary};
use crate::error::{ClientError, Result};
use crate::metadata::{
    BrokerMetadata, ClusterMetadata, PartitionMetadata, ShardEndpoint, TopicMetadata,
};

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
        },
    );
    finish(fbb, request)
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

pub fn list_offsets_request(topic: &str, partitions: &[(i32, i64)]) -> Vec<u8> {
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
    let request =
        wire::ListOffsetsRequest::create(&mut fbb, &wire::ListOffsetsRequestArgs { topics });
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
