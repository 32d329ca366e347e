//! What every consumer of a run shares, whether it reads assigned
//! partitions (`driver`) or is a group member (`group_consumers`): fetch
//! bounds and retry pacing, the consumed history, the counters of failures
//! ridden through, and the accounting of one consumed record.

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;

use crate::histograms::WorkerStats;
use crate::payload::{decode_header, PayloadHeader, PayloadKind};
use crate::verify::HistoryRecord;

/// Bound on one fetch response.
pub(crate) const FETCH_BYTES_MAX: i32 = 16 << 20;
pub(crate) const FETCH_PARTITION_BYTES_MAX: i32 = 4 << 20;
pub(crate) const FETCH_WAIT_MS: i32 = 100;

/// Pause before a partition whose send or fetch failed is tried again.
pub(crate) const RETRY_BACKOFF_MS: u64 = 100;

pub(crate) fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

pub(crate) type History = Arc<Mutex<Vec<HistoryRecord>>>;

/// Counts of failures the workers rode through.
#[derive(Debug, Default)]
pub(crate) struct RideThroughCounters {
    pub(crate) retried_batches: std::sync::atomic::AtomicU64,
    pub(crate) fetch_errors: std::sync::atomic::AtomicU64,
}

/// Accounts one record a consumer read at `now_us` (wall clock): its bytes
/// and its end-to-end latency from the send time stamped in the payload.
/// Every consumer, assigned or a group member, goes through here.
pub(crate) fn record_consumed(
    payload: PayloadKind,
    stats: &mut WorkerStats,
    value: &[u8],
    now_us: u64,
) -> anyhow::Result<PayloadHeader> {
    let header = decode_header(payload, value).context("payload header")?;
    stats.record_consume(value.len() as u64, now_us, header.send_time_us);
    Ok(header)
}
