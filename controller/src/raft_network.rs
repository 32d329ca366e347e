//! The Raft network between controllers: openraft's `RaftNetworkFactory` and
//! `RaftNetwork` over TCP on tokio (the client side; `server.rs` answers).
//!
//! Encoding: each RPC is one request frame of the wire protocol (length prefix,
//! request header with a `ControllerApiKey::Raft*` key) whose body is the openraft
//! request encoded as JSON with serde; the response frame's body is the JSON of
//! `Result<response, RaftError>`. JSON rather than flatbuffers because this is
//! internal traffic between controllers of one build whose message types belong
//! to openraft, which derives serde for them; JSON is already the encoding of the
//! controller's log and snapshots, so no second codec comes in. Its cost (a
//! snapshot chunk's bytes become decimal numbers, up to 4x) is accounted for in
//! `RAFT_FRAME_BYTES_MAX` versus `SNAPSHOT_CHUNK_BYTES_MAX`.
//!
//! One connection per target, opened lazily and reopened after any failure;
//! one RPC at a time on it. A failed connect is `Unreachable` (openraft backs
//! off); a failure on an open connection is a `NetworkError` (openraft retries).

use std::io;
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use protocol::api::ControllerApiKey;
use protocol::frame::{self, RequestHeader};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::net::TcpStream;

use crate::frame_io::{self, FrameIoError};
use crate::store::TypeConfig;

/// Bound on a Raft frame, either direction.
pub const RAFT_FRAME_BYTES_MAX: u32 = 32 << 20;
/// openraft's snapshot chunk size; its JSON (up to 4 bytes per byte) must fit a frame.
pub const SNAPSHOT_CHUNK_BYTES_MAX: usize = 4 << 20;
/// Bound on opening a connection to a peer.
pub const CONNECT_TIMEOUT_MS_MAX: u64 = 1_000;

const _: () = assert!(SNAPSHOT_CHUNK_BYTES_MAX * 4 + (1 << 20) <= RAFT_FRAME_BYTES_MAX as usize);

#[derive(Debug, thiserror::Error)]
enum CallError {
    #[error("connect to {addr}: {source}")]
    Connect { addr: String, source: io::Error },
    #[error("connect to {addr}: timed out after {timeout_ms} ms")]
    ConnectTimeout { addr: String, timeout_ms: u64 },
    #[error("rpc to {addr} timed out after {timeout:?}")]
    Timeout { addr: String, timeout: Duration },
    #[error("rpc to {addr}: {source}")]
    Io { addr: String, source: FrameIoError },
    #[error("rpc to {addr}: peer closed the connection")]
    Closed { addr: String },
    #[error("rpc to {addr}: bad response: {reason}")]
    BadResponse { addr: String, reason: String },
}

/// Makes one `PeerClient` per target; openraft calls it for replication streams
/// and vote rounds.
#[derive(Clone, Debug)]
pub struct TcpRaftNetwork {
    node_id: u64,
}

impl TcpRaftNetwork {
    pub fn new(node_id: u64) -> TcpRaftNetwork {
        TcpRaftNetwork { node_id }
    }
}

impl RaftNetworkFactory<TypeConfig> for TcpRaftNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> PeerClient {
        PeerClient {
            client_id: format!("controller-{}", self.node_id),
            target,
            addr: node.addr.clone(),
            stream: None,
            correlation_id: 0,
            frame: Vec::new(),
        }
    }
}

/// A connection (when open) to one peer controller.
#[derive(Debug)]
pub struct PeerClient {
    client_id: String,
    target: u64,
    addr: String,
    stream: Option<TcpStream>,
    correlation_id: u32,
    frame: Vec<u8>,
}

impl PeerClient {
    async fn connect(&mut self) -> Result<&mut TcpStream, CallError> {
        if self.stream.is_none() {
            let timeout = Duration::from_millis(CONNECT_TIMEOUT_MS_MAX);
            let stream = tokio::time::timeout(timeout, TcpStream::connect(&self.addr))
                .await
                .map_err(|_| CallError::ConnectTimeout {
                    addr: self.addr.clone(),
                    timeout_ms: CONNECT_TIMEOUT_MS_MAX,
                })?
                .map_err(|source| CallError::Connect {
                    addr: self.addr.clone(),
                    source,
                })?;
            // Raft messages are small and latency-bound.
            stream
                .set_nodelay(true)
                .map_err(|source| CallError::Connect {
                    addr: self.addr.clone(),
                    source,
                })?;
            self.stream = Some(stream);
        }
        Ok(self.stream.as_mut().expect("just connected"))
    }

