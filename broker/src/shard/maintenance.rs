//! Periodic work of a shard: each log's maintenance (write-behind, interval
//! flushes, checkpoints), high watermark moves that follow, ISR checks on
//! leaders (AlterIsr through shard 0), retention, and the abort of
//! transactions left hanging in a partition.

use std::rc::Rc;
use std::time::Duration;

use protocol::Offset;

use crate::log::LogError;

use super::{
    Replica, Shard, ShardOp, ShardReply, ISR_CHECK_MS, LOG_IDLE_SCAN_MS, LOG_MAINTENANCE_MS,
    MAINTENANCE_RETRY_MS_MAX, MAINTENANCE_WARN_INTERVAL_MS, METADATA_SHARD, RETENTION_CHECK_MS,
    TXN_HANGING_MS,
};
use crate::partition::PartitionKey;
use crate::runtime;

/// The replicas among `replicas` that `view` shows fenced or does not know:
/// the controller refuses an ISR naming any of them.
pub fn ineligible_for_isr(
    view: &crate::cluster_view::ClusterView,
    replicas: &[protocol::BrokerId],
) -> std::collections::BTreeSet<protocol::BrokerId> {
    replicas
        .iter()
        .copied()
        .filter(|id| view.brokers.get(id).is_none_or(|b| b.fenced))
        .collect()
}

/// How a log whose maintenance fails (a full or failing disk) is retried
/// and reported. Retries wait `LOG_MAINTENANCE_MS`, then twice as long
/// after each further failure, up to `MAINTENANCE_RETRY_MS_MAX`; the first
/// failure is warned about, and then at most one warning per
/// `MAINTENANCE_WARN_INTERVAL_MS` with the failures since the last one. So
/// thousands of partitions on a full disk neither spin on it nor flood the
/// log, and a disk with room again is written within a second.
#[derive(Debug, Default)]
pub struct FailureBackoff {
    /// Failures in a row.
    failures: u64,
    retry_at_ms: u64,
    warned_at_ms: Option<u64>,
    /// Failures since the last warning.
    unreported: u64,
}

impl FailureBackoff {
    /// Whether the log may be tried now.
    pub fn due(&self, now_ms: u64) -> bool {
        now_ms >= self.retry_at_ms
    }

    /// Records a failure at `now_ms`; the failures to warn about now (this
    /// one included), if it is time to warn.
    pub fn failed(&mut self, now_ms: u64) -> Option<u64> {
        self.failures += 1;
        self.unreported += 1;
        let doublings = (self.failures - 1).min(20) as u32;
        let delay_ms = LOG_MAINTENANCE_MS
            .saturating_mul(1 << doublings)
            .min(MAINTENANCE_RETRY_MS_MAX);
        self.retry_at_ms = now_ms + delay_ms;
        let warn = self
            .warned_at_ms
            .is_none_or(|at| now_ms >= at + MAINTENANCE_WARN_INTERVAL_MS);
        if !warn {
            return None;
        }
        self.warned_at_ms = Some(now_ms);
        Some(std::mem::take(&mut self.unreported))
    }

    /// Records a success; the failures in a row it ends, if any.
    pub fn succeeded(&mut self) -> Option<u64> {
        let failures = self.failures;
        *self = FailureBackoff::default();
        (failures > 0).then_some(failures)
    }
}

impl Shard {
    /// A leader's ISR check: asks the controller (through shard 0) for the
    /// ISR its followers' progress calls for, one request at a time.
    pub(super) fn check_isr(self: &Rc<Self>, key: &PartitionKey, replica: &Rc<Replica>) {
        let now_ms = self.monotonic_ms();
        let ineligible = ineligible_for_isr(&self.view.borrow(), &replica.role().replicas);
        let change = replica.core.borrow_mut().isr_change(
            now_ms,
            self.config.replica_lag_time_max_ms,
            protocol::BrokerEpoch(self.broker_epoch.get()),
            &ineligible,
        );
        let Some(change) = change else {
            return;
        };
        let from = replica.role().isr.clone();
        let request = protocol::control::messages::AlterIsr {
            leader_id: self.broker_id(),
            topic_id: protocol::TopicId(replica.topic_id),
            partition: protocol::PartitionIndex(
                u32::try_from(key.partition).expect("partition index non-negative"),
            ),
            leader_epoch: change.leader_epoch,
            partition_epoch: change.partition_epoch,
            new_isr: change.new_isr.clone(),
            new_isr_epochs: change.new_isr_epochs,
        };
        tracing::info!(topic = %key.topic, partition = key.partition, ?from, to = ?change.new_isr, "asking to change the ISR");
        let (shard, key, replica) = (self.clone(), key.clone(), replica.clone());
        runtime::spawn(async move {
            let reply = shard.call(METADATA_SHARD, ShardOp::AlterIsr(request)).await;
            match reply {
                ShardReply::AlterIsr(Ok((isr, partition_epoch))) => {
                    // The controller's answer may arrive after a delta that
                    // already carried this change, or a newer one:
                    // `set_role` applies it only if it is the newest.
                    let next = replica.core.borrow_mut().isr_changed(
                        change.leader_epoch,
                        isr,
                        partition_epoch,
                    );
                    if let Some(next) = next {
                        shard.set_role(&key, &replica, next);
                    }
                }
                ShardReply::AlterIsr(Err(e)) => {
                    tracing::info!(topic = %key.topic, partition = key.partition, error = %e.message, "ISR change refused; waiting for newer metadata");
                    // Give the metadata time to catch up before asking again.
                    runtime::sleep(Duration::from_millis(ISR_CHECK_MS * 5)).await;
                    replica.core.borrow_mut().isr_change_failed();
                }
                other => {
                    tracing::warn!(?other, "unexpected AlterIsr reply");
                    replica.core.borrow_mut().isr_change_failed();
                }
            }
        })
        .detach();
    }

