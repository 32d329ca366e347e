//! RegisterBroker and BrokerHeartbeat: a broker's session with the controller.

use super::*;

pub fn encode_register_broker_request(request: &RegisterBroker) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let endpoints = encode_endpoints(&mut fbb, &request.endpoints);
    let root = wire::RegisterBrokerRequest::create(
        &mut fbb,
        &wire::RegisterBrokerRequestArgs {
            broker_id: request.broker_id.0,
            endpoints: Some(endpoints),
            incarnation_id: request.incarnation_id,
        },
    );
    finish(fbb, root)
}

pub fn decode_register_broker_request(body: &[u8]) -> Result<RegisterBroker, WireError> {
    let r = flatbuffers::root::<wire::RegisterBrokerRequest>(body)?;
    Ok(RegisterBroker {
        broker_id: BrokerId(r.broker_id()),
        endpoints: decode_endpoints(r.endpoints())?,
        incarnation_id: r.incarnation_id(),
    })
}

pub fn encode_register_broker_response(result: &Result<Registered, ApiFailure>) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let e = error_fields(&mut fbb, result);
    let ok = result.as_ref().ok();
    let root = wire::RegisterBrokerResponse::create(
        &mut fbb,
        &wire::RegisterBrokerResponseArgs {
            error_code: e.code,
            error_message: e.message,
            leader_endpoint: e.leader_endpoint,
            broker_epoch: ok.map_or(0, |r| r.broker_epoch.0),
            session_timeout_ms: ok.map_or(0, |r| r.session_timeout_ms),
        },
    );
    finish(fbb, root)
}

pub fn decode_register_broker_response(
    body: &[u8],
) -> Result<Result<Registered, ApiFailure>, WireError> {
    let r = flatbuffers::root::<wire::RegisterBrokerResponse>(body)?;
    if let Some(f) = failure(r.error_code(), r.error_message(), r.leader_endpoint()) {
        return Ok(Err(f));
    }
    Ok(Ok(Registered {
        broker_epoch: BrokerEpoch(r.broker_epoch()),
        session_timeout_ms: r.session_timeout_ms(),
    }))
}

pub fn encode_broker_heartbeat_request(request: &BrokerHeartbeat) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let root = wire::BrokerHeartbeatRequest::create(
        &mut fbb,
        &wire::BrokerHeartbeatRequestArgs {
            broker_id: request.broker_id.0,
            broker_epoch: request.broker_epoch.0,
            ready: request.ready,
            want_shutdown: request.want_shutdown,
        },
    );
    finish(fbb, root)
}

pub fn decode_broker_heartbeat_request(body: &[u8]) -> Result<BrokerHeartbeat, WireError> {
    let r = flatbuffers::root::<wire::BrokerHeartbeatRequest>(body)?;
    Ok(BrokerHeartbeat {
        broker_id: BrokerId(r.broker_id()),
        broker_epoch: BrokerEpoch(r.broker_epoch()),
        ready: r.ready(),
        want_shutdown: r.want_shutdown(),
    })
}

pub fn encode_broker_heartbeat_response(result: &Result<SessionState, ApiFailure>) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let e = error_fields(&mut fbb, result);
    let state = match result {
        Ok(SessionState::Alive) => wire::BrokerSessionState::Alive,
        Ok(SessionState::Fenced) => wire::BrokerSessionState::Fenced,
        Ok(SessionState::Unregistered) | Err(_) => wire::BrokerSessionState::Unregistered,
    };
    let root = wire::BrokerHeartbeatResponse::create(
        &mut fbb,
        &wire::BrokerHeartbeatResponseArgs {
            error_code: e.code,
            error_message: e.message,
            leader_endpoint: e.leader_endpoint,
            state,
        },
    );
    finish(fbb, root)
}

pub fn decode_broker_heartbeat_response(
    body: &[u8],
) -> Result<Result<SessionState, ApiFailure>, WireError> {
    let r = flatbuffers::root::<wire::BrokerHeartbeatResponse>(body)?;
    if let Some(f) = failure(r.error_code(), r.error_message(), r.leader_endpoint()) {
        return Ok(Err(f));
    }
    Ok(Ok(match r.state() {
        wire::BrokerSessionState::Alive => SessionState::Alive,
        wire::BrokerSessionState::Fenced => SessionState::Fenced,
        _ => SessionState::Unregistered,
    }))
}
