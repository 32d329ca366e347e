//! AllocateProducerIds: a broker takes the next block of producer ids.

use super::*;

/// Ids in one block: a broker hands them out without asking again.
pub const PRODUCER_ID_BLOCK_COUNT_MAX: u32 = 1_000_000;

pub fn encode_allocate_producer_ids_request(request: &AllocateProducerIds) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let root = wire::AllocateProducerIdsRequest::create(
        &mut fbb,
        &wire::AllocateProducerIdsRequestArgs {
            broker_id: request.broker_id.0,
            broker_epoch: request.broker_epoch.0,
        },
    );
    finish(fbb, root)
}

pub fn decode_allocate_producer_ids_request(body: &[u8]) -> Result<AllocateProducerIds, WireError> {
    let r = flatbuffers::root::<wire::AllocateProducerIdsRequest>(body)?;
    Ok(AllocateProducerIds {
        broker_id: BrokerId(r.broker_id()),
        broker_epoch: BrokerEpoch(r.broker_epoch()),
    })
}

pub fn encode_allocate_producer_ids_response(
    result: &Result<ProducerIdBlock, ApiFailure>,
) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let e = error_fields(&mut fbb, result);
    let block = result.as_ref().ok();
    let root = wire::AllocateProducerIdsResponse::create(
        &mut fbb,
        &wire::AllocateProducerIdsResponseArgs {
            error_code: e.code,
            error_message: e.message,
            leader_endpoint: e.leader_endpoint,
            first_producer_id: block.map_or(-1, |b| b.first),
            count: block.map_or(0, |b| b.count),
        },
    );
    finish(fbb, root)
}

pub fn decode_allocate_producer_ids_response(
    body: &[u8],
) -> Result<Result<ProducerIdBlock, ApiFailure>, WireError> {
    let r = flatbuffers::root::<wire::AllocateProducerIdsResponse>(body)?;
    if let Some(f) = failure(r.error_code(), r.error_message(), r.leader_endpoint()) {
        return Ok(Err(f));
    }
    let first = r.first_producer_id();
    if first < 0 {
        return Err(WireError::OutOfRange {
            field: "first_producer_id",
            value: first,
        });
    }
    let count = r.count();
    if count == 0 || count > PRODUCER_ID_BLOCK_COUNT_MAX {
        return Err(WireError::OutOfRange {
            field: "count",
            value: i64::from(count),
        });
    }
    if first.checked_add(i64::from(count)).is_none() {
        return Err(WireError::OutOfRange {
            field: "first_producer_id",
            value: first,
        });
    }
    Ok(Ok(ProducerIdBlock { first, count }))
}
