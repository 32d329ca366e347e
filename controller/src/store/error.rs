//! `StoreError`: environment failures of the Raft storage (I/O, corrupt files),
//! and their conversion into openraft's `StorageError` at the trait boundary.

use std::io;
use std::path::{Path, PathBuf};

use openraft::{StorageError, StorageIOError};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("{path}: corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("encode {what}: {source}")]
    Encode {
        what: &'static str,
        source: serde_json::Error,
    },
    /// An earlier write or fsync failed; the file's tail is unknown, so nothing more
    /// is written until the process restarts and recovery rescans the log.
    #[error("the log store failed earlier and refuses further writes until restart")]
    Failed,
}

impl StoreError {
    /// For `map_err`: tags an `io::Error` with the operation and path.
    pub fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> StoreError + 'a {
        move |source| StoreError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }

    pub fn corrupt(path: &Path, reason: impl Into<String>) -> StoreError {
        StoreError::Corrupt {
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }

    pub fn encode(what: &'static str) -> impl FnOnce(serde_json::Error) -> StoreError {
        move |source| StoreError::Encode { what, source }
    }

    /// The write was refused for want of space (ENOSPC, EDQUOT): an
    /// environment condition that passes, unlike a failed device.
    pub fn is_no_space(&self) -> bool {
        matches!(self, StoreError::Io { source, .. } if source_is_no_space(source))
    }

    /// The same failure, no longer one to wait out: for a refusal after
    /// which the write cannot simply be tried again (a file already
    /// replaced, a log that could not be cut back).
    pub(crate) fn settled(self) -> StoreError {
        match self {
            StoreError::Io { op, path, source } if source_is_no_space(&source) => StoreError::Io {
                op,
                path,
                source: io::Error::other(source.to_string()),
            },
            other => other,
        }
    }

    pub(crate) fn into_write_logs(self) -> StorageError<u64> {
        StorageIOError::write_logs(&self).into()
    }

    pub(crate) fn into_write_vote(self) -> StorageError<u64> {
        StorageIOError::write_vote(&self).into()
    }

    pub(crate) fn into_write_snapshot(self) -> StorageError<u64> {
        StorageIOError::write_snapshot(None, &self).into()
    }
}

fn source_is_no_space(source: &io::Error) -> bool {
    matches!(
        source.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
    )
}
