//! `OpError`: a failed partition operation as the wire reports it, and how a
//! log error maps to a wire error code.

use protocol::ErrorCode;

use crate::log::producer_state::SequenceError;
use crate::log::LogError;

/// A failed partition operation, as the wire reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpError {
    pub code: ErrorCode,
    pub message: String,
}

impl OpError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> OpError {
        OpError {
            code,
            message: message.into(),
        }
    }
}

impl From<LogError> for OpError {
    fn from(e: LogError) -> OpError {
        let code = match &e {
            LogError::InvalidBatch(protocol::BatchError::TooLarge { .. }) => {
                ErrorCode::MessageTooLarge
            }
            LogError::InvalidBatch(protocol::BatchError::UnsupportedCodec(_)) => {
                ErrorCode::UnsupportedCompression
            }
            LogError::InvalidBatch(_) => ErrorCode::CorruptMessage,
            LogError::OffsetOutOfRange { .. } => ErrorCode::OffsetOutOfRange,
            LogError::StaleLeaderEpoch { .. } => ErrorCode::StaleLeaderEpoch,
            LogError::NonContiguousReplica { .. } => ErrorCode::InvalidRequest,
            LogError::InvalidRecord(_) => ErrorCode::InvalidRecord,
            LogError::Sequence(SequenceError::OutOfOrder { .. }) => {
                ErrorCode::OutOfOrderSequenceNumber
            }
            LogError::Sequence(SequenceError::StaleEpoch { .. }) => ErrorCode::InvalidProducerEpoch,
            LogError::Sequence(SequenceError::UnknownProducer { .. }) => {
                ErrorCode::UnknownProducerId
            }
            LogError::Sequence(
                SequenceError::NotInTransaction { .. } | SequenceError::InvalidTransactional { .. },
            ) => ErrorCode::InvalidTxnState,
            LogError::Sequence(SequenceError::CoordinatorFenced { .. }) => {
                ErrorCode::TransactionCoordinatorFenced
            }
            LogError::Io { .. } | LogError::Corrupt { .. } | LogError::Config(_) => {
                ErrorCode::StorageError
            }
            LogError::Closed => ErrorCode::ShuttingDown,
            // Only a replica that stopped leading is truncated under a reader.
            LogError::Changed => ErrorCode::NotLeaderOrFollower,
        };
        OpError::new(code, e.to_string())
    }
}
