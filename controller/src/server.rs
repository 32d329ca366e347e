//! The controller's one TCP listener: accepts connections (at most
//! `CONNECTIONS_MAX`), reads request frames and dispatches them by api key to
//! the Raft node (controller-to-controller RPCs, JSON bodies) or to
//! `ControllerService` (the broker-facing API, flatbuffers bodies). Requests on
//! one connection are answered one at a time, in order. A malformed frame or
//! body, an unknown api key or an unsupported version closes the connection:
//! there is no response body common to every api to carry an error in.

use std::sync::Arc;
use std::time::Duration;

use protocol::api::ControllerApiKey;
use protocol::frame::{self, RequestHeader};
use protocol::ApiKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::frame_io;
use crate::raft_network::RAFT_FRAME_BYTES_MAX;
use crate::service::ControllerService;
use crate::wire;

/// Bound on open connections (brokers, admin clients and peer controllers).
pub const CONNECTIONS_MAX: usize = 1_024;
/// Bound on the rest of a frame once its length prefix arrived.
pub const FRAME_READ_TIMEOUT_MS_MAX: u64 = 10_000;

#[derive(Debug, thiserror::Error)]
enum ConnectionError {
    #[error(transparent)]
    Io(#[from] frame_io::FrameIoError),
    #[error("frame: {0}")]
    Frame(#[from] protocol::frame::FrameError),
    #[error("unknown api key {0}")]
    UnknownApi(u16),
    #[error("unsupported version {version} of api key {api_key}")]
    UnsupportedVersion { api_key: u16, version: u16 },
    #[error("bad {api} body: {reason}")]
    BadBody { api: &'static str, reason: String },
}

/// Accepts connections until `shutdown` changes, then aborts the open ones.
pub async fn serve(
    listener: TcpListener,
    service: ControllerService,
    mut shutdown: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.changed() => break,
        };
        // Reap finished connection tasks so the set stays bounded too.
        while connections.try_join_next().is_some() {}
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::warn!(%peer, connections_max = CONNECTIONS_MAX, "refusing connection");
            continue;
        };
        let service = service.clone();
        connections.spawn(async move {
            if let Err(error) = connection(stream, &service).await {
                tracing::debug!(%peer, %error, "connection closed");
            }
            drop(permit);
        });
    }
    connections.shutdown().await;
}

async fn connection(
    mut stream: TcpStream,
    service: &ControllerService,
) -> Result<(), ConnectionError> {
    stream
        .set_nodelay(true)
        .map_err(frame_io::FrameIoError::from)?;
    let timeout = Duration::from_millis(FRAME_READ_TIMEOUT_MS_MAX);
    let mut frame = Vec::new();
    let mut out = Vec::new();
    while frame_io::read_frame(&mut stream, RAFT_FRAME_BYTES_MAX, timeout, &mut frame).await? {
        let request = frame::decode_request(&frame)?;
        let body = dispatch(service, &request.header, request.body).await?;
        out.clear();
        frame::encode_response(&mut out, request.header.correlation_id, &body, &[]);
        frame_io::write_frame(&mut stream, &out).await?;
    }
    Ok(())
}

fn bad_body(api: &'static str) -> impl FnOnce(String) -> ConnectionError {
    move |reason| ConnectionError::BadBody { api, reason }
}

async fn dispatch(
    service: &ControllerService,
    header: &RequestHeader,
    body: &[u8],
) -> Result<Vec<u8>, ConnectionError> {
    if header.api_version != 0 {
        return Err(ConnectionError::UnsupportedVersion {
            api_key: header.api_key,
            version: header.api_version,
        });
    }
    if let Some(api) = ControllerApiKey::from_u16(header.api_key) {
        return dispatch_controller(service, api, body).await;
    }
    let wire_error = |api| {
        move |e: wire::WireError| ConnectionError::BadBody {
            api,
            reason: e.to_string(),
        }
    };
    match ApiKey::from_u16(header.api_key) {
        Some(ApiKey::CreateTopics) => {
            let specs =
                wire::decode_create_topics_request(body).map_err(wire_error("create_topics"))?;
            let outcomes = service.create_topics(specs).await;
            Ok(wire::encode_create_topics_response(&outcomes))
        }
        Some(ApiKey::DeleteTopics) => {
            let names =
                wire::decode_delete_topics_request(body).map_err(wire_error("delete_topics"))?;
            let outcomes = service.delete_topics(names).await;
            Ok(wire::encode_delete_topics_response(&outcomes))
        }
        Some(ApiKey::AlterTopicConfigs) => {
            let specs = wire::decode_alter_topic_configs_request(body)
                .map_err(wire_error("alter_topic_configs"))?;
            let outcomes = service.alter_topic_configs(specs).await;
            Ok(wire::encode_alter_topic_configs_response(&outcomes))
        }
        _ => Err(ConnectionError::UnknownApi(header.api_key)),
    }
}

async fn dispatch_controller(
    service: &ControllerService,
    api: ControllerApiKey,
    body: &[u8],
) -> Result<Vec<u8>, ConnectionError> {
    let name = api.name();
    let wire_error = |e: wire::WireError| ConnectionError::BadBody {
        api: name,
        reason: e.to_string(),
    };
    let raft = service.raft();
    let body = match api {
        ControllerApiKey::RegisterBroker => {
            let request = wire::decode_register_broker_request(body).map_err(wire_error)?;
            wire::encode_register_broker_response(&service.register_broker(request).await)
        }
        ControllerApiKey::BrokerHeartbeat => {
            let request = wire::decode_broker_heartbeat_request(body).map_err(wire_error)?;
            wire::encode_broker_heartbeat_response(&service.heartbeat(request).await)
        }
        ControllerApiKey::FetchMetadata => {
            let request = wire::decode_fetch_metadata_request(body).map_err(wire_error)?;
            wire::encode_fetch_metadata_response(&service.fetch_metadata(request).await)
        }
        ControllerApiKey::AlterIsr => {
            let request = wire::decode_alter_isr_request(body).map_err(wire_error)?;
            wire::encode_alter_isr_response(&service.alter_isr(request).await)
        }
        ControllerApiKey::AllocateProducerIds => {
            let request = wire::decode_allocate_producer_ids_request(body).map_err(wire_error)?;
            wire::encode_allocate_producer_ids_response(
                &service.allocate_producer_ids(request).await,
            )
        }
        ControllerApiKey::DescribeCluster => {
            wire::decode_describe_cluster_request(body).map_err(wire_error)?;
            wire::encode_describe_cluster_response(&service.describe_cluster())
        }
        ControllerApiKey::RaftAppendEntries => {
            let request =
                serde_json::from_slice(body).map_err(|e| bad_body(name)(e.to_string()))?;
            json(&raft.append_entries(request).await)
        }
        ControllerApiKey::RaftVote => {
            let request =
                serde_json::from_slice(body).map_err(|e| bad_body(name)(e.to_string()))?;
            json(&raft.vote(request).await)
        }
        ControllerApiKey::RaftInstallSnapshot => {
            let request =
                serde_json::from_slice(body).map_err(|e| bad_body(name)(e.to_string()))?;
            json(&raft.install_snapshot(request).await)
        }
    };
    Ok(body)
}

fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("openraft messages serialize")
}
