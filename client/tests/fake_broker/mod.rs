//! An in-process fake broker on 127.0.0.1 for the client tests: a tokio
//! listener per "shard" that decodes request frames and answers Metadata,
//! Produce, Fetch, ListOffsets and DescribeTopic with flatbuffers built here,
//! storing batches in memory. Knobs let a test fail produces, hold and
//! reverse responses, or close a connection.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use protocol::flatbuffers::FlatBufferBuilder;
use protocol::frame::{decode_request, encode_response, frame_len, payload_range};
use protocol::record_batch::stamp;
use protocol::{wire, ApiKey, ErrorCode, LeaderEpoch, Offset, RecordBatch};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Stored batches of one partition, each stamped with its base offset.
#[derive(Debug, Default)]
pub struct PartitionLog {
    pub batches: Vec<Vec<u8>>,
    pub log_end_offset: i64,
}

impl PartitionLog {
    pub fn append(&mut self, batch: &[u8]) -> i64 {
        let parsed = RecordBatch::parse(batch, 1 << 24).expect("valid batch from the client");
        let base = self.log_end_offset;
        let mut stored = batch.to_vec();
        stamp(&mut stored, Offset(base), LeaderEpoch(0));
        self.log_end_offset = base + i64::from(parsed.header().last_offset_delta) + 1;
        self.batches.push(stored);
        base
    }

    /// Every (offset, timestamp, value) stored, in order.
    pub fn records(&self) -> Vec<(i64, i64, Vec<u8>)> {
        let mut out = Vec::new();
        for batch in &self.batches {
            let batch = RecordBatch::parse(batch, 1 << 24).unwrap();
            let section = batch.records_section(1 << 24).unwrap();
            for record in section.iter() {
                let record = record.unwrap();
                out.push((
                    record.offset.0,
                    record.timestamp_ms,
                    record.value.unwrap_or_default().to_vec(),
                ));
            }
        }
        out
    }
}

#[derive(Debug, Default)]
pub struct FakeState {
    pub partitions: BTreeMap<(String, i32), PartitionLog>,
    /// Produce requests to answer with NOT_LEADER_OR_FOLLOWER before succeeding.
    pub produce_failures_remaining: u32,
    pub produce_requests: u32,
    pub metadata_requests: u32,
    /// InitProducerId answers given (the last id handed out).
    pub producer_ids_given: i64,
    /// (listener index, partition) of every produced batch: shows routing.
    pub produce_routes: Vec<(usize, i32)>,
    /// DescribeTopic responses are held until this many are pending, then
    /// written in reverse order.
    pub hold_describe_responses: usize,
    /// Most requests seen on one connection before any was answered.
    pub held_requests_max: usize,
}

pub struct FakeBroker {
    pub addresses: Vec<String>,
    pub state: Arc<Mutex<FakeState>>,
    topic_partitions: Vec<(String, i32)>,
}

impl FakeBroker {
    /// Starts `shards` listeners; partition p of each topic lives on shard p % shards.
    pub async fn start(topics: &[(&str, i32)], shards: usize) -> FakeBroker {
        let state = Arc::new(Mutex::new(FakeState::default()));
        let mut topic_partitions = Vec::new();
        for (name, count) in topics {
            for p in 0..*count {
                topic_partitions.push((name.to_string(), p));
                state
                    .lock()
                    .unwrap()
                    .partitions
                    .insert((name.to_string(), p), PartitionLog::default());
            }
        }
        let mut listeners = Vec::new();
        let mut addresses = Vec::new();
        for _ in 0..shards {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            addresses.push(listener.local_addr().unwrap().to_string());
            listeners.push(listener);
        }
        let broker = FakeBroker {
            addresses: addresses.clone(),
            state: Arc::clone(&state),
            topic_partitions,
        };
        let shared = Arc::new(ListenerContext {
            ports: addresses
                .iter()
                .map(|a| a.rsplit_once(':').unwrap().1.parse().unwrap())
                .collect(),
            state,
            topics: topics.iter().map(|(n, c)| (n.to_string(), *c)).collect(),
        });
        for (index, listener) in listeners.into_iter().enumerate() {
            let shared = Arc::clone(&shared);
            tokio::spawn(async move {
                loop {
                    let (stream, _) = listener.accept().await.unwrap();
                    tokio::spawn(serve(stream, index, Arc::clone(&shared)));
                }
            });
        }
        broker
    }