    /// Forgets transactions the high watermark has passed the markers of
    /// (followers included), and on a leader aborts transactions open for
    /// longer than `TXN_HANGING_MS`.
    fn check_transactions(self: &Rc<Self>, key: &PartitionKey, replica: &Rc<Replica>) {
        let hw = Offset(replica.high_watermark.get()).min(replica.log.log_end_offset());
        replica.log.last_stable_offset(hw);
        let hanging = replica
            .log
            .hanging_transactions(self.clock.now_ms(), TXN_HANGING_MS);
        if !replica.role().leader {
            return;
        }
        for (producer_id, producer_epoch, coordinator_epoch) in hanging {
            tracing::warn!(topic = %key.topic, partition = key.partition, producer_id = producer_id.0, "aborting a transaction open for longer than any coordinator allows");
            let marker = protocol::record_batch::marker::TxnMarker {
                kind: protocol::record_batch::marker::MarkerKind::Abort,
                coordinator_epoch,
                // Not the coordinator's transaction count: always written.
                transaction_number: 0,
            };
            let batch = bytes::Bytes::from(protocol::record_batch::marker::build_marker_batch(
                producer_id,
                producer_epoch,
                marker,
                self.clock.now_ms(),
            ));
            let (shard, key) = (self.clone(), key.clone());
            runtime::spawn(async move {
                let timeout_ms = 30_000;
                if let Err(e) = shard.write_marker_local(key, batch, timeout_ms).await {
                    tracing::warn!(error = %e.message, "aborting a hanging transaction failed; retrying at the next check");
                }
            })
            .detach();
        }
    }

    /// The leaders whose ISR could change: not those that are their
    /// partition's only replica and its whole ISR (every partition of a
    /// replication factor of 1), which are most of a broker's thousands.
    fn isr_candidates(&self) -> Vec<(PartitionKey, Rc<Replica>)> {
        self.replicas_where(|replica| {
            let role = replica.role();
            role.leader && !(role.replicas.len() == 1 && role.isr == role.replicas)
        })
    }

    /// Queues `replica` for the next maintenance tick, once: its log was
    /// appended to, so it has bytes to write behind and perhaps to sync, and
    /// its high watermark may move after.
    pub(super) fn queue_maintenance(&self, key: &PartitionKey, replica: &Rc<Replica>) {
        if !replica.maintenance_queued.replace(true) {
            self.maintenance_queue
                .borrow_mut()
                .push((key.clone(), replica.clone()));
        }
    }

    /// Whether `replica` is still the one this shard keeps under `key` (not
    /// removed or replaced since it was queued).
    fn is_current(&self, key: &PartitionKey, replica: &Rc<Replica>) -> bool {
        self.replicas
            .borrow()
            .get(key)
            .is_some_and(|current| Rc::ptr_eq(current, replica))
    }

    /// Whether a maintained replica goes on being maintained every tick:
    /// its log still has writes or syncs to do, or it leads and its high
    /// watermark is behind what its log could vouch for (followers catching
    /// up).
    fn still_busy(replica: &Replica) -> bool {
        replica.log.has_pending_writes()
            || (replica.log.stable_offset().0 > replica.high_watermark.get()
                && replica.role().leader)
    }

    /// This tick's replicas: the queue, plus on a scan tick every replica
    /// whose log has a checkpoint due or is busy (an append path that did
    /// not queue it), plus on a retention tick every replica.
    fn replicas_to_maintain(
        &self,
        scan_due: bool,
        retention_due: bool,
    ) -> Vec<(PartitionKey, Rc<Replica>)> {
        let mut due = std::mem::take(&mut *self.maintenance_queue.borrow_mut());
        if scan_due || retention_due {
            let now_ms = self.clock.now_ms();
            due.extend(self.replicas_where(|replica| {
                !replica.maintenance_queued.get()
                    && (retention_due
                        || replica.log.maintenance_due(now_ms)
                        || Self::still_busy(replica))
            }));
        }
        for (_, replica) in &due {
            replica.maintenance_queued.set(false);
        }
        due
    }

