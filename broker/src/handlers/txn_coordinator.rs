//! The requests a transactional id's coordinator answers (InitProducerId
//! with a transactional id, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
//! DescribeTransaction),
//! routed to the shard that leads the id's `__transaction_state` partition
//! (`coordinators`), and ListTransactions over this broker's coordinators.

use std::rc::Rc;

use protocol::flatbuffers::{FlatBufferBuilder, WIPOffset};
use protocol::{wire, ErrorCode, ProducerEpoch, ProducerId};

use super::coordinators::{coordinator_shard, offsets_partition, CoordinatorKind};
use super::{finish, parse, HandlerResult, Reply};
use crate::group::OFFSETS_TOPIC;
use crate::shard::txn_coordinators::encode_topics;
use crate::shard::{OpError, Shard, ShardOp, ShardReply, TxnAnswer, TxnOp};
use crate::txn::records::TxnMetadata;
use crate::txn::{TopicPartition, TXN_PARTITIONS_MAX};

/// Transactions one ListTransactions answer carries.
pub const LIST_TRANSACTIONS_MAX: usize = 10_000;

/// Runs `op` on the shard of this broker that coordinates `transactional_id`.
async fn on_coordinator(
    shard: &Rc<Shard>,
    transactional_id: &str,
    op: TxnOp,
) -> Result<TxnAnswer, OpError> {
    let (partition, owner) =
        coordinator_shard(shard, CoordinatorKind::Transaction, transactional_id)?;
    match shard.call(owner, ShardOp::Txn { partition, op }).await {
        ShardReply::Txn(result) => result,
        other => Err(OpError::new(
            ErrorCode::Unknown,
            format!("unexpected reply {other:?}"),
        )),
    }
}

/// InitProducerId for a transactional producer.
pub(super) async fn init_producer_id(
    shard: &Rc<Shard>,
    transactional_id: &str,
    timeout_ms: i32,
) -> Result<(ProducerId, ProducerEpoch), OpError> {
    CoordinatorKind::Transaction.check_key(transactional_id)?;
    let timeout_ms = u32::try_from(timeout_ms).map_err(|_| {
        OpError::new(
            ErrorCode::InvalidTransactionTimeout,
            format!("transaction timeout {timeout_ms} ms is negative"),
        )
    })?;
    // Taken before the coordinator runs, in case the id needs a new one
    // (first start, or its epochs are used up); unused ids are skipped.
    let fresh = shard.init_producer_id().await?;
    let op = TxnOp::InitProducerId {
        transactional_id: transactional_id.to_owned(),
        timeout_ms,
        fresh,
    };
    match on_coordinator(shard, transactional_id, op).await? {
        TxnAnswer::Producer(id, epoch) => Ok((id, epoch)),
        other => Err(OpError::new(
            ErrorCode::Unknown,
            format!("unexpected answer {other:?}"),
        )),
    }
}

/// The partitions of `topics`, each checked to exist and not be internal.
fn read_partitions<'a>(
    shard: &Shard,
    topics: Option<
        protocol::flatbuffers::Vector<
            'a,
            protocol::flatbuffers::ForwardsUOffset<wire::TxnMarkerTopic<'a>>,
        >,
    >,
) -> Result<Result<Vec<TopicPartition>, OpError>, String> {
    let mut out = Vec::new();
    let view = shard.view();
    for topic in topics.iter().flatten() {
        let name = topic.name().unwrap_or_default();
        for p in topic.partitions().iter().flatten() {
            if out.len() == TXN_PARTITIONS_MAX {
                return Err(format!("more than {TXN_PARTITIONS_MAX} partitions"));
            }
            let Ok(index) = u32::try_from(p) else {
                return Err(format!("negative partition {p}"));
            };
            if crate::shard::is_internal_topic(name) {
                return Ok(Err(OpError::new(
                    ErrorCode::PolicyViolation,
                    format!("{name} is internal: clients do not write to it"),
                )));
            }
            if view.partition(name, p).is_none() {
                return Ok(Err(OpError::new(
                    ErrorCode::UnknownTopicOrPartition,
                    format!("unknown partition {name}-{p}"),
                )));
            }
            out.push(TopicPartition::new(name, index));
        }
    }
    out.sort();
    out.dedup();
    Ok(Ok(out))
}

/// An answer that is only an error code and message.
fn error_reply<'a, T>(
    result: Result<(), OpError>,
    build: impl FnOnce(&mut FlatBufferBuilder<'a>, u16, WIPOffset<&'a str>) -> WIPOffset<T>,
) -> HandlerResult {
    let (code, message) = match result {
        Ok(()) => (0, String::new()),
        Err(e) => (e.code.code(), e.message),
    };
    let mut fbb = FlatBufferBuilder::new();
    let message = fbb.create_string(&message);
    let root = build(&mut fbb, code, message);
    Ok(Reply::Body {
        body: finish(fbb, root),
        payload: Vec::new(),
    })
}

pub(super) async fn add_partitions(shard: &Rc<Shard>, body: &[u8]) -> HandlerResult {
    let request = parse::<wire::AddPartitionsToTxnRequest>(body)?;
    let transactional_id = request.transactional_id().unwrap_or_default().to_owned();
    let result = match read_partitions(shard, request.topics())? {
        Err(e) => Err(e),
        Ok(partitions) => {
            let op = TxnOp::AddPartitions {
                transactional_id: transactional_id.clone(),
                producer_id: ProducerId(request.producer_id()),
                producer_epoch: ProducerEpoch(request.producer_epoch()),
                partitions,
            };
            on_coordinator(shard, &transactional_id, op)
                .await
                .map(|_| ())
        }
    };
    error_reply(result, |fbb, error_code, message| {
        wire::AddPartitionsToTxnResponse::create(
            fbb,
            &wire::AddPartitionsToTxnResponseArgs {
                error_code,
                error_message: Some(message),
            },
        )
    })
}

