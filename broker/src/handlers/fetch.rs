//! Fetch: reads each requested partition on its owning shard. If the first pass
//! finds fewer than `min_bytes`, every empty partition is asked again with a
//! wait, and the response goes out as soon as enough data arrived anywhere or
//! `max_wait_ms` passed. Batches travel in the payload exactly as stored.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use protocol::flatbuffers::FlatBufferBuilder;
use protocol::{wire, ErrorCode};

use super::{finish, parse, HandlerResult, Reply};
use crate::runtime::{self, Watermark};
use crate::shard::{FetchOutcome, OpError, PartitionKey, Shard, ShardOp, ShardReply};

/// Partitions in one fetch request.
pub const FETCH_PARTITIONS_MAX: usize = 10_000;

struct Wanted {
    topic_index: usize,
    key: PartitionKey,
    offset: i64,
    max_bytes: usize,
}

async fn fetch_one(
    shard: Rc<Shard>,
    key: PartitionKey,
    offset: i64,
    max_bytes: usize,
    wait_ms: u64,
) -> FetchOutcome {
    let owner = match shard.owner(&key.topic, key.partition) {
        Ok(owner) => owner,
        Err(e) => {
            return FetchOutcome {
                error: Some(e),
                high_watermark: -1,
                log_start_offset: -1,
                log_end_offset: -1,
                records: Default::default(),
            }
        }
    };
    match shard
        .call(
            owner,
            ShardOp::Fetch {
                key,
                offset,
                max_bytes,
                wait_ms,
            },
        )
        .await
    {
        ShardReply::Fetch(outcome) => outcome,
        other => FetchOutcome {
            error: Some(OpError::new(
                ErrorCode::Unknown,
                format!("unexpected reply {other:?}"),
            )),
            ..FetchOutcome::default()
        },
    }
}

pub(super) async fn handle(shard: &Rc<Shard>, body: &[u8]) -> HandlerResult {
    let request = parse::<wire::FetchRequest>(body)?;
    let max_wait_ms = u64::try_from(request.max_wait_ms().max(0))
        .unwrap_or(0)
        .min(shard.config.fetch_wait_ms_max);
    let min_bytes = request.min_bytes().max(0) as usize;
    let response_bytes_max = request.max_bytes().max(1) as usize;
    let mut names = Vec::new();
    let mut wanted = Vec::new();
    for (topic_index, topic) in request.topics().ok_or("no topics")?.iter().enumerate() {
        let name = topic.name().unwrap_or_default().to_owned();
        for partition in topic.partitions().ok_or("no partitions")? {
            if wanted.len() == FETCH_PARTITIONS_MAX {
                return Err(format!("more than {FETCH_PARTITIONS_MAX} partitions"));
            }
            let max_bytes = (partition.max_bytes().max(1) as usize).min(response_bytes_max);
            wanted.push(Wanted {
                topic_index,
                key: PartitionKey {
                    topic: name.clone(),
                    partition: partition.partition(),
                },
                offset: partition.fetch_offset(),
                max_bytes,
            });
        }
        names.push(name);
    }
    let deadline = Instant::now() + Duration::from_millis(max_wait_ms);
    let first: Vec<_> = wanted
        .iter()
        .map(|w| {
            runtime::spawn(fetch_one(
                shard.clone(),
                w.key.clone(),
                w.offset,
                w.max_bytes,
                0,
            ))
        })
        .collect();
    let mut outcomes = Vec::with_capacity(first.len());
    for task in first {
        outcomes.push(task.await);
    }
    let total = |o: &[FetchOutcome]| o.iter().map(|f| f.records.len()).sum::<usize>();
    if total(&outcomes) < min_bytes.max(1) && max_wait_ms > 0 {
        wait_for_data(shard, &wanted, &mut outcomes, min_bytes.max(1), deadline).await;
    }
    Ok(build_response(
        &names,
        &wanted,
        outcomes,
        response_bytes_max,
    ))
}

