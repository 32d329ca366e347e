//! InitProducerId: any broker gives an idempotent producer a new producer
//! id, from the block this broker holds (see `shard::producer_ids`).

use std::rc::Rc;

use protocol::flatbuffers::FlatBufferBuilder;
use protocol::{wire, ErrorCode};

use super::{finish, parse, HandlerResult, Reply};
use crate::shard::{OpError, Shard};

/// Longest transactional id accepted.
pub const TRANSACTIONAL_ID_BYTES_MAX: usize = 255;

pub(super) async fn init_producer_id(shard: &Rc<Shard>, body: &[u8]) -> HandlerResult {
    let request = parse::<wire::InitProducerIdRequest>(body)?;
    let transactional_id = request.transactional_id().unwrap_or_default();
    let result = if transactional_id.len() > TRANSACTIONAL_ID_BYTES_MAX {
        Err(OpError::new(
            ErrorCode::InvalidRequest,
            format!("transactional id longer than {TRANSACTIONAL_ID_BYTES_MAX} bytes"),
        ))
    } else if !transactional_id.is_empty() {
        Err(OpError::new(
            ErrorCode::InvalidRequest,
            "transactional producers are not served by this broker version",
        ))
    } else {
        shard.init_producer_id().await
    };
    let mut fbb = FlatBufferBuilder::new();
    let (error_code, message, producer_id, producer_epoch) = match result {
        Ok(id) => (0, None, id.0, 0),
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
