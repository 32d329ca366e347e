//! The shard's log cleaner: compacts the compacted-topic replicas this shard
//! owns, one pass at a time, in its own low-share task queue with the I/O
//! rate and key-map memory the broker's `cleaner` settings allow. A replica
//! is cleaned only below its high watermark, leader or follower alike
//! (replicas compact independently, as in Kafka). A failed pass marks that
//! replica uncleanable and stops neither the shard nor other replicas.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use protocol::Offset;

use super::{Replica, Shard};
use crate::log::{CleanRequest, SwapStep};
use crate::metrics::CleanerGauges;
use crate::partition::PartitionKey;
use crate::runtime;

/// zstd level of batches the cleaner rewrites, as producers use by default.
const CLEANER_ZSTD_LEVEL: i32 = 1;

/// Crash tests only: names a swap step (`SwapStep::name`) after which the
/// cleaner stops its first swap and waits to be killed, so a test can kill -9
/// the broker with the directory exactly there.
pub const PAUSE_AFTER_SWAP_STEP_ENV: &str = "RINGLOG_TEST_CLEANER_PAUSE_AFTER";

impl Shard {
    /// Cleans every compacted replica that is worth it, then waits
    /// `cleaner.backoff_ms`, until the shard stops.
    pub async fn run_cleaner(self: Rc<Self>) {
        let pause = std::env::var(PAUSE_AFTER_SWAP_STEP_ENV)
            .ok()
            .and_then(|name| SwapStep::from_name(&name));
        while !self.stopping.get() {
            runtime::sleep(Duration::from_millis(self.config.cleaner.backoff_ms)).await;
            for (key, replica) in self.replica_list() {
                if self.stopping.get() {
                    return;
                }
                if let Some(step) = self.clean_once(&key, &replica, pause).await {
                    tracing::warn!(topic = %key.topic, partition = key.partition, step = step.name(), "compaction swap paused for a crash test");
                    std::future::pending::<()>().await;
                }
            }
        }
    }

    /// One compaction pass over `replica`'s log, if it is compacted, cleanable
    /// and dirty enough.
    /// Returns the swap step a crash test paused it at.
    pub(super) async fn clean_once(
        &self,
        key: &PartitionKey,
        replica: &Rc<Replica>,
        pause: Option<SwapStep>,
    ) -> Option<SwapStep> {
        if !replica.log.config().cleanup_policy.compact
            || replica.cleaning.borrow().uncleanable.is_some()
        {
            return None;
        }
        let request = CleanRequest {
            end_limit: cleanable_limit(replica),
            map_memory_bytes: self.config.cleaner.memory_bytes,
            io_bytes_per_sec_max: self.config.cleaner.io_bytes_per_sec_max,
            zstd_level: CLEANER_ZSTD_LEVEL,
            stop_swap_after: pause,
        };
        match replica.log.clean(&request).await {
            Ok(report) if report.stopped_at.is_some() => return report.stopped_at,
            Ok(report) if report.plan.is_some() => {
                replica.cleaning.borrow_mut().last_pass_ms = Some(self.clock.now_ms());
                if report.segments_written > 0 {
                    // Cached batches below the cleaned end are the old,
                    // uncompacted ones: reads go to the log for them now.
                    let end = report.plan.map_or(Offset::ZERO, |p| p.cleanable_end);
                    self.cache.borrow_mut().discard_below(key, end);
                }
                self.metrics.on_clean(&report);
                tracing::info!(
                    topic = %key.topic,
                    partition = key.partition,
                    map_end = %report.map_end,
                    segments_rewritten = report.segments_rewritten,
                    segments_written = report.segments_written,
                    records_removed = report.records_removed,
                    bytes_read = report.bytes_read,
                    bytes_written = report.bytes_written,
                    abandoned = report.abandoned,
                    "compaction pass"
                );
            }
            Ok(_) => {}
            Err(e) => {
                self.metrics.on_cleaner_error();
                tracing::error!(topic = %key.topic, partition = key.partition, error = %e, "compaction failed; the partition is uncleanable until restart");
                replica.cleaning.borrow_mut().uncleanable = Some(e.to_string());
            }
        }
        None
    }

    /// The cleaner gauges of this shard's compacted replicas.
    pub(super) fn cleaner_gauges(&self) -> BTreeMap<PartitionKey, CleanerGauges> {
        let now_ms = self.clock.now_ms();
        self.replicas
            .borrow()
            .iter()
            .filter(|(_, r)| r.log.config().cleanup_policy.compact)
            .map(|(key, replica)| {
                let cleaning = replica.cleaning.borrow();
                let gauges = CleanerGauges {
                    dirty_ratio_permille: replica
                        .log
                        .dirty_ratio_permille(cleanable_limit(replica)),
                    since_last_pass_seconds: cleaning
                        .last_pass_ms
                        .map(|ms| (now_ms - ms).max(0) as f64 / 1000.0),
                    uncleanable: cleaning.uncleanable.is_some(),
                };
                (key.clone(), gauges)
            })
            .collect()
    }
}

/// Never past the high watermark: a record above it may still be cut, and
/// the older value it would have replaced must then still be there.
fn cleanable_limit(replica: &Replica) -> Offset {
    Offset(
        replica
            .high_watermark
            .get()
            .min(replica.log.log_end_offset().0),
    )
}
