//! `StateLimits`: the bounds on what commands can make the replicated state
//! grow to, shared by the state machine and the validation of its inputs.

use serde::{Deserialize, Serialize};

/// Bounds on what commands can make the state grow to. Part of the replicated state
/// (every replica must refuse the same commands), fixed when the cluster is created.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateLimits {
    pub broker_count_max: usize,
    pub shard_count_max: usize,
    pub topic_count_max: usize,
    /// Partitions of one topic.
    pub partition_count_max: u32,
    /// Partitions of all topics together.
    pub total_partition_count_max: usize,
    pub deltas_retained_max: usize,
    pub session_timeout_ms_min: u64,
    pub session_timeout_ms_max: u64,
    pub endpoint_bytes_max: usize,
    pub config_entries_max: usize,
    pub config_bytes_max: usize,
}

impl Default for StateLimits {
    fn default() -> StateLimits {
        StateLimits {
            broker_count_max: 1024,
            shard_count_max: 1024,
            topic_count_max: 10_000,
            partition_count_max: 10_000,
            total_partition_count_max: 200_000,
            deltas_retained_max: 16_384,
            session_timeout_ms_min: 100,
            session_timeout_ms_max: 600_000,
            endpoint_bytes_max: 255,
            config_entries_max: 64,
            config_bytes_max: 1024,
        }
    }
}
