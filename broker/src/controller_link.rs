//! The broker's session with the controller quorum: register at start, then
//! heartbeat at a third of the session timeout so the controller keeps the
//! broker alive (unfenced); register again when told the session is gone, and
//! follow NOT_CONTROLLER answers to the leader. Runs as one task on shard 0.
//!
//! Following metadata deltas (and leading or following partitions as they
//! say) is the next step; until then the broker keeps its single-node topic
//! metadata and this link only makes it a registered, live cluster member.

use std::net::{SocketAddr, ToSocketAddrs};
use std::rc::Rc;
use std::time::Duration;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use protocol::api::ControllerApiKey;
use protocol::flatbuffers::{self, FlatBufferBuilder};
use protocol::frame::{
    decode_response, encode_request, frame_len, RequestHeader, LENGTH_PREFIX_BYTES,
};
use protocol::{wire, ErrorCode};

use crate::runtime::net::{connect, ReadHalf, WriteHalf};
use crate::runtime::{self};
use crate::shard::Shard;

/// Bound on a controller's response frame.
const RESPONSE_BYTES_MAX: u32 = 4 << 20;
/// Connect and request timeout towards a controller.
const CONTROLLER_REQUEST_MS_MAX: u64 = 3_000;
/// Wait before trying the next controller after a failure.
const RETRY_BACKOFF_MS: u64 = 200;

#[derive(Debug, thiserror::Error)]
enum LinkError {
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("timed out")]
    Timeout,
    #[error("malformed response: {0}")]
    Malformed(String),
    #[error("not the controller leader; leader is {0:?}")]
    NotController(Option<String>),
    #[error("controller error {0}: {1}")]
    Refused(ErrorCode, String),
}

struct Connection {
    reader: ReadHalf,
    writer: WriteHalf,
    next_correlation_id: u32,
}

impl Connection {
    async fn open(addr: SocketAddr) -> Result<Connection, LinkError> {
        let (reader, writer) =
            connect(addr, Duration::from_millis(CONTROLLER_REQUEST_MS_MAX)).await?;
        Ok(Connection {
            reader,
            writer,
            next_correlation_id: 1,
        })
    }

    async fn call(&mut self, api: ControllerApiKey, body: &[u8]) -> Result<Vec<u8>, LinkError> {
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1);
        let mut frame = Vec::new();
        let header = RequestHeader {
            api_key: api as u16,
            api_version: 0,
            correlation_id,
            client_id: "ringlog-broker".into(),
        };
        encode_request(&mut frame, &header, body, &[]);
        let exchange = async {
            self.writer.write_all(&frame).await?;
            self.writer.flush().await?;
            let mut prefix = [0u8; LENGTH_PREFIX_BYTES];
            self.reader.read_exact(&mut prefix).await?;
            let len = frame_len(prefix, RESPONSE_BYTES_MAX)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            let mut response = vec![0u8; len];
            self.reader.read_exact(&mut response).await?;
            Ok::<_, std::io::Error>(response)
        };
        let response = runtime::timeout(Duration::from_millis(CONTROLLER_REQUEST_MS_MAX), exchange)
            .await
            .ok_or(LinkError::Timeout)??;
        let decoded =
            decode_response(&response).map_err(|e| LinkError::Malformed(e.to_string()))?;
        if decoded.correlation_id != correlation_id {
            return Err(LinkError::Malformed("correlation id mismatch".into()));
        }
        Ok(decoded.body.to_vec())
    }
}

/// Checks an answer's error code; NOT_CONTROLLER carries the leader's endpoint.
fn check(code: u16, message: Option<&str>, leader: Option<&str>) -> Result<(), LinkError> {
    match ErrorCode::from_u16(code) {
        ErrorCode::None => Ok(()),
        ErrorCode::NotController => Err(LinkError::NotController(
            leader.filter(|l| !l.is_empty()).map(str::to_owned),
        )),
        other => Err(LinkError::Refused(
            other,
            message.unwrap_or_default().to_owned(),
        )),
    }
}

