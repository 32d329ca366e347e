//! Per-partition log settings: every field has a unit in its name, a default
//! and a bound, and is validated once when the log is opened.

use std::fmt;

/// When appended bytes are forced to stable storage, and so what an
/// acknowledgement (acks=1 or acks=all) waits for. Under every policy an
/// acknowledged record has at least reached the file (a completed direct
/// write), so a crash of the broker process never loses it; the policies
/// differ in what a power loss may cost (docs/design/2026-11-30-durability.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushPolicy {
    /// fdatasync before an append is acknowledged; concurrent appends share one
    /// sync (group commit). A power loss loses nothing acknowledged.
    Always,
    /// fdatasync at most this often; acknowledgements wait for the write, not
    /// the sync. A power loss may lose up to this much of what was written.
    IntervalMs(u64),
    /// fdatasync only when a segment rolls or the log closes; acknowledgements
    /// wait for the write. A power loss may lose everything since the last roll.
    None,
}

impl fmt::Display for FlushPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlushPolicy::Always => write!(f, "always"),
            FlushPolicy::IntervalMs(ms) => write!(f, "interval_ms:{ms}"),
            FlushPolicy::None => write!(f, "none"),
        }
    }
}

impl std::str::FromStr for FlushPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<FlushPolicy, String> {
        match s {
            "always" => Ok(FlushPolicy::Always),
            "none" => Ok(FlushPolicy::None),
            other => match other.strip_prefix("interval_ms:") {
                Some(ms) => ms
                    .parse()
                    .map(FlushPolicy::IntervalMs)
                    .map_err(|_| format!("bad flush interval in {other:?}")),
                None => Err(format!(
                    "flush policy {other:?} is not always, none or interval_ms:N"
                )),
            },
        }
    }
}

/// What happens to old records (Kafka's `cleanup.policy`): delete whole old
/// segments by time and size, keep the latest record per key, or both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CleanupPolicy {
    pub delete: bool,
    pub compact: bool,
}

impl CleanupPolicy {
    pub const DELETE: CleanupPolicy = CleanupPolicy {
        delete: true,
        compact: false,
    };
    pub const COMPACT: CleanupPolicy = CleanupPolicy {
        delete: false,
        compact: true,
    };
}

impl fmt::Display for CleanupPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.compact, self.delete) {
            (true, true) => write!(f, "compact,delete"),
            (true, false) => write!(f, "compact"),
            _ => write!(f, "delete"),
        }
    }
}

impl std::str::FromStr for CleanupPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<CleanupPolicy, String> {
        let mut policy = CleanupPolicy {
            delete: false,
            compact: false,
        };
        for part in s.split(',').map(str::trim) {
            match part {
                "delete" => policy.delete = true,
                "compact" => policy.compact = true,
                other => {
                    return Err(format!(
                        "cleanup policy {other:?} is not delete, compact or compact,delete"
                    ))
                }
            }
        }
        Ok(policy)
    }
}

/// Settings of one partition log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogConfig {
    /// Roll the active segment before it would exceed this size. Default 1 GiB;
    /// at most 2 GiB - 1, since index positions are 32-bit.
    pub segment_size_bytes: u64,
    /// Roll the active segment once it is this old. Default 7 days.
    pub segment_age_ms: i64,
    /// Bytes of batches between two sparse index entries. Default 4 KiB.
    pub index_interval_bytes: u32,
    /// Delete closed segments whose newest record is older than this; `None` keeps
    /// them forever. Default 7 days.
    pub retention_ms: Option<i64>,
    /// Delete the oldest closed segments while the log exceeds this size; `None`
    /// for no size bound. Default none.
    pub retention_bytes: Option<u64>,
    pub flush_policy: FlushPolicy,
    /// Largest batch accepted or read back. Default 4 MiB.
    pub batch_bytes_max: usize,
    /// Largest decompressed records section the log inflates (timestamp lookup).
    /// Default 64 MiB.
    pub decompressed_bytes_max: usize,
    /// Largest direct-write buffer (a tail chunk). Default 1 MiB, a multiple
    /// of 4 KiB.
    pub write_chunk_bytes: usize,
    /// Appended bytes allowed in memory before appends wait for writes. Default 16 MiB.
    pub unwritten_bytes_max: usize,
    /// Delete old segments, compact, or both. Default delete. Time and size
    /// retention apply only with `delete`.
    pub cleanup_policy: CleanupPolicy,
    /// Compact once the dirty part (written since the last pass) is at least
    /// this share of the cleanable log, in thousandths. Default 500 (0.5).
    pub min_cleanable_dirty_ratio_permille: u32,
    /// A record stays uncompacted at least this long after its timestamp.
    /// Default 0.
    pub min_compaction_lag_ms: i64,
    /// A closed segment whose newest record is this old is compacted whatever
    /// the dirty ratio. Default `i64::MAX` (never forced).
    pub max_compaction_lag_ms: i64,
    /// A tombstone that compaction already kept once is dropped when its
    /// timestamp is this old, so consumers have this long to see the delete.
    /// Default 1 day.
    pub delete_retention_ms: i64,
    /// A producer id with no batch for this long (by batch timestamps) is
    /// forgotten: a retry of its last batch after that is appended again.
    /// Default 1 day, as Kafka's `producer.id.expiration.ms`.
    pub producer_id_expiration_ms: i64,
}

