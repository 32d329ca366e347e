//! Errors at the log's boundary. Environment problems (I/O, full disk) and bad
//! input are values; broken invariants are assertions, not errors.

use std::io;
use std::path::PathBuf;

use protocol::{BatchError, LeaderEpoch, Offset};

use super::config::LogConfigError;

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("invalid batch: {0}")]
    InvalidBatch(#[from] BatchError),
    #[error("offset {requested} is outside the log's range [{log_start}, {log_end}]")]
    OffsetOutOfRange {
        requested: Offset,
        log_start: Offset,
        log_end: Offset,
    },
    #[error("leader epoch {epoch} is older than the log's latest epoch {latest}")]
    StaleLeaderEpoch {
        epoch: LeaderEpoch,
        latest: LeaderEpoch,
    },
    /// A record this log refuses, for example one without a key on a
    /// compacted topic.
    #[error("invalid record: {0}")]
    InvalidRecord(String),
    /// An idempotent producer's batch out of order or from an old epoch.
    #[error(transparent)]
    Sequence(#[from] super::producer_state::SequenceError),
    #[error("replicated batch starts at offset {batch_base} but the log ends at {log_end}")]
    NonContiguousReplica { batch_base: Offset, log_end: Offset },
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("corrupt data in {path} at byte {position}: {reason}")]
    Corrupt {
        path: PathBuf,
        position: u64,
        reason: String,
    },
    #[error(transparent)]
    Config(#[from] LogConfigError),
    #[error("log is closed")]
    Closed,
    /// The log was truncated, or its segment removed by retention, while a
    /// read was under way. Reads retry on it; it reaches a caller only when
    /// the log keeps changing under the reader.
    #[error("the log changed during the read")]
    Changed,
}

impl LogError {
    pub fn io(path: impl Into<PathBuf>, source: io::Error) -> LogError {
        LogError::Io {
            path: path.into(),
            source,
        }
    }

    /// Whether the failure is a full disk, which clears when space is freed.
    pub fn is_disk_full(&self) -> bool {
        matches!(self, LogError::Io { source, .. } if source.raw_os_error() == Some(28))
    }
}

pub type LogResult<T> = Result<T, LogError>;