    pub fn bootstrap(&self) -> String {
        self.addresses[0].clone()
    }

    pub fn records(&self, topic: &str, partition: i32) -> Vec<(i64, i64, Vec<u8>)> {
        self.state.lock().unwrap().partitions[&(topic.to_string(), partition)].records()
    }

    pub fn total_records(&self) -> usize {
        self.topic_partitions
            .iter()
            .map(|(t, p)| self.records(t, *p).len())
            .sum()
    }
}

struct ListenerContext {
    ports: Vec<u16>,
    state: Arc<Mutex<FakeState>>,
    topics: Vec<(String, i32)>,
}

async fn serve(mut stream: TcpStream, listener_index: usize, context: Arc<ListenerContext>) {
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut unanswered = 0usize;
    loop {
        let mut prefix = [0u8; 4];
        if stream.read_exact(&mut prefix).await.is_err() {
            return;
        }
        let len = frame_len(prefix, 64 << 20).unwrap();
        let mut frame = vec![0u8; len];
        stream.read_exact(&mut frame).await.unwrap();
        let request = decode_request(&frame).unwrap();
        let correlation_id = request.header.correlation_id;
        unanswered += 1;
        {
            let mut state = context.state.lock().unwrap();
            state.held_requests_max = state.held_requests_max.max(unanswered);
        }
        let api = request.header.api().unwrap();
        let answer = match api {
            ApiKey::Metadata => Some((metadata(&context), Vec::new())),
            ApiKey::Produce => produce(&context, listener_index, request.body, request.payload),
            ApiKey::Fetch => Some(fetch(&context, request.body)),
            ApiKey::ListOffsets => Some((list_offsets(&context, request.body), Vec::new())),
            ApiKey::InitProducerId => Some((init_producer_id(&context), Vec::new())),
            ApiKey::DescribeTopic => {
                let name = protocol::flatbuffers::root::<wire::DescribeTopicRequest>(request.body)
                    .unwrap()
                    .name()
                    .unwrap()
                    .to_string();
                if name == "close-connection" {
                    return;
                }
                let body = describe_echo(&name);
                let hold = context.state.lock().unwrap().hold_describe_responses;
                if hold > 1 {
                    let mut out = Vec::new();
                    encode_response(&mut out, correlation_id, &body, &[]);
                    held.push(out);
                    if held.len() == hold {
                        for response in held.drain(..).rev() {
                            stream.write_all(&response).await.unwrap();
                        }
                        unanswered = 0;
                    }
                    continue;
                }
                Some((body, Vec::new()))
            }
            other => panic!("the fake broker does not answer {other:?}"),
        };
        let Some((body, payload)) = answer else {
            unanswered -= 1; // acks=0: no response at all.
            continue;
        };
        let mut out = Vec::new();
        encode_response(&mut out, correlation_id, &body, &[&payload]);
        if stream.write_all(&out).await.is_err() {
            return;
        }
        unanswered -= 1;
    }
}

/// A new producer id per request, as a broker hands them out.
fn init_producer_id(context: &ListenerContext) -> Vec<u8> {
    let producer_id = {
        let mut state = context.state.lock().unwrap();
        state.producer_ids_given += 1;
        state.producer_ids_given
    };
    let mut fbb = FlatBufferBuilder::new();
    let root = wire::InitProducerIdResponse::create(
        &mut fbb,
        &wire::InitProducerIdResponseArgs {
            error_code: 0,
            error_message: None,
            producer_id,
            producer_epoch: 0,
        },
    );
    fbb.finish(root, None);
    fbb.finished_data().to_vec()
}

