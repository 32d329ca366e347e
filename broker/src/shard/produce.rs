//! Produce on the leader: append, then answer by acks (0: at once; 1: once the
//! records are stable under the flush policy; all: once the high watermark
//! passed them, as `replication::ack::decide` rules). Transaction markers
//! take the same path, always as acks=all.

use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use protocol::{ErrorCode, LeaderEpoch, Offset};

use super::{OpError, ProduceOutcome, Replica, Shard, ISR_CHECK_MS};
use crate::partition::PartitionKey;
use crate::runtime;

impl Shard {
    pub(super) async fn produce_local(
        &self,
        key: PartitionKey,
        batch: Bytes,
        acks: i16,
        timeout_ms: u64,
    ) -> Result<ProduceOutcome, OpError> {
        self.produce_at(key, batch, acks, timeout_ms, None).await
    }

    /// Writes a transaction marker as leader; answered once the in-sync
    /// replicas have it, so a committed transaction's marker survives a
    /// leader change.
    pub(super) async fn write_marker_local(
        self: &Rc<Self>,
        key: PartitionKey,
        batch: Bytes,
        timeout_ms: u64,
    ) -> Result<ProduceOutcome, OpError> {
        let offsets_partition = (key.topic == crate::group::OFFSETS_TOPIC).then_some(key.partition);
        let marker = marker_of(&batch);
        let written = self
            .leader_write(key.clone(), batch, -1, timeout_ms, None, true)
            .await;
        let (Some(partition), Some((producer_id, commit, number))) = (offsets_partition, marker)
        else {
            return written;
        };
        // Offsets committed in the transaction take effect (or vanish)
        // before the coordinator hears the marker is in; a resend (answered
        // as the marker already here) decides nothing again. A marker that
        // was appended but whose replication wait failed decides them too:
        // the transaction's outcome is fixed, and the resend that follows
        // finds the marker here. Until then the producer cannot begin its
        // next transaction, so the pending offsets are this one's.
        let appended = match &written {
            Ok(outcome) => !outcome.duplicate,
            Err(_) => {
                number > 0
                    && self.leader_replica(&key).is_ok_and(|(replica, _)| {
                        replica
                            .log
                            .producer_entry(producer_id)
                            .and_then(|e| e.last_marker)
                            .is_some_and(|last| last.transaction_number == number)
                    })
            }
        };
        if appended {
            self.hosted_marker::<crate::group::coordinator::GroupCoordinator>(
                partition,
                producer_id,
                commit,
            )
            .await;
        }
        written
    }

    /// `produce_local`, refused unless this shard leads at `expected_epoch`
    /// when set (a group coordinator writes only under the leadership it
    /// loaded at).
    pub(super) async fn produce_at(
        &self,
        key: PartitionKey,
        batch: Bytes,
        acks: i16,
        timeout_ms: u64,
        expected_epoch: Option<LeaderEpoch>,
    ) -> Result<ProduceOutcome, OpError> {
        self.leader_write(key, batch, acks, timeout_ms, expected_epoch, false)
            .await
    }

    async fn leader_write(
        &self,
        key: PartitionKey,
        batch: Bytes,
        acks: i16,
        timeout_ms: u64,
        expected_epoch: Option<LeaderEpoch>,
        marker: bool,
    ) -> Result<ProduceOutcome, OpError> {
        // Records of a new leadership's epoch land only once the saved
        // history names it (`EpochSaver`); the role is read after the wait.
        self.leader_replica(&key)?.0.epochs_saved(self).await;
        let (replica, leader_epoch) = self.leader_replica(&key)?;
        if expected_epoch.is_some_and(|e| e != leader_epoch) {
            return Err(OpError::new(
                ErrorCode::NotLeaderOrFollower,
                format!(
                    "{}-{} is led at epoch {leader_epoch}, not {}",
                    key.topic,
                    key.partition,
                    expected_epoch.map_or(-1, |e| e.0)
                ),
            ));
        }
        if self.stopping.get() {
            return Err(OpError::new(
                ErrorCode::ShuttingDown,
                "broker is shutting down",
            ));
        }
        let (isr_size, min_insync) = {
            let role = replica.role();
            (role.isr.len(), role.min_insync)
        };
        if acks == -1 && isr_size < min_insync {
            return Err(OpError::new(
                ErrorCode::NotEnoughReplicas,
                format!(
                    "{}-{} has {} in-sync replicas, fewer than min.insync.replicas {}",
                    key.topic, key.partition, isr_size, min_insync
                ),
            ));
        }
        let epoch = leader_epoch;
        let still_leads = || replica.leads_at(epoch);
        let info = if marker {
            replica
                .log
                .append_marker(&batch, epoch, &still_leads)
                .await?
        } else {
            replica.log.append_if(&batch, epoch, &still_leads).await?
        };
        // Write-behind, syncs nobody waits for (acks=0) and the high
        // watermark move that follows them.
        self.queue_maintenance(&key, &replica);
        if info.duplicate {
            // A producer's retry of a batch this log already holds, or a
            // marker's resend: answer as the original would have been, once
            // it is as safe.
            self.metrics.on_duplicate_batch();
            return self
                .answer_when_acknowledged(&key, &replica, leader_epoch, info, acks, timeout_ms)
                .await;
        }
        assert!(
            !replica
                .core
                .borrow_mut()
                .note_epoch(leader_epoch, info.base_offset),
            "a leader's epoch is in its history before it appends"
        );
        self.cache
            .borrow_mut()
            .insert(&key, info.base_offset, info.log_end_offset, epoch, batch);
        replica.log_end.advance(info.log_end_offset.0);
        self.update_high_watermark(&replica);
        self.metrics
            .on_append(info.log_end_offset.0 - info.base_offset.0);
        self.answer_when_acknowledged(&key, &replica, leader_epoch, info, acks, timeout_ms)
            .await
    }

