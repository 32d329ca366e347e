//! Ringlog's wire and record contract, shared by every process: the record batch
//! format, the framing and flatbuffers messages of the wire protocol, stable
//! error codes, and the id and offset newtypes. It performs no I/O and depends
//! on no other crate of the workspace.

pub mod api;
pub mod control;
pub mod error_code;
pub mod frame;
pub mod ids;
pub mod record_batch;
pub mod replica_fetch;
pub mod varint;

#[allow(
    unsafe_code,
    unused_imports,
    clippy::all,
    clippy::pedantic,
    missing_debug_implementations,
    mismatched_lifetime_syntaxes,
    non_camel_case_types,
    non_snake_case,
    dead_code
)]
#[rustfmt::skip]
mod generated;

/// The flatbuffers messages, generated from `protocol/schema/*.fbs`.
pub use generated::ringlog::wire;

pub use api::ApiKey;
pub use error_code::ErrorCode;
pub use ids::{
    BrokerEpoch, BrokerId, GroupEpoch, LeaderEpoch, MemberEpoch, MetadataVersion, Offset,
    PartitionEpoch, PartitionIndex, ProducerEpoch, ProducerId, Sequence, ShardIndex, TopicId,
};
pub use record_batch::{
    BatchBuilder, BatchError, BatchHeader, Compression, Record, RecordBatch, RecordHeader,
    RecordIter, RecordRef, Retained, BATCH_HEADER_BYTES,
};

/// Re-exported so every process builds messages with the pinned version.
pub use flatbuffers;