fn metadata(context: &ListenerContext) -> Vec<u8> {
    context.state.lock().unwrap().metadata_requests += 1;
    let mut fbb = FlatBufferBuilder::new();
    let shards: Vec<_> = context
        .ports
        .iter()
        .enumerate()
        .map(|(shard, port)| {
            let host = Some(fbb.create_string("127.0.0.1"));
            wire::ShardEndpoint::create(
                &mut fbb,
                &wire::ShardEndpointArgs {
                    shard: shard as u16,
                    host,
                    port: *port,
                },
            )
        })
        .collect();
    let shards = Some(fbb.create_vector(&shards));
    let host = Some(fbb.create_string("127.0.0.1"));
    let broker = wire::BrokerInfo::create(
        &mut fbb,
        &wire::BrokerInfoArgs {
            node_id: 1,
            host,
            port: context.ports[0],
            shards,
        },
    );
    let brokers = Some(fbb.create_vector(&[broker]));
    let topics: Vec<_> = context
        .topics
        .iter()
        .map(|(name, count)| {
            let partitions: Vec<_> = (0..*count)
                .map(|p| {
                    let replicas = Some(fbb.create_vector(&[1i32]));
                    let isr = Some(fbb.create_vector(&[1i32]));
                    wire::PartitionInfo::create(
                        &mut fbb,
                        &wire::PartitionInfoArgs {
                            partition: p,
                            error_code: 0,
                            leader: 1,
                            leader_epoch: 0,
                            shard: (p as usize % context.ports.len()) as u16,
                            replicas,
                            isr,
                        },
                    )
                })
                .collect();
            let partitions = Some(fbb.create_vector(&partitions));
            let name = Some(fbb.create_string(name));
            wire::TopicInfo::create(
                &mut fbb,
                &wire::TopicInfoArgs {
                    name,
                    error_code: 0,
                    partitions,
                },
            )
        })
        .collect();
    let topics = Some(fbb.create_vector(&topics));
    let response = wire::MetadataResponse::create(
        &mut fbb,
        &wire::MetadataResponseArgs {
            brokers,
            controller_id: 1,
            topics,
        },
    );
    fbb.finish(response, None);
    fbb.finished_data().to_vec()
}

fn produce(
    context: &ListenerContext,
    listener_index: usize,
    body: &[u8],
    payload: &[u8],
) -> Option<(Vec<u8>, Vec<u8>)> {
    let request = protocol::flatbuffers::root::<wire::ProduceRequest>(body).unwrap();
    let mut state = context.state.lock().unwrap();
    state.produce_requests += 1;
    let fail = state.produce_failures_remaining > 0 && request.acks() != 0;
    if fail {
        state.produce_failures_remaining -= 1;
    }
    let mut fbb = FlatBufferBuilder::new();
    let mut topics = Vec::new();
    for topic in request.topics().unwrap() {
        let name = topic.name().unwrap().to_string();
        let mut results = Vec::new();
        for p in topic.partitions().unwrap() {
            let range = p.records().unwrap();
            let batch = payload_range(payload, range.offset(), range.length()).unwrap();
            let (error_code, base_offset) = if fail {
                (ErrorCode::NotLeaderOrFollower.code(), -1)
            } else {
                state.produce_routes.push((listener_index, p.partition()));
                let log = state
                    .partitions
                    .get_mut(&(name.clone(), p.partition()))
                    .unwrap();
                (0, log.append(batch))
            };
            results.push(wire::ProducePartitionResult::create(
                &mut fbb,
                &wire::ProducePartitionResultArgs {
                    partition: p.partition(),
                    error_code,
                    error_message: None,
                    base_offset,
                    log_start_offset: 0,
                    log_end_offset: -1,
                },
            ));
        }
        let partitions = Some(fbb.create_vector(&results));
        let name = Some(fbb.create_string(&name));
        topics.push(wire::ProduceTopicResult::create(
            &mut fbb,
            &wire::ProduceTopicResultArgs { name, partitions },
        ));
    }
    if request.acks() == 0 {
        return None;
    }
    let topics = Some(fbb.create_vector(&topics));
    let response = wire::ProduceResponse::create(&mut fbb, &wire::ProduceResponseArgs { topics });
    fbb.finish(response, None);
    Some((fbb.finished_data().to_vec(), Vec::new()))
}

