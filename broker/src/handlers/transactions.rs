//! WriteTxnMarkers: a transaction coordinator has this broker write commit
//! or abort markers to the partitions it leads; each is answered once
//! replicated to the in-sync replicas.

use std::rc::Rc;

use bytes::Bytes;
use protocol::flatbuffers::FlatBufferBuilder;
use protocol::record_batch::marker::{build_marker_batch, MarkerKind, TxnMarker};
use protocol::{wire, ErrorCode, ProducerEpoch, ProducerId};

use super::{finish, parse, HandlerResult, Reply};
use crate::partition::PartitionKey;
use crate::runtime;
use crate::shard::{OpError, Shard, ShardOp, ShardReply};

/// Partitions one WriteTxnMarkers request may name, over all its markers.
pub const TXN_MARKER_PARTITIONS_MAX: usize = 10_000;

/// Longest wait for a marker's replication a request may ask for.
pub const TXN_MARKER_TIMEOUT_MS_MAX: u64 = 300_000;

struct Wanted {
    marker_index: usize,
    topic: String,
    partition: i32,
}

pub(super) async fn write_txn_markers(shard: &Rc<Shard>, body: &[u8]) -> HandlerResult {
    let request = parse::<wire::WriteTxnMarkersRequest>(body)?;
    let timeout_ms = u64::try_from(request.timeout_ms().max(0))
        .unwrap_or(0)
        .min(TXN_MARKER_TIMEOUT_MS_MAX);
    let now_ms = shard.clock().now_ms();
    let mut producers = Vec::new();
    let mut wanted = Vec::new();
    let mut tasks = Vec::new();
    for (marker_index, m) in request.markers().ok_or("no markers")?.iter().enumerate() {
        if m.producer_id() < 0 || m.producer_epoch() < 0 {
            return Err("a marker needs a producer id and epoch".into());
        }
        let marker = TxnMarker {
            kind: if m.commit() {
                MarkerKind::Commit
            } else {
                MarkerKind::Abort
            },
            coordinator_epoch: m.coordinator_epoch(),
            transaction_number: m.transaction_number().max(0),
        };
        let batch = Bytes::from(build_marker_batch(
            ProducerId(m.producer_id()),
            ProducerEpoch(m.producer_epoch()),
            marker,
            now_ms,
        ));
        producers.push(m.producer_id());
        for topic in m.topics().iter().flatten() {
            let name = topic.name().unwrap_or_default().to_owned();
            for partition in topic.partitions().iter().flatten() {
                if wanted.len() == TXN_MARKER_PARTITIONS_MAX {
                    return Err(format!(
                        "more than {TXN_MARKER_PARTITIONS_MAX} marker partitions"
                    ));
                }
                let key = PartitionKey {
                    topic: name.clone(),
                    partition,
                };
                tasks.push(runtime::spawn(write_one(
                    shard.clone(),
                    key,
                    batch.clone(),
                    timeout_ms,
                )));
                wanted.push(Wanted {
                    marker_index,
                    topic: name.clone(),
                    partition,
                });
            }
        }
    }
    let mut results = Vec::with_capacity(tasks.len());
    for task in tasks {
        results.push(task.await);
    }
    Ok(build_response(&producers, &wanted, results))
}

async fn write_one(
    shard: Rc<Shard>,
    key: PartitionKey,
    batch: Bytes,
    timeout_ms: u64,
) -> Result<(), OpError> {
    let owner = shard.owner(&key.topic, key.partition)?;
    let op = ShardOp::WriteMarker {
        key,
        batch,
        timeout_ms,
    };
    match shard.call(owner, op).await {
        ShardReply::Produce(outcome) => outcome.map(|_| ()),
        other => Err(OpError::new(
            ErrorCode::Unknown,
            format!("unexpected reply {other:?}"),
        )),
    }
}

fn build_response(
    producers: &[i64],
    wanted: &[Wanted],
    results: Vec<Result<(), OpError>>,
) -> Reply {
    let mut fbb = FlatBufferBuilder::new();
    let mut markers = Vec::with_capacity(producers.len());
    for (marker_index, producer_id) in producers.iter().enumerate() {
        // Partitions of this marker, grouped by topic in request order.
        let mut topics: Vec<(&str, Vec<_>)> = Vec::new();
        for (w, result) in wanted.iter().zip(&results) {
            if w.marker_index != marker_index {
                continue;
            }
            let (error_code, message) = match result {
                Ok(()) => (0, None),
                Err(e) => (e.code.code(), Some(fbb.create_string(&e.message))),
            };
            let entry = wire::TxnMarkerPartitionResult::create(
                &mut fbb,
                &wire::TxnMarkerPartitionResultArgs {
                    partition: w.partition,
                    error_code,
                    error_message: message,
                },
            );
            match topics.last_mut() {
                Some((name, entries)) if *name == w.topic => entries.push(entry),
                _ => topics.push((&w.topic, vec![entry])),
            }
        }
        let topics: Vec<_> = topics
            .into_iter()
            .map(|(name, entries)| {
                let name = fbb.create_string(name);
                let partitions = fbb.create_vector(&entries);
                wire::TxnMarkerTopicResult::create(
                    &mut fbb,
                    &wire::TxnMarkerTopicResultArgs {
                        name: Some(name),
                        partitions: Some(partitions),
                    },
                )
            })
            .collect();
        let topics = fbb.create_vector(&topics);
        markers.push(wire::TxnMarkerResult::create(
            &mut fbb,
            &wire::TxnMarkerResultArgs {
                producer_id: *producer_id,
                topics: Some(topics),
            },
        ));
    }
    let markers = fbb.create_vector(&markers);
    let root = wire::WriteTxnMarkersResponse::create(
        &mut fbb,
        &wire::WriteTxnMarkersResponseArgs {
            markers: Some(markers),
        },
    );
    Reply::Body {
        body: finish(fbb, root),
        payload: Vec::new(),
    }
}