    /// Waits until the batch at `info` may be acknowledged under `acks` and
    /// answers with where it landed.
    async fn answer_when_acknowledged(
        &self,
        key: &PartitionKey,
        replica: &Replica,
        leader_epoch: LeaderEpoch,
        info: crate::log::AppendInfo,
        acks: i16,
        timeout_ms: u64,
    ) -> Result<ProduceOutcome, OpError> {
        // acks=1 and acks=all are answered only once the records are stable
        // under the flush policy (at least written to the file), so a crash of
        // this process right after the answer cannot lose them.
        if acks != 0 {
            if let Err(e) = replica.log.wait_for_ack(info.log_end_offset).await {
                return Err(if !replica.leads_at(leader_epoch) {
                    OpError::new(
                        ErrorCode::NotLeaderOrFollower,
                        format!(
                            "leadership of {}-{} moved before the write was durable",
                            key.topic, key.partition
                        ),
                    )
                } else {
                    e.into()
                });
            }
            self.update_high_watermark(replica);
        }
        if acks == -1 {
            self.wait_committed(
                key,
                replica,
                leader_epoch,
                info.log_end_offset.0,
                timeout_ms,
            )
            .await?;
        }
        Ok(ProduceOutcome {
            base_offset: info.base_offset,
            log_start_offset: replica.log.log_start_offset(),
            log_end_offset: info.log_end_offset,
            duplicate: info.duplicate,
        })
    }

    /// acks=all: waits until the high watermark passes `end`, that is until
    /// every in-sync replica holds the records stably, and answers by
    /// `replication::ack::decide` as things stand then: fails at once if this
    /// broker stops leading at that epoch, refuses if the ISR shrank below
    /// `min.insync.replicas`, and times out after `timeout_ms` (the records
    /// stay in the log; they may still commit).
    pub(super) async fn wait_committed(
        &self,
        key: &PartitionKey,
        replica: &Replica,
        leader_epoch: LeaderEpoch,
        end: i64,
        timeout_ms: u64,
    ) -> Result<(), OpError> {
        use crate::replication::ack::AckDecision;
        let deadline = self.clock.monotonic() + Duration::from_millis(timeout_ms);
        loop {
            let decision = replica.core.borrow().ack(
                leader_epoch,
                Offset(replica.high_watermark.get()),
                Offset(end),
            );
            match decision {
                AckDecision::Committed => return Ok(()),
                AckDecision::NotLeader => {
                    return Err(OpError::new(
                        ErrorCode::NotLeaderOrFollower,
                        format!(
                            "leadership of {}-{} moved before the write was replicated",
                            key.topic, key.partition
                        ),
                    ))
                }
                AckDecision::NotEnoughReplicasAfterAppend => {
                    let role = replica.role();
                    return Err(OpError::new(
                        ErrorCode::NotEnoughReplicasAfterAppend,
                        format!(
                            "{}-{}: written, but the ISR shrank to {} below min.insync.replicas {}",
                            key.topic,
                            key.partition,
                            role.isr.len(),
                            role.min_insync
                        ),
                    ));
                }
                AckDecision::Wait => {}
            }
            let now = self.clock.monotonic();
            if now >= deadline {
                return Err(OpError::new(
                    ErrorCode::RequestTimedOut,
                    format!(
                        "{}-{}: in-sync replicas did not confirm offset {} within {timeout_ms} ms",
                        key.topic,
                        key.partition,
                        end - 1
                    ),
                ));
            }
            let wait = (deadline - now).clamp(
                Duration::from_millis(1),
                Duration::from_millis(ISR_CHECK_MS),
            );
            let version = replica.role_version.get();
            runtime::timeout(
                wait,
                futures_lite::future::or(
                    replica.high_watermark.wait_at_least(end),
                    replica.role_version.wait_at_least(version + 1),
                ),
            )
            .await;
        }
    }

    /// Records that `epoch` starts at `start` if it is new, durably.
    pub(super) fn note_epoch(&self, replica: &Replica, epoch: LeaderEpoch, start: Offset) {
        let changed = replica.core.borrow_mut().note_epoch(epoch, start);
        if changed {
            replica.save_epochs();
        }
    }

    /// A leader's high watermark from its ISR's progress and its own stable
    /// offset; wakes consumers.
    pub(super) fn update_high_watermark(&self, replica: &Replica) {
        let end = replica.log.stable_offset();
        let current = Offset(replica.high_watermark.get());
        if let Some(hw) = replica.core.borrow_mut().high_watermark(current, end) {
            let log_end = replica.log.log_end_offset();
            assert!(
                hw <= log_end,
                "a leader's high watermark {hw} passed its log end {log_end}"
            );
            replica.high_watermark.advance(hw.0);
        }
    }
}

/// The producer, decision and transaction number of a marker batch, if it
/// is one.
fn marker_of(batch: &[u8]) -> Option<(protocol::ProducerId, bool, i64)> {
    let parsed =
        protocol::RecordBatch::parse(batch, crate::log::config::STORED_BATCH_BYTES_MAX).ok()?;
    let marker = protocol::record_batch::marker::parse_marker(&parsed).ok()?;
    Some((
        parsed.header().producer_id,
        marker.kind == protocol::record_batch::marker::MarkerKind::Commit,
        marker.transaction_number,
    ))
}
