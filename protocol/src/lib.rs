//! Ringlog's wire and record contract, shared by every process: the record batch
//! format, the id and offset newtypes, and compression codecs. It performs no I/O
//! and depends on no other crate of the workspace.

pub mod ids;
pub mod record_batch;
pub mod varint;

pub use ids::{LeaderEpoch, Offset, ProducerEpoch, ProducerId, Sequence};
pub use record_batch::{
    BatchBuilder, BatchError, BatchHeader, Compression, Record, RecordBatch, RecordHeader,
    RecordIter, RecordRef, BATCH_HEADER_BYTES,
};