/// Segment positions are u32 in the index, with headroom for the batch that crosses.
pub const SEGMENT_SIZE_BYTES_MAX: u64 = (i32::MAX as u64) - (64 << 20);
pub const BATCH_BYTES_MAX_LIMIT: usize = 64 << 20;
/// Bound on a stored batch when it is read back, scanned or recovered: any
/// batch the log may ever have accepted, whatever `batch_bytes_max` is now. A
/// lowered `batch_bytes_max` applies to new appends, never to stored data.
pub const STORED_BATCH_BYTES_MAX: usize = BATCH_BYTES_MAX_LIMIT;

impl Default for LogConfig {
    fn default() -> LogConfig {
        LogConfig {
            segment_size_bytes: 1 << 30,
            segment_age_ms: 7 * 24 * 3600 * 1000,
            index_interval_bytes: 4096,
            retention_ms: Some(7 * 24 * 3600 * 1000),
            retention_bytes: None,
            flush_policy: FlushPolicy::Always,
            batch_bytes_max: 4 << 20,
            decompressed_bytes_max: 64 << 20,
            write_chunk_bytes: 1 << 20,
            unwritten_bytes_max: 16 << 20,
            cleanup_policy: CleanupPolicy::DELETE,
            min_cleanable_dirty_ratio_permille: 500,
            min_compaction_lag_ms: 0,
            max_compaction_lag_ms: i64::MAX,
            delete_retention_ms: 24 * 3600 * 1000,
            producer_id_expiration_ms: 24 * 3600 * 1000,
        }
    }
}

/// A setting outside its bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("log config field {field}: {reason}")]
pub struct LogConfigError {
    pub field: &'static str,
    pub reason: String,
}

impl LogConfig {
    pub fn validate(&self) -> Result<(), LogConfigError> {
        let bad = |field, reason: String| Err(LogConfigError { field, reason });
        if self.segment_size_bytes < 4096 || self.segment_size_bytes > SEGMENT_SIZE_BYTES_MAX {
            return bad(
                "segment_size_bytes",
                format!(
                    "{} is outside 4096..={SEGMENT_SIZE_BYTES_MAX}",
                    self.segment_size_bytes
                ),
            );
        }
        if self.segment_age_ms <= 0 {
            return bad("segment_age_ms", "must be positive".into());
        }
        if self.index_interval_bytes == 0 {
            return bad("index_interval_bytes", "must be positive".into());
        }
        if matches!(self.retention_ms, Some(ms) if ms <= 0) {
            return bad("retention_ms", "must be positive".into());
        }
        if self.batch_bytes_max < 61 || self.batch_bytes_max > BATCH_BYTES_MAX_LIMIT {
            return bad(
                "batch_bytes_max",
                format!(
                    "{} is outside 61..={BATCH_BYTES_MAX_LIMIT}",
                    self.batch_bytes_max
                ),
            );
        }
        if self.write_chunk_bytes < 4096 || !self.write_chunk_bytes.is_multiple_of(4096) {
            return bad(
                "write_chunk_bytes",
                "must be a positive multiple of 4096".into(),
            );
        }
        if self.unwritten_bytes_max < self.write_chunk_bytes + self.batch_bytes_max {
            return bad(
                "unwritten_bytes_max",
                "must hold at least one chunk plus one batch".into(),
            );
        }
        if !self.cleanup_policy.delete && !self.cleanup_policy.compact {
            return bad("cleanup_policy", "must delete, compact or both".into());
        }
        if self.min_cleanable_dirty_ratio_permille > 1000 {
            return bad("min_cleanable_dirty_ratio", "must be within 0..=1".into());
        }
        for (field, ms) in [
            ("min_compaction_lag_ms", self.min_compaction_lag_ms),
            ("max_compaction_lag_ms", self.max_compaction_lag_ms),
            ("delete_retention_ms", self.delete_retention_ms),
            ("producer_id_expiration_ms", self.producer_id_expiration_ms),
        ] {
            if ms < 0 {
                return bad(field, "must not be negative".into());
            }
        }
        if self.max_compaction_lag_ms < self.min_compaction_lag_ms {
            return bad(
                "max_compaction_lag_ms",
                "must be at least min_compaction_lag_ms".into(),
            );
        }
        if matches!(self.flush_policy, FlushPolicy::IntervalMs(0)) {
            return bad("flush_policy", "interval must be positive".into());
        }
        Ok(())
    }
}