fn register_body(shard: &Shard) -> Vec<u8> {
    let config = &shard.config;
    let mut fbb = FlatBufferBuilder::new();
    let client = fbb.create_string(&format!(
        "{}:{}",
        config.advertised_host,
        config.listen.port()
    ));
    let shard_endpoints: Vec<_> = (0..shard.count)
        .map(|i| {
            fbb.create_string(&format!(
                "{}:{}",
                config.advertised_host,
                config.shard_port(i)
            ))
        })
        .collect();
    let shards = fbb.create_vector(&shard_endpoints);
    let endpoints = wire::BrokerEndpointSet::create(
        &mut fbb,
        &wire::BrokerEndpointSetArgs {
            client: Some(client),
            shards: Some(shards),
        },
    );
    let root = wire::RegisterBrokerRequest::create(
        &mut fbb,
        &wire::RegisterBrokerRequestArgs {
            broker_id: config.node_id as u32,
            endpoints: Some(endpoints),
        },
    );
    fbb.finish_minimal(root);
    fbb.finished_data().to_vec()
}

fn heartbeat_body(broker_id: u32, broker_epoch: u64) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let root = wire::BrokerHeartbeatRequest::create(
        &mut fbb,
        &wire::BrokerHeartbeatRequestArgs {
            broker_id,
            broker_epoch,
            ready: true,
        },
    );
    fbb.finish_minimal(root);
    fbb.finished_data().to_vec()
}

/// Registration: the broker epoch and the heartbeat interval.
async fn register(
    connection: &mut Connection,
    shard: &Shard,
) -> Result<(u64, Duration), LinkError> {
    let body = connection
        .call(ControllerApiKey::RegisterBroker, &register_body(shard))
        .await?;
    let response = flatbuffers::root::<wire::RegisterBrokerResponse>(&body)
        .map_err(|e| LinkError::Malformed(e.to_string()))?;
    check(
        response.error_code(),
        response.error_message(),
        response.leader_endpoint(),
    )?;
    let interval = Duration::from_millis((response.session_timeout_ms() / 3).max(50));
    Ok((response.broker_epoch(), interval))
}

/// Runs the session until the shard stops: register, heartbeat, and start
/// over on any failure, against whichever controller leads.
pub async fn run(shard: Rc<Shard>, controllers: Vec<String>) {
    assert!(
        !controllers.is_empty(),
        "started only with controllers configured"
    );
    let broker_id = shard.config.node_id as u32;
    let mut next_target: Option<String> = None;
    // The first turn of the loop moves to controllers[0].
    let mut index = controllers.len() - 1;
    while !shard.stopping.get() {
        let target = next_target.take().unwrap_or_else(|| {
            index = (index + 1) % controllers.len();
            controllers[index].clone()
        });
        match session(&shard, broker_id, &target).await {
            Ok(()) => return,
            Err(LinkError::NotController(Some(leader))) => next_target = Some(leader),
            Err(e) => {
                tracing::warn!(controller = %target, error = %e, "controller session failed; retrying");
                runtime::sleep(Duration::from_millis(RETRY_BACKOFF_MS)).await;
            }
        }
    }
}

async fn session(shard: &Rc<Shard>, broker_id: u32, target: &str) -> Result<(), LinkError> {
    let addr = target
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| LinkError::Malformed(format!("{target} resolves to nothing")))?;
    let mut connection = Connection::open(addr).await?;
    let (mut epoch, interval) = register(&mut connection, shard).await?;
    tracing::info!(controller = %target, broker_epoch = epoch, "registered with the controller");
    while !shard.stopping.get() {
        let body = connection
            .call(
                ControllerApiKey::BrokerHeartbeat,
                &heartbeat_body(broker_id, epoch),
            )
            .await?;
        let response = flatbuffers::root::<wire::BrokerHeartbeatResponse>(&body)
            .map_err(|e| LinkError::Malformed(e.to_string()))?;
        check(
            response.error_code(),
            response.error_message(),
            response.leader_endpoint(),
        )?;
        if response.state() == wire::BrokerSessionState::Unregistered {
            let (new_epoch, _) = register(&mut connection, shard).await?;
            tracing::info!(
                broker_epoch = new_epoch,
                "registered again after the session ended"
            );
            epoch = new_epoch;
        }
        runtime::sleep(interval).await;
    }
    Ok(())
}
