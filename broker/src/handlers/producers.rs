//! InitProducerId: any broker gives an idempotent producer a new producer
//! id, from the block this broker holds (see `shard::producer_ids`); a
//! transactional producer's request goes to its id's coordinator
//! (`txn_coordinator`).

use std::rc::Rc;

use protocol::flatbuffers::FlatBufferBuilder;
use protocol::{wire, ProducerEpoch};

use super::{finish, parse, HandlerResult, Reply};
use crate::shard::Shard;

pub(super) async fn init_producer_id(shard: &Rc<Shard>, body: &[u8]) -> HandlerResult {
    let request = parse::<wire::InitProducerIdRequest>(body)?;
    let transactional_id = request.transactional_id().unwrap_or_default();
    let result = if transactional_id.is_empty() {
        shard
            .init_producer_id()
            .await
            .map(|id| (id, ProducerEpoch(0)))
    } else {
        super::txn_coordinator::init_producer_id(
            shard,
            transactional_id,
            request.transaction_timeout_ms(),
        )
        .await
    };
    let mut fbb = FlatBufferBuilder::new();
    let (error_code, message, producer_id, producer_epoch) = match result {
        Ok((id, epoch)) => (0, None, id.0, epoch.0),
        Err(e) => (e.code.code(), Some(fbb.create_string(&e.message)), -1, -1),
    };
    let root = wire::InitProducerIdResponse::create(
        &mut fbb,
        &wire::InitProducerIdResponseArgs {
            error_code,
            error_message: message,
            producer_id,
            producer_epoch,
        },
    );
    Ok(Reply::Body {
        body: finish(fbb, root),
        payload: Vec::new(),
    })
}
