//! Produce: each partition's batch goes to its owning shard (directly when it
//! is this one), which validates, appends and, for acks=all, waits until the
//! write is durable under the partition's flush policy.

use std::rc::Rc;

use protocol::flatbuffers::FlatBufferBuilder;
use protocol::frame::payload_range;
use protocol::{wire, ErrorCode};

use super::{finish, parse, HandlerResult, Reply};
use crate::partition::PartitionKey;
use crate::runtime;
use crate::shard::{OpError, ProduceOutcome, Shard, ShardOp, ShardReply};

type PartitionTask = (i32, runtime::Task<Result<ProduceOutcome, OpError>>);

/// Partitions in one produce request.
pub const PRODUCE_PARTITIONS_MAX: usize = 10_000;

/// `frame` holds `payload`: batches are taken from it as shared slices, not copied.
pub(super) async fn handle(
    shard: &Rc<Shard>,
    body: &[u8],
    frame: &bytes::Bytes,
    payload: &[u8],
) -> HandlerResult {
    let request = parse::<wire::ProduceRequest>(body)?;
    let acks = request.acks();
    // acks=all waits for the in-sync replicas at most this long.
    let timeout_ms = u64::try_from(request.timeout_ms().max(1)).unwrap_or(1);
    if !matches!(acks, -1..=1) {
        return Err(format!("acks {acks} is not 0, 1 or -1"));
    }
    let mut work: Vec<(String, Vec<PartitionTask>)> = Vec::new();
    let mut count = 0;
    for topic in request.topics().ok_or("no topics")? {
        let name = topic.name().unwrap_or_default().to_owned();
        let mut tasks = Vec::new();
        for partition in topic.partitions().ok_or("no partitions")? {
            count += 1;
            if count > PRODUCE_PARTITIONS_MAX {
                return Err(format!("more than {PRODUCE_PARTITIONS_MAX} partitions"));
            }
            let index = partition.partition();
            let range = partition.records().ok_or("partition without records")?;
            let batch = payload_range(payload, range.offset(), range.length())
                .ok_or("records range outside the payload")?;
            let owner = shard.owner(&name, index);
            let (shard, key, batch) = (
                shard.clone(),
                PartitionKey {
                    topic: name.clone(),
                    partition: index,
                },
                frame.slice_ref(batch),
            );
            let internal = crate::shard::is_internal_topic(&name);
            tasks.push((
                index,
                runtime::spawn(async move {
                    if internal {
                        // Only coordinators write there.
                        return Err(OpError::new(
                            ErrorCode::PolicyViolation,
                            format!("{} is internal: clients do not produce to it", key.topic),
                        ));
                    }
                    let owner = owner?;
                    match shard
                        .call(
                            owner,
                            ShardOp::Produce {
                                key,
                                batch,
                                acks,
                                timeout_ms,
                            },
                        )
                        .await
                    {
                        ShardReply::Produce(result) => result,
                        other => Err(OpError::new(
                            ErrorCode::Unknown,
                            format!("unexpected reply {other:?}"),
                        )),
                    }
                }),
            ));
        }
        work.push((name, tasks));
    }
    let mut fbb = FlatBufferBuilder::new();
    let mut topics = Vec::new();
    for (name, tasks) in work {
        let mut results = Vec::new();
        for (index, task) in tasks {
            let result = task.await;
            let (code, message, outcome) = match result {
                Ok(o) => (0, None, Some(o)),
                Err(e) => (e.code.code(), Some(fbb.create_string(&e.message)), None),
            };
            results.push(wire::ProducePartitionResult::create(
                &mut fbb,
                &wire::ProducePartitionResultArgs {
                    partition: index,
                    error_code: code,
                    error_message: message,
                    base_offset: outcome.as_ref().map_or(-1, |o| o.base_offset.0),
                    log_start_offset: outcome.as_ref().map_or(-1, |o| o.log_start_offset.0),
                    log_end_offset: outcome.as_ref().map_or(-1, |o| o.log_end_offset.0),
                },
            ));
        }
        let name = fbb.create_string(&name);
        let partitions = fbb.create_vector(&results);
        topics.push(wire::ProduceTopicResult::create(
            &mut fbb,
            &wire::ProduceTopicResultArgs {
                name: Some(name),
                partitions: Some(partitions),
            },
        ));
    }
    if acks == 0 {
        return Ok(Reply::None);
    }
    let topics = fbb.create_vector(&topics);
    let root = wire::ProduceResponse::create(
        &mut fbb,
        &wire::ProduceResponseArgs {
            topics: Some(topics),
        },
    );
    Ok(Reply::Body {
        body: finish(fbb, root),
        payload: Vec::new(),
    })
}
