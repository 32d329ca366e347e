//! Fetch: reads each requested partition on its owning shard, in request order
//! and within the room the response bound leaves. If the first pass
//! finds fewer than `min_bytes`, every empty partition is asked again with a
//! wait, and the response goes out as soon as enough data arrived anywhere or
//! `max_wait_ms` passed. Batches travel in the payload exactly as stored.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use protocol::flatbuffers::FlatBufferBuilder;
use protocol::{wire, BrokerId, ErrorCode, LeaderEpoch, Offset};

use super::{finish, parse, HandlerResult, Reply};
use crate::partition::PartitionKey;
use crate::runtime::{self, Watermark};
use crate::shard::{
    FetchOutcome, Isolation, OpError, ReplicaFetch, Shard, ShardOp, ShardReply, UNKNOWN_OFFSET,
};

/// Partitions in one fetch request.
pub const FETCH_PARTITIONS_MAX: usize = 10_000;

struct Wanted {
    topic_index: usize,
    key: PartitionKey,
    offset: Offset,
    max_bytes: usize,
    replica: Option<ReplicaFetch>,
    isolation: Isolation,
}

async fn fetch_one(
    shard: Rc<Shard>,
    key: PartitionKey,
    offset: Offset,
    max_bytes: usize,
    wait_ms: u64,
    replica: Option<ReplicaFetch>,
    isolation: Isolation,
) -> FetchOutcome {
    let owner = match shard.owner(&key.topic, key.partition) {
        Ok(owner) => owner,
        Err(e) => {
            return FetchOutcome {
                error: Some(e),
                high_watermark: UNKNOWN_OFFSET,
                log_start_offset: UNKNOWN_OFFSET,
                log_end_offset: UNKNOWN_OFFSET,
                last_stable_offset: UNKNOWN_OFFSET,
                ..FetchOutcome::default()
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
                replica,
                isolation,
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
        .min(shard.config().fetch_wait_ms_max);
    let min_bytes = request.min_bytes().max(0) as usize;
    let response_bytes_max = request.max_bytes().max(1) as usize;
    let replica_id = request.replica_id();
    let isolation = Isolation::from_wire(request.isolation_level());
    let mut names = Vec::new();
    let mut wanted = Vec::new();
    for (topic_index, topic) in request.topics().ok_or("no topics")?.iter().enumerate() {
        let name = topic.name().unwrap_or_default().to_owned();
        for partition in topic.partitions().ok_or("no partitions")? {
            if wanted.len() == FETCH_PARTITIONS_MAX {
                return Err(format!("more than {FETCH_PARTITIONS_MAX} partitions"));
            }
            let max_bytes = (partition.max_bytes().max(1) as usize).min(response_bytes_max);
            let replica = u32::try_from(replica_id)
                .ok()
                .map(|broker_id| ReplicaFetch {
                    broker_id: BrokerId(broker_id),
                    broker_epoch: protocol::BrokerEpoch::from_wire(request.replica_epoch()),
                    current_leader_epoch: LeaderEpoch(partition.current_leader_epoch()),
                    last_fetched_epoch: LeaderEpoch(partition.last_fetched_epoch()),
                });
            wanted.push(Wanted {
                topic_index,
                key: PartitionKey {
                    topic: name.clone(),
                    partition: partition.partition(),
                },
                offset: Offset(partition.fetch_offset()),
                max_bytes,
                replica,
                isolation,
            });
        }
        names.push(name);
    }
    let deadline = shard.clock().monotonic() + Duration::from_millis(max_wait_ms);
    // In request order, each partition within what the response still has
    // room for, as Kafka's fetch does: a reader catching up from disk reads
    // no bytes the response would drop (with every partition read at once
    // up to its own bound, half of what a catch-up read from disk was
    // thrown away), and at most one disk read per request is in flight, so
    // readers cannot queue the device deep enough to starve appends. A
    // partition past the room is asked for its state only; clients rotate
    // the order so each partition gets its turn first.
    let mut outcomes = Vec::with_capacity(wanted.len());
    let mut room_bytes = response_bytes_max;
    for w in &wanted {
        let max_bytes = w.max_bytes.min(room_bytes);
        let outcome = fetch_one(
            shard.clone(),
            w.key.clone(),
            w.offset,
            max_bytes,
            0,
            w.replica,
            w.isolation,
        )
        .await;
        room_bytes = room_bytes.saturating_sub(outcome.records.len());
        outcomes.push(outcome);
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
    deadline: Duration,
) {
    let arrived: Rc<RefCell<Vec<(usize, FetchOutcome)>>> = Rc::default();
    let bytes = Rc::new(Watermark::new(0));
    let finished = Rc::new(Cell::new(0usize));
    let mut tasks = Vec::new();
    for (i, w) in wanted.iter().enumerate() {
        if !outcomes[i].records.is_empty()
            || outcomes[i].error.is_some()
            || outcomes[i].diverging.is_some()
        {
            continue;
        }
        let wait_ms = deadline
            .saturating_sub(shard.clock().monotonic())
            .as_millis() as u64;
        let (shard, key, arrived, bytes, finished) = (
            shard.clone(),
            w.key.clone(),
            arrived.clone(),
            bytes.clone(),
            finished.clone(),
        );
        let (offset, max_bytes, replica, isolation) =
            (w.offset, w.max_bytes, w.replica, w.isolation);
        tasks.push(runtime::spawn(async move {
            let outcome =
                fetch_one(shard, key, offset, max_bytes, wait_ms, replica, isolation).await;
            let got = outcome.records.len() as i64;
            arrived.borrow_mut().push((i, outcome));
            finished.set(finished.get() + 1);
            // Waking with +1 even for empty results lets the handler notice that all finished.
            bytes.advance(bytes.get() + got.max(1));
        }));
    }
    let already: usize = outcomes.iter().map(|o| o.records.len()).sum();
    let need = min_bytes.saturating_sub(already) as i64;
    loop {
        let remaining = deadline.saturating_sub(shard.clock().monotonic());
        if finished.get() == tasks.len() || remaining.is_zero() {
            break;
        }
        let target = bytes.get() + 1;
        runtime::timeout(remaining, bytes.wait_at_least(target)).await;
        let got: usize = arrived.borrow().iter().map(|(_, o)| o.records.len()).sum();
        if got as i64 >= need {
            break;
        }
    }
    // The response goes now: partitions still waiting stop (on other shards
    // too, through the mesh) instead of holding their waits to the deadline.
    for task in tasks {
        task.cancel().await;
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
        let aborted = (!outcome.aborted.is_empty()).then(|| {
            let entries: Vec<_> = outcome
                .aborted
                .iter()
                .map(|t| {
                    wire::AbortedTransaction::create(
                        &mut fbb,
                        &wire::AbortedTransactionArgs {
                            producer_id: t.producer_id.0,
                            first_offset: t.first_offset.0,
                        },
                    )
                })
                .collect();
            fbb.create_vector(&entries)
        });
        per_topic[w.topic_index].push(wire::FetchPartitionResult::create(
            &mut fbb,
            &wire::FetchPartitionResultArgs {
                partition: w.key.partition,
                error_code: outcome.error.map_or(0, |e| e.code.code()),
                high_watermark: outcome.high_watermark.0,
                log_start_offset: outcome.log_start_offset.0,
                log_end_offset: outcome.log_end_offset.0,
                records: Some(&range),
                diverging_epoch: outcome.diverging.map_or(-1, |d| d.0 .0),
                diverging_end_offset: outcome.diverging.map_or(-1, |d| d.1 .0),
                last_stable_offset: outcome.last_stable_offset.0,
                aborted_transactions: aborted,
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