/// Asks every partition that returned nothing again, with a wait, and fills in
/// whatever arrives before `deadline` or before `min_bytes` are in hand.
async fn wait_for_data(
    shard: &Rc<Shard>,
    wanted: &[Wanted],
    outcomes: &mut [FetchOutcome],
    min_bytes: usize,
    deadline: Instant,
) {
    let arrived: Rc<RefCell<Vec<(usize, FetchOutcome)>>> = Rc::default();
    let bytes = Rc::new(Watermark::new(0));
    let finished = Rc::new(Cell::new(0usize));
    let mut waiting = 0;
    for (i, w) in wanted.iter().enumerate() {
        if !outcomes[i].records.is_empty() || outcomes[i].error.is_some() {
            continue;
        }
        waiting += 1;
        let wait_ms = deadline
            .saturating_duration_since(Instant::now())
            .as_millis() as u64;
        let (shard, key, arrived, bytes, finished) = (
            shard.clone(),
            w.key.clone(),
            arrived.clone(),
            bytes.clone(),
            finished.clone(),
        );
        let (offset, max_bytes) = (w.offset, w.max_bytes);
        runtime::spawn(async move {
            let outcome = fetch_one(shard, key, offset, max_bytes, wait_ms).await;
            let got = outcome.records.len() as i64;
            arrived.borrow_mut().push((i, outcome));
            finished.set(finished.get() + 1);
            // Waking with +1 even for empty results lets the handler notice that all finished.
            bytes.advance(bytes.get() + got.max(1));
        })
        .detach();
    }
    let already: usize = outcomes.iter().map(|o| o.records.len()).sum();
    let need = min_bytes.saturating_sub(already) as i64;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if finished.get() == waiting || remaining.is_zero() {
            break;
        }
        let target = bytes.get() + 1;
        runtime::timeout(remaining, bytes.wait_at_least(target)).await;
        let got: usize = arrived.borrow().iter().map(|(_, o)| o.records.len()).sum();
        if got as i64 >= need {
            break;
        }
    }
    for (i, outcome) in arrived.borrow_mut().drain(..) {
        outcomes[i] = outcome;
    }
}

fn build_response(
    names: &[String],
    wanted: &[Wanted],
    outcomes: Vec<FetchOutcome>,
    response_bytes_max: usize,
) -> Reply {
    let mut fbb = FlatBufferBuilder::new();
    let mut payload: Vec<bytes::Bytes> = Vec::new();
    let mut payload_len: usize = 0;
    let mut per_topic: Vec<Vec<_>> = vec![Vec::new(); names.len()];
    for (w, mut outcome) in wanted.iter().zip(outcomes) {
        // The response bound: the first non-empty partition always fits.
        if payload_len > 0 && payload_len + outcome.records.len() > response_bytes_max {
            outcome.records.clear();
        }
        let range =
            protocol::wire::ByteRange::new(payload_len as u32, outcome.records.len() as u32);
        payload_len += outcome.records.len();
        if !outcome.records.is_empty() {
            payload.extend(std::mem::take(&mut outcome.records).into_parts());
        }
        per_topic[w.topic_index].push(wire::FetchPartitionResult::create(
            &mut fbb,
            &wire::FetchPartitionResultArgs {
                partition: w.key.partition,
                error_code: outcome.error.map_or(0, |e| e.code.code()),
                high_watermark: outcome.high_watermark,
                log_start_offset: outcome.log_start_offset,
                log_end_offset: outcome.log_end_offset,
                records: Some(&range),
            },
        ));
    }
    let topics: Vec<_> = names
        .iter()
        .zip(per_topic)
        .map(|(name, partitions)| {
            let name = fbb.create_string(name);
            let partitions = fbb.create_vector(&partitions);
            wire::FetchTopicResult::create(
                &mut fbb,
                &wire::FetchTopicResultArgs {
                    name: Some(name),
                    partitions: Some(partitions),
                },
            )
        })
        .collect();
    let topics = fbb.create_vector(&topics);
    let root = wire::FetchResponse::create(
        &mut fbb,
        &wire::FetchResponseArgs {
            topics: Some(topics),
        },
    );
    Reply::Body {
        body: finish(fbb, root),
        payload,
    }
}