fn fetch(context: &ListenerContext, body: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let request = protocol::flatbuffers::root::<wire::FetchRequest>(body).unwrap();
    let state = context.state.lock().unwrap();
    let mut fbb = FlatBufferBuilder::new();
    let mut payload = Vec::new();
    let mut topics = Vec::new();
    for topic in request.topics().unwrap() {
        let name = topic.name().unwrap().to_string();
        let mut results = Vec::new();
        for p in topic.partitions().unwrap() {
            let log = &state.partitions[&(name.clone(), p.partition())];
            let start = payload.len() as u32;
            let error_code = if p.fetch_offset() > log.log_end_offset || p.fetch_offset() < 0 {
                ErrorCode::OffsetOutOfRange.code()
            } else {
                // Whole batches from the one holding fetch_offset: it may start below it.
                for batch in &log.batches {
                    let header = RecordBatch::parse(batch, 1 << 24)
                        .unwrap()
                        .header()
                        .to_owned();
                    if header.next_offset().0 > p.fetch_offset()
                        && (payload.len() - start as usize) < p.max_bytes() as usize
                    {
                        payload.extend_from_slice(batch);
                    }
                }
                0
            };
            let records = wire::ByteRange::new(start, payload.len() as u32 - start);
            results.push(wire::FetchPartitionResult::create(
                &mut fbb,
                &wire::FetchPartitionResultArgs {
                    partition: p.partition(),
                    error_code,
                    high_watermark: log.log_end_offset,
                    log_start_offset: 0,
                    log_end_offset: log.log_end_offset,
                    records: Some(&records),
                    diverging_epoch: -1,
                    diverging_end_offset: -1,
                    last_stable_offset: log.log_end_offset,
                    aborted_transactions: None,
                },
            ));
        }
        let partitions = Some(fbb.create_vector(&results));
        let name = Some(fbb.create_string(&name));
        topics.push(wire::FetchTopicResult::create(
            &mut fbb,
            &wire::FetchTopicResultArgs { name, partitions },
        ));
    }
    let topics = Some(fbb.create_vector(&topics));
    let response = wire::FetchResponse::create(&mut fbb, &wire::FetchResponseArgs { topics });
    fbb.finish(response, None);
    (fbb.finished_data().to_vec(), payload)
}

fn list_offsets(context: &ListenerContext, body: &[u8]) -> Vec<u8> {
    let request = protocol::flatbuffers::root::<wire::ListOffsetsRequest>(body).unwrap();
    let state = context.state.lock().unwrap();
    let mut fbb = FlatBufferBuilder::new();
    let mut topics = Vec::new();
    for topic in request.topics().unwrap() {
        let name = topic.name().unwrap().to_string();
        let mut results = Vec::new();
        for p in topic.partitions().unwrap() {
            let log = &state.partitions[&(name.clone(), p.partition())];
            let offset = match p.timestamp_ms() {
                -2 => 0,
                -1 => log.log_end_offset,
                ts => log
                    .records()
                    .iter()
                    .find(|(_, timestamp, _)| *timestamp >= ts)
                    .map_or(-1, |(offset, _, _)| *offset),
            };
            results.push(wire::ListOffsetsPartitionResult::create(
                &mut fbb,
                &wire::ListOffsetsPartitionResultArgs {
                    partition: p.partition(),
                    error_code: 0,
                    offset,
                },
            ));
        }
        let partitions = Some(fbb.create_vector(&results));
        let name = Some(fbb.create_string(&name));
        topics.push(wire::ListOffsetsTopicResult::create(
            &mut fbb,
            &wire::ListOffsetsTopicResultArgs { name, partitions },
        ));
    }
    let topics = Some(fbb.create_vector(&topics));
    let response =
        wire::ListOffsetsResponse::create(&mut fbb, &wire::ListOffsetsResponseArgs { topics });
    fbb.finish(response, None);
    fbb.finished_data().to_vec()
}

/// A DescribeTopic answer that echoes the requested name, so a test can
/// check each response reached the request that asked for it.
fn describe_echo(name: &str) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let name = Some(fbb.create_string(name));
    let response = wire::DescribeTopicResponse::create(
        &mut fbb,
        &wire::DescribeTopicResponseArgs {
            name,
            partitions: 1,
            replication_factor: 1,
            ..Default::default()
        },
    );
    fbb.finish(response, None);
    fbb.finished_data().to_vec()
}