    /// Periodic log work, ISR checks and retention, until the shard stops.
    pub async fn run_maintenance(self: Rc<Self>) {
        let mut last_retention = self.clock.monotonic();
        let mut last_isr_check = self.clock.monotonic();
        let mut last_scan = self.clock.monotonic();
        while !self.stopping.get() {
            runtime::sleep(Duration::from_millis(LOG_MAINTENANCE_MS)).await;
            if self.clock.monotonic().saturating_sub(last_isr_check)
                >= Duration::from_millis(ISR_CHECK_MS)
            {
                last_isr_check = self.clock.monotonic();
                for (key, replica) in self.isr_candidates() {
                    self.check_isr(&key, &replica);
                }
            }
            let retention_due = self.clock.monotonic().saturating_sub(last_retention)
                >= Duration::from_millis(RETENTION_CHECK_MS);
            let scan_due = self.clock.monotonic().saturating_sub(last_scan)
                >= Duration::from_millis(LOG_IDLE_SCAN_MS);
            if scan_due {
                last_scan = self.clock.monotonic();
            }
            for (key, replica) in self.replicas_to_maintain(scan_due, retention_due) {
                // Removed or replaced since it was queued: its directory may
                // belong to a new replica now.
                if !self.is_current(&key, &replica) {
                    continue;
                }
                let now_ms = self.monotonic_ms();
                if replica.maintenance_backoff.borrow().due(now_ms) {
                    match replica.log.maintain().await {
                        Ok(()) => {
                            let failed = replica.maintenance_backoff.borrow_mut().succeeded();
                            if let Some(failures) = failed {
                                tracing::info!(topic = %key.topic, partition = key.partition, failures, "log maintenance works again");
                            }
                        }
                        Err(e) => {
                            self.metrics.on_storage_error();
                            let now_ms = self.monotonic_ms();
                            let report = replica.maintenance_backoff.borrow_mut().failed(now_ms);
                            if let Some(failures) = report {
                                tracing::warn!(error = %e, topic = %key.topic, partition = key.partition, failures, "log maintenance failed; retrying with backoff");
                            }
                        }
                    }
                }
                // Write-behind and syncs move the leader's stable offset, and
                // with it the high watermark (acks=0 writes wait for nothing).
                self.update_high_watermark(&replica);
                if Self::still_busy(&replica) {
                    self.queue_maintenance(&key, &replica);
                }
                if retention_due {
                    self.check_transactions(&key, &replica);
                    // Never past the high watermark: followers may still need it.
                    let limit = Offset(
                        replica
                            .high_watermark
                            .get()
                            .min(replica.log.log_end_offset().0),
                    );
                    match replica.log.enforce_retention(limit).await {
                        Ok(0) => {}
                        Ok(n) => {
                            tracing::info!(topic = %key.topic, partition = key.partition, segments = n, "retention deleted segments")
                        }
                        // Shutting down: the log was closed under this pass.
                        Err(LogError::Closed) => {}
                        Err(e) => tracing::warn!(error = %e, "retention failed"),
                    }
                }
            }
            if retention_due {
                last_retention = self.clock.monotonic();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_log_is_retried_after_doubling_delays_up_to_the_bound() {
        let mut backoff = FailureBackoff::default();
        assert!(backoff.due(0));
        let mut now_ms = 1_000;
        let mut delays = Vec::new();
        for _ in 0..12 {
            backoff.failed(now_ms);
            let mut retry_ms = now_ms;
            while !backoff.due(retry_ms) {
                retry_ms += 1;
            }
            delays.push(retry_ms - now_ms);
            now_ms = retry_ms;
        }
        assert_eq!(
            delays,
            [5, 10, 20, 40, 80, 160, 320, 640, 1_000, 1_000, 1_000, 1_000]
        );
        assert_eq!(backoff.succeeded(), Some(12));
        assert!(backoff.due(now_ms), "a success retries at once next time");
        assert_eq!(backoff.succeeded(), None);
    }

    #[test]
    fn a_failing_log_is_warned_about_once_per_interval_with_the_count() {
        let mut backoff = FailureBackoff::default();
        assert_eq!(backoff.failed(0), Some(1), "the first failure is reported");
        let mut reports = Vec::new();
        // A failure every 100 ms for 25 s.
        for step in 1..=250 {
            if let Some(failures) = backoff.failed(step * 100) {
                reports.push((step * 100, failures));
            }
        }
        assert_eq!(
            reports,
            [(10_000, 100), (20_000, 100)],
            "one warning per interval, counting the failures since the last"
        );
        backoff.succeeded();
        assert_eq!(
            backoff.failed(25_100),
            Some(1),
            "a new run is reported at once"
        );
    }
}
