//! Transactions as pure decisions, without I/O: the records a transaction
//! coordinator keeps in `__transaction_state` (`records`) and the
//! coordinator of one `__transaction_state` partition (`coordinator`):
//! requests and timer ticks in, records to write, markers to send and
//! answers out. As with groups, every change is made by replaying the
//! records it produced, so a coordinator loaded from the log (after a
//! failover) is the one that wrote it and finishes what it had prepared.

pub mod coordinator;
pub mod records;

pub use crate::group::TopicPartition;

/// Name of the internal compacted topic that holds transaction state.
pub const TXN_STATE_TOPIC: &str = "__transaction_state";
/// Longest transactional id accepted.
pub const TRANSACTIONAL_ID_BYTES_MAX: usize = 255;
/// Partitions one transaction may span.
pub const TXN_PARTITIONS_MAX: usize = 10_000;
/// Transactional ids one coordinator (one `__transaction_state` partition)
/// holds; beyond it a new id is refused, so random ids cannot grow memory
/// without bound.
pub const TXN_IDS_PER_COORDINATOR_MAX: usize = 100_000;
/// Bounds of a producer's `transaction.timeout.ms` (Kafka's default 60 s,
/// and `transaction.max.timeout.ms` 15 min).
pub const TXN_TIMEOUT_MS_DEFAULT: u32 = 60_000;
pub const TXN_TIMEOUT_MS_MIN: u32 = 1_000;
pub const TXN_TIMEOUT_MS_MAX: u32 = 900_000;
/// A transactional id silent this long (no transaction in flight) is
/// forgotten (Kafka's `transactional.id.expiration.ms`).
pub const TXN_ID_EXPIRATION_MS_DEFAULT: i64 = 7 * 24 * 3600 * 1000;

/// Which `__transaction_state` partition holds a transactional id: the
/// same stable hash as group placement.
pub fn txn_partition_for(transactional_id: &str, partition_count: u32) -> protocol::PartitionIndex {
    crate::group::offsets_partition_for(transactional_id, partition_count)
}