pub(super) async fn add_offsets(shard: &Rc<Shard>, body: &[u8]) -> HandlerResult {
    let request = parse::<wire::AddOffsetsToTxnRequest>(body)?;
    let transactional_id = request.transactional_id().unwrap_or_default().to_owned();
    let group_id = request.group_id().unwrap_or_default().to_owned();
    let result = match offsets_partition(shard, &group_id).await {
        Err(e) => Err(e),
        Ok(partition) => {
            let index = u32::try_from(partition).expect("partitions are not negative");
            let op = TxnOp::AddPartitions {
                transactional_id: transactional_id.clone(),
                producer_id: ProducerId(request.producer_id()),
                producer_epoch: ProducerEpoch(request.producer_epoch()),
                partitions: vec![TopicPartition::new(OFFSETS_TOPIC, index)],
            };
            on_coordinator(shard, &transactional_id, op)
                .await
                .map(|_| ())
        }
    };
    error_reply(result, |fbb, error_code, message| {
        wire::AddOffsetsToTxnResponse::create(
            fbb,
            &wire::AddOffsetsToTxnResponseArgs {
                error_code,
                error_message: Some(message),
            },
        )
    })
}

pub(super) async fn end_txn(shard: &Rc<Shard>, body: &[u8]) -> HandlerResult {
    let request = parse::<wire::EndTxnRequest>(body)?;
    let transactional_id = request.transactional_id().unwrap_or_default().to_owned();
    let op = TxnOp::EndTxn {
        transactional_id: transactional_id.clone(),
        producer_id: ProducerId(request.producer_id()),
        producer_epoch: ProducerEpoch(request.producer_epoch()),
        commit: request.commit(),
    };
    let result = on_coordinator(shard, &transactional_id, op)
        .await
        .map(|_| ());
    error_reply(result, |fbb, error_code, message| {
        wire::EndTxnResponse::create(
            fbb,
            &wire::EndTxnResponseArgs {
                error_code,
                error_message: Some(message),
            },
        )
    })
}

fn write_state<'a>(
    fbb: &mut FlatBufferBuilder<'a>,
    transactional_id: &str,
    m: &TxnMetadata,
) -> WIPOffset<wire::TransactionState<'a>> {
    let id = fbb.create_string(transactional_id);
    let state = fbb.create_string(m.state.name());
    let topics = encode_topics(fbb, &m.partitions);
    wire::TransactionState::create(
        fbb,
        &wire::TransactionStateArgs {
            transactional_id: Some(id),
            producer_id: m.producer_id.0,
            producer_epoch: m.producer_epoch.0,
            state: Some(state),
            timeout_ms: i32::try_from(m.timeout_ms).unwrap_or(i32::MAX),
            start_ms: m.start_ms,
            update_ms: m.update_ms,
            topics: Some(topics),
        },
    )
}

pub(super) async fn list(shard: &Rc<Shard>, body: &[u8]) -> HandlerResult {
    let request = parse::<wire::ListTransactionsRequest>(body)?;
    let states: Vec<String> = request
        .states()
        .iter()
        .flatten()
        .map(str::to_owned)
        .collect();
    let mut all = Vec::new();
    for to in 0..shard.count() {
        if let ShardReply::Transactions(list) = shard.call(to, ShardOp::ListTransactions).await {
            all.extend(list);
        }
    }
    all.retain(|(_, m)| states.is_empty() || states.iter().any(|s| s == m.state.name()));
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all.truncate(LIST_TRANSACTIONS_MAX);
    let mut fbb = FlatBufferBuilder::new();
    let items: Vec<_> = all
        .iter()
        .map(|(id, m)| write_state(&mut fbb, id, m))
        .collect();
    let transactions = fbb.create_vector(&items);
    let error_message = fbb.create_string("");
    let root = wire::ListTransactionsResponse::create(
        &mut fbb,
        &wire::ListTransactionsResponseArgs {
            error_code: 0,
            error_message: Some(error_message),
            transactions: Some(transactions),
        },
    );
    Ok(Reply::Body {
        body: finish(fbb, root),
        payload: Vec::new(),
    })
}

pub(super) async fn describe(shard: &Rc<Shard>, body: &[u8]) -> HandlerResult {
    let request = parse::<wire::DescribeTransactionRequest>(body)?;
    let transactional_id = request.transactional_id().unwrap_or_default().to_owned();
    let result = on_coordinator(
        shard,
        &transactional_id,
        TxnOp::Describe(transactional_id.clone()),
    )
    .await;
    let mut fbb = FlatBufferBuilder::new();
    let (error_code, message, transaction) = match &result {
        Ok(TxnAnswer::Described(m)) => (
            0,
            String::new(),
            Some(write_state(&mut fbb, &transactional_id, m)),
        ),
        Ok(other) => (
            ErrorCode::Unknown.code(),
            format!("unexpected answer {other:?}"),
            None,
        ),
        Err(e) => (e.code.code(), e.message.clone(), None),
    };
    let error_message = fbb.create_string(&message);
    let root = wire::DescribeTransactionResponse::create(
        &mut fbb,
        &wire::DescribeTransactionResponseArgs {
            error_code,
            error_message: Some(error_message),
            transaction,
        },
    );
    Ok(Reply::Body {
        body: finish(fbb, root),
        payload: Vec::new(),
    })
}
