//! `ClientError`, the one error type the client library returns. Wire error
//! codes from the broker stay `protocol::ErrorCode` values inside it, so a
//! caller can tell a broker's answer from a local or network failure.

use std::sync::Arc;

use protocol::frame::FrameError;
use protocol::{BatchError, ErrorCode};

/// Everything that can go wrong in the client. `Clone`, because one failed
/// produce request fails the future of every record it carried.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    #[error("invalid configuration field `{field}`: {reason}")]
    InvalidConfig { field: &'static str, reason: String },
    #[error("invalid address `{0}` (expected HOST:PORT)")]
    InvalidAddress(String),
    #[error("I/O error on connection to {address}: {source}")]
    Io {
        address: String,
        #[source]
        source: Arc<std::io::Error>,
    },
    #[error("connecting to {address} timed out after {timeout_ms} ms")]
    ConnectTimeout { address: String, timeout_ms: u64 },
    #[error("connection to {address} closed by the peer")]
    ConnectionClosed { address: String },
    #[error("request to {address} timed out after {timeout_ms} ms")]
    RequestTimeout { address: String, timeout_ms: u64 },
    #[error("bad frame from {address}: {source}")]
    Frame {
        address: String,
        #[source]
        source: FrameError,
    },
    #[error("malformed response: {0}")]
    MalformedResponse(String),
    #[error("broker error {code}{}", message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    Broker {
        code: ErrorCode,
        message: Option<String>,
    },
    #[error("record batch: {0}")]
    Batch(#[from] BatchError),
    #[error("topic `{0}` does not exist")]
    UnknownTopic(String),
    #[error("partition {partition} of topic `{topic}` does not exist or is not assigned")]
    UnknownPartition { topic: String, partition: i32 },
    #[error("partition {partition} of topic `{topic}` has no leader")]
    LeaderNotAvailable { topic: String, partition: i32 },
    #[error("no broker reachable: {0}")]
    NoBrokerAvailable(String),
    #[error("record of {size_bytes} bytes exceeds record_bytes_max of {size_bytes_max} bytes")]
    RecordTooLarge {
        size_bytes: usize,
        size_bytes_max: usize,
    },
    #[error("offset {offset} of partition {partition} is out of range [{log_start_offset}, {log_end_offset}]")]
    OffsetOutOfRange {
        partition: i32,
        offset: i64,
        log_start_offset: i64,
        log_end_offset: i64,
    },
    #[error("the producer is closed")]
    ProducerClosed,
    /// A transactional producer's call out of order (`begin` twice, `send`
    /// outside a transaction, `commit` after a failed send: abort instead).
    #[error("transaction: {0}")]
    InvalidTransactionState(String),
}

impl ClientError {
    pub(crate) fn io(address: &str, source: std::io::Error) -> ClientError {
        ClientError::Io {
            address: address.to_owned(),
            source: Arc::new(source),
        }
    }

    pub(crate) fn broker(code: ErrorCode, message: Option<String>) -> ClientError {
        ClientError::Broker { code, message }
    }

    /// Whether the connection (not the request) failed: the caller should
    /// reconnect and refresh metadata before retrying.
    pub fn is_connection_error(&self) -> bool {
        matches!(
            self,
            ClientError::Io { .. }
                | ClientError::ConnectTimeout { .. }
                | ClientError::ConnectionClosed { .. }
                | ClientError::RequestTimeout { .. }
                | ClientError::Frame { .. }
                | ClientError::NoBrokerAvailable(_)
        )
    }

    /// Whether sending the same request again may succeed.
    pub fn is_retriable(&self) -> bool {
        match self {
            ClientError::Broker { code, .. } => code.is_retriable(),
            ClientError::LeaderNotAvailable { .. } => true,
            other => other.is_connection_error(),
        }
    }

    /// Whether cached metadata may be stale: the leader moved, the topic is
    /// new, or the connection to the old leader failed.
    pub fn needs_metadata_refresh(&self) -> bool {
        match self {
            ClientError::Broker { code, .. } => matches!(
                code,
                ErrorCode::NotLeaderOrFollower | ErrorCode::UnknownTopicOrPartition
            ),
            ClientError::LeaderNotAvailable { .. } => true,
            other => other.is_connection_error(),
        }
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;