    /// Sends one request and reads its response, within `timeout`. Any failure
    /// drops the connection, so the next call reconnects.
    async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &mut self,
        api: ControllerApiKey,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, CallError> {
        let result = tokio::time::timeout(timeout, self.exchange(api, request)).await;
        let result = result.unwrap_or_else(|_| {
            Err(CallError::Timeout {
                addr: self.addr.clone(),
                timeout,
            })
        });
        if result.is_err() {
            self.stream = None;
        }
        result
    }

    async fn exchange<Req: Serialize, Resp: DeserializeOwned>(
        &mut self,
        api: ControllerApiKey,
        request: &Req,
    ) -> Result<Resp, CallError> {
        let body = serde_json::to_vec(request).expect("openraft messages serialize");
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let header = RequestHeader {
            api_key: api as u16,
            api_version: 0,
            correlation_id: self.correlation_id,
            client_id: self.client_id.clone(),
        };
        let mut out = Vec::with_capacity(body.len() + 64);
        frame::encode_request(&mut out, &header, &body, &[]);
        let addr = self.addr.clone();
        let io_error = |source| CallError::Io {
            addr: addr.clone(),
            source,
        };
        let stream = self.connect().await?;
        frame_io::write_frame(stream, &out)
            .await
            .map_err(io_error)?;
        let mut frame = std::mem::take(&mut self.frame);
        let stream = self.stream.as_mut().expect("connected");
        // The overall call timeout bounds this read; the inner one is the same bound.
        let read = frame_io::read_frame(
            stream,
            RAFT_FRAME_BYTES_MAX,
            Duration::from_secs(3600),
            &mut frame,
        )
        .await;
        let result = match read {
            Ok(true) => self.decode(&frame),
            Ok(false) => Err(CallError::Closed {
                addr: self.addr.clone(),
            }),
            Err(e) => Err(io_error(e)),
        };
        self.frame = frame;
        result
    }

    fn decode<Resp: DeserializeOwned>(&self, frame: &[u8]) -> Result<Resp, CallError> {
        let bad = |reason: String| CallError::BadResponse {
            addr: self.addr.clone(),
            reason,
        };
        let response = frame::decode_response(frame).map_err(|e| bad(e.to_string()))?;
        if response.correlation_id != self.correlation_id {
            return Err(bad(format!(
                "correlation id {} for request {}",
                response.correlation_id, self.correlation_id
            )));
        }
        serde_json::from_slice(response.body).map_err(|e| bad(e.to_string()))
    }

    fn rpc_error<E: std::error::Error>(
        &self,
        error: CallError,
    ) -> RPCError<u64, BasicNode, RaftError<u64, E>> {
        tracing::debug!(target_node = self.target, %error, "raft rpc failed");
        match error {
            CallError::Connect { .. } | CallError::ConnectTimeout { .. } => {
                RPCError::Unreachable(Unreachable::new(&error))
            }
            _ => RPCError::Network(NetworkError::new(&error)),
        }
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        let result: Result<Result<AppendEntriesResponse<u64>, RaftError<u64>>, CallError> = self
            .call(ControllerApiKey::RaftAppendEntries, &rpc, option.hard_ttl())
            .await;
        match result {
            Ok(r) => r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e))),
            Err(e) => Err(self.rpc_error(e)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>,
    > {
        let result: Result<
            Result<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>>,
            CallError,
        > = self
            .call(
                ControllerApiKey::RaftInstallSnapshot,
                &rpc,
                option.hard_ttl(),
            )
            .await;
        match result {
            Ok(r) => r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e))),
            Err(e) => Err(self.rpc_error(e)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        let result: Result<Result<VoteResponse<u64>, RaftError<u64>>, CallError> = self
            .call(ControllerApiKey::RaftVote, &rpc, option.hard_ttl())
            .await;
        match result {
            Ok(r) => r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e))),
            Err(e) => Err(self.rpc_error(e)),
        }
    }
}
