//! Where coordinators live: a consumer group's on the leader of one
//! `__consumer_offsets` partition, a transactional id's on the leader of one
//! `__transaction_state` partition (by the same stable hash of the key).
//! FindCoordinator (any broker; creates the internal topic on first use)
//! answers with that leader's shard endpoint, and requests that reach this
//! broker are routed to the shard that leads the partition.

use std::rc::Rc;

use protocol::flatbuffers::FlatBufferBuilder;
use protocol::{wire, ErrorCode};

use super::metadata::split_endpoint;
use super::{finish, parse, HandlerResult, Reply};
use crate::group::{offsets_partition_for, GROUP_ID_BYTES_MAX, OFFSETS_TOPIC};
use crate::shard::{OpError, Shard, ShardOp, ShardReply, METADATA_SHARD};
use crate::txn::{TRANSACTIONAL_ID_BYTES_MAX, TXN_STATE_TOPIC};

/// Whose coordinator a key names (FindCoordinator's `key_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CoordinatorKind {
    Group,
    Transaction,
}

impl CoordinatorKind {
    fn from_wire(key_type: u8) -> Result<CoordinatorKind, OpError> {
        match key_type {
            0 => Ok(CoordinatorKind::Group),
            1 => Ok(CoordinatorKind::Transaction),
            other => Err(OpError::new(
                ErrorCode::InvalidRequest,
                format!("unknown coordinator key type {other}"),
            )),
        }
    }

    fn topic(self) -> &'static str {
        match self {
            CoordinatorKind::Group => OFFSETS_TOPIC,
            CoordinatorKind::Transaction => TXN_STATE_TOPIC,
        }
    }

    fn ensure_op(self) -> ShardOp {
        match self {
            CoordinatorKind::Group => ShardOp::EnsureOffsetsTopic,
            CoordinatorKind::Transaction => ShardOp::EnsureTxnTopic,
        }
    }

    pub(super) fn check_key(self, key: &str) -> Result<(), OpError> {
        let (max, code, what) = match self {
            CoordinatorKind::Group => (GROUP_ID_BYTES_MAX, ErrorCode::InvalidGroupId, "group id"),
            CoordinatorKind::Transaction => (
                TRANSACTIONAL_ID_BYTES_MAX,
                ErrorCode::InvalidRequest,
                "transactional id",
            ),
        };
        if key.is_empty() || key.len() > max {
            return Err(OpError::new(
                code,
                format!("{what} must be 1..={max} bytes"),
            ));
        }
        Ok(())
    }
}

/// The internal partition holding `key`; `missing` is the error when the
/// topic is not (yet) there.
fn partition_of(
    shard: &Shard,
    kind: CoordinatorKind,
    key: &str,
    missing: ErrorCode,
) -> Result<i32, OpError> {
    kind.check_key(key)?;
    let view = shard.view();
    let topic_name = kind.topic();
    let topic = view
        .topic(topic_name)
        .ok_or_else(|| OpError::new(missing, format!("{topic_name} does not exist yet")))?;
    let count = u32::try_from(topic.partitions.len()).expect("partitions bounded");
    if count == 0 {
        return Err(OpError::new(
            missing,
            format!("{topic_name} has no partitions"),
        ));
    }
    Ok(i32::try_from(offsets_partition_for(key, count).0).expect("bounded"))
}

/// Creates the kind's internal topic if this broker does not know it yet.
async fn ensure_topic(shard: &Rc<Shard>, kind: CoordinatorKind) -> Result<(), OpError> {
    if shard.view().topic(kind.topic()).is_some() {
        return Ok(());
    }
    match shard.call(METADATA_SHARD, kind.ensure_op()).await {
        ShardReply::Ensured(result) => result,
        other => Err(OpError::new(
            ErrorCode::Unknown,
            format!("unexpected reply {other:?}"),
        )),
    }
}

/// The group's `__consumer_offsets` partition (created on first use), for
/// a transaction that commits the group's offsets.
pub(super) async fn offsets_partition(shard: &Rc<Shard>, group_id: &str) -> Result<i32, OpError> {
    ensure_topic(shard, CoordinatorKind::Group).await?;
    partition_of(
        shard,
        CoordinatorKind::Group,
        group_id,
        ErrorCode::CoordinatorNotAvailable,
    )
}

/// The coordinator of `key`: its broker and shard endpoint.
async fn locate(
    shard: &Rc<Shard>,
    kind: CoordinatorKind,
    key: &str,
) -> Result<(i32, String, u16, u16), OpError> {
    kind.check_key(key)?;
    let topic_name = kind.topic();
    ensure_topic(shard, kind).await?;
    let partition = partition_of(shard, kind, key, ErrorCode::CoordinatorNotAvailable)?;
    let view = shard.view();
    let not_available = |why: String| OpError::new(ErrorCode::CoordinatorNotAvailable, why);
    let record = view
        .partition(topic_name, partition)
        .ok_or_else(|| not_available(format!("{topic_name}-{partition} is unknown")))?;
    let leader = record
        .leader
        .ok_or_else(|| not_available(format!("{topic_name}-{partition} has no leader")))?;
    let replica = record.replica_on(leader).ok_or_else(|| {
        not_available(format!("{topic_name}-{partition}: leader without replica"))
    })?;
    let broker = view
        .brokers
        .get(&leader)
        .filter(|b| !b.fenced)
        .ok_or_else(|| not_available(format!("broker {leader} is not live")))?;
    let endpoint = broker
        .endpoints
        .shards
        .get(usize::from(replica.shard.0))
        .ok_or_else(|| not_available(format!("broker {leader} has no shard {}", replica.shard)))?;
    let (host, port) = split_endpoint(endpoint);
    Ok((
        i32::try_from(leader.0).unwrap_or(-1),
        host.to_string(),
        port,
        replica.shard.0,
    ))
}

pub(super) async fn find_coordinator(shard: &Rc<Shard>, body: &[u8]) -> HandlerResult {
    let request = parse::<wire::FindCoordinatorRequest>(body)?;
    let key = request.group_id().unwrap_or_default().to_string();
    let result = match CoordinatorKind::from_wire(request.key_type()) {
        Ok(kind) => locate(shard, kind, &key).await,
        Err(e) => Err(e),
    };
    let mut fbb = FlatBufferBuilder::new();
    let (error_code, message, node_id, host, port, shard_index) = match result {
        Ok((node, host, port, index)) => (0, String::new(), node, host, port, index),
        Err(e) => (e.code.code(), e.message, -1, String::new(), 0, 0),
    };
    let error_message = fbb.create_string(&message);
    let host = fbb.create_string(&host);
    let root = wire::FindCoordinatorResponse::create(
        &mut fbb,
        &wire::FindCoordinatorResponseArgs {
            error_code,
            error_message: Some(error_message),
            node_id,
            host: Some(host),
            port,
            shard: shard_index,
        },
    );
    Ok(Reply::Body {
        body: finish(fbb, root),
        payload: Vec::new(),
    })
}

/// The partition holding `key` and the shard of this broker that holds its
/// replica: where a request for that coordinator runs (the shard answers
/// NOT_COORDINATOR unless it leads the partition).
pub(super) fn coordinator_shard(
    shard: &Shard,
    kind: CoordinatorKind,
    key: &str,
) -> Result<(i32, usize), OpError> {
    let partition = partition_of(shard, kind, key, ErrorCode::NotCoordinator)?;
    let owner = shard
        .owner(kind.topic(), partition)
        .map_err(|e| OpError::new(ErrorCode::NotCoordinator, e.message))?;
    Ok((partition, owner))
}
