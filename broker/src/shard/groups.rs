//! Group coordinators on this shard: one per `__consumer_offsets` partition
//! the shard leads, each a `group::coordinator::GroupCoordinator` loaded from
//! that partition's log. A request (or a timer tick, or a topic change) runs
//! the state machine and appends the records it emitted, one at a time in
//! the order they were made (the slot's write gate); its answer goes out only
//! once the high watermark passes everything the coordinator has written, so
//! no client sees a group state that a failover could take back. A failed
//! append leaves the in-memory state ahead of the log: the slot is dropped
//! and loaded again from the log.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::Duration;

use protocol::{BatchBuilder, Compression, ErrorCode, LeaderEpoch, Offset, Record, RecordBatch};

use super::{OpError, Shard, METADATA_SHARD};
use crate::cluster_view::TopicSpec;
use crate::group::coordinator::{
    CommitRequest, CoordinatorConfig, GroupCoordinator, GroupDescription, GroupError, GroupSummary,
    HeartbeatRequest, HeartbeatResponse, Now,
};
use crate::group::records::{GroupRecord, OffsetValue};
use crate::group::{TopicPartition, OFFSETS_TOPIC};
use crate::log::config::STORED_BATCH_BYTES_MAX;
use crate::partition::PartitionKey;
use crate::runtime::{self, SerialGate};

/// How often coordinators expire sessions and offsets.
pub const GROUP_TICK_MS: u64 = 250;
/// Uncompressed bytes of group records in one appended batch.
pub const GROUP_BATCH_BYTES_MAX: usize = 256 << 10;
/// Pause before loading a partition again after a failed load.
const LOAD_RETRY_MS: u64 = 1_000;
/// Bytes read per step while loading a partition.
const LOAD_READ_BYTES_MAX: usize = 1 << 20;

/// What a client asks of the coordinator of a group.
#[derive(Debug)]
pub enum GroupOp {
    Heartbeat(HeartbeatRequest),
    Commit(CommitRequest),
    FetchOffsets {
        group_id: String,
        partitions: Option<Vec<TopicPartition>>,
    },
    Describe(String),
    Delete(String),
    DeleteOffsets {
        group_id: String,
        topic: String,
    },
}

impl GroupOp {
    pub fn group_id(&self) -> &str {
        match self {
            GroupOp::Heartbeat(r) => &r.group_id,
            GroupOp::Commit(r) => &r.group_id,
            GroupOp::FetchOffsets { group_id, .. }
            | GroupOp::DeleteOffsets { group_id, .. }
            | GroupOp::Describe(group_id)
            | GroupOp::Delete(group_id) => group_id,
        }
    }
}

#[derive(Debug)]
pub enum GroupAnswer {
    Heartbeat(HeartbeatResponse),
    Done,
    Offsets(Vec<(TopicPartition, Option<OffsetValue>)>),
    Described(GroupDescription),
}

#[derive(Debug)]
pub(super) enum SlotState {
    Loading,
    Active(GroupCoordinator),
    /// Dropped (leadership moved, or a write failed): answers NOT_COORDINATOR.
    Gone,
}

/// The coordinator of one `__consumer_offsets` partition this shard leads.
#[derive(Debug)]
pub(super) struct CoordinatorSlot {
    partition: i32,
    leader_epoch: LeaderEpoch,
    pub(super) state: RefCell<SlotState>,
    /// Orders state changes with their appends.
    write_gate: SerialGate,
    /// End of what this coordinator has written (or loaded): answers wait
    /// until the high watermark reaches it.
    written_end: Cell<i64>,
}

impl CoordinatorSlot {
    fn key(&self) -> PartitionKey {
        PartitionKey {
            topic: OFFSETS_TOPIC.to_string(),
            partition: self.partition,
        }
    }

    fn is_gone(&self) -> bool {
        matches!(*self.state.borrow(), SlotState::Gone)
    }
}

fn group_error(e: GroupError) -> OpError {
    OpError::new(e.code(), e.to_string())
}

fn not_coordinator(partition: i32, why: &str) -> OpError {
    OpError::new(
        ErrorCode::NotCoordinator,
        format!("this shard does not coordinate {OFFSETS_TOPIC}-{partition}: {why}"),
    )
}

impl Shard {
    fn group_now(&self) -> Now {
        Now {
            monotonic_ms: u64::try_from(self.clock.monotonic().as_millis()).unwrap_or(u64::MAX),
            wall_ms: self.clock.now_ms(),
        }
    }

    fn coordinator_config(&self) -> CoordinatorConfig {
        let minutes = i64::try_from(self.config.groups.offsets_retention_minutes)
            .unwrap_or(i64::MAX / 60_000);
        CoordinatorConfig {
            offsets_retention_ms: minutes.saturating_mul(60_000),
        }
    }

    /// Partition counts of every topic, as coordinators see the cluster.
    fn topic_partition_counts(&self) -> BTreeMap<String, u32> {
        self.view
            .borrow()
            .topics
            .iter()
            .filter(|(name, _)| name.as_str() != OFFSETS_TOPIC)
            .map(|(name, t)| {
                (
                    name.clone(),
                    u32::try_from(t.partitions.len()).expect("partitions bounded"),
                )
            })
            .collect()
    }

    /// Runs one group request on the coordinator of `partition`.
    pub(super) async fn group_call(
        self: &Rc<Self>,
        partition: i32,
        op: GroupOp,
    ) -> Result<GroupAnswer, OpError> {
        let slot = self
            .coordinators
            .borrow()
            .get(&partition)
            .cloned()
            .ok_or_else(|| not_coordinator(partition, "not its leader here"))?;
        let answer = {
            let _gate = slot.write_gate.enter().await;
            self.check_coordinator_writable(&slot)?;
            let now = self.group_now();
            let (records, answer) = {
                let mut state = slot.state.borrow_mut();
                let core = match &mut *state {
                    SlotState::Loading => {
                        return Err(OpError::new(
                            ErrorCode::CoordinatorLoadInProgress,
                            format!("{OFFSETS_TOPIC}-{partition} is loading"),
                        ))
                    }
                    SlotState::Gone => return Err(not_coordinator(partition, "it moved")),
                    SlotState::Active(core) => core,
                };
                let group_id = op.group_id().to_string();
                let out = run_op(core, op, now);
                core.check_group(&group_id);
                out
            };
            if !records.is_empty() {
                self.metrics.on_group_records(&records);
                self.append_group_records(&slot, &records).await?;
            }
            answer
        };
        // Errors wait too: "no such group" right after an unreplicated
        // delete would otherwise show a state a failover can undo.
        self.wait_group_committed(&slot).await?;
        answer.map_err(group_error)
    }

    /// Groups of every coordinator on this shard.
    pub(super) fn list_local_groups(&self) -> Vec<GroupSummary> {
        let mut out = Vec::new();
        for slot in self.coordinators.borrow().values() {
            if let SlotState::Active(core) = &*slot.state.borrow() {
                out.extend(core.list_groups());
            }
        }
        out
    }

    /// A coordinator writes with acks=all: refuse before changing state when
    /// that cannot succeed.
    fn check_coordinator_writable(&self, slot: &CoordinatorSlot) -> Result<(), OpError> {
        let (replica, epoch) = self
            .leader_replica(&slot.key())
            .map_err(|e| not_coordinator(slot.partition, &e.message))?;
        if epoch != slot.leader_epoch {
            return Err(not_coordinator(slot.partition, "its leader epoch moved"));
        }
        let role = replica.role();
        if role.isr.len() < role.min_insync {
            return Err(OpError::new(
                ErrorCode::CoordinatorNotAvailable,
                format!(
                    "{OFFSETS_TOPIC}-{} has {} in-sync replicas, fewer than min.insync.replicas {}",
                    slot.partition,
                    role.isr.len(),
                    role.min_insync
                ),
            ));
        }
        Ok(())
    }

    /// Appends records in batches, in order; on failure the slot is dropped
    /// and reloaded, since its state is ahead of its log.
    async fn append_group_records(
        self: &Rc<Self>,
        slot: &Rc<CoordinatorSlot>,
        records: &[GroupRecord],
    ) -> Result<(), OpError> {
        let timestamp_ms = self.clock.now_ms();
        let mut start = 0;
        while start < records.len() {
            let mut builder = BatchBuilder::new(Compression::None);
            let mut keys_values = Vec::new();
            let mut end = start;
            let mut bytes = 0;
            while end < records.len() && (end == start || bytes < GROUP_BATCH_BYTES_MAX) {
                let key = records[end].encode_key();
                let value = records[end].encode_value();
                bytes += key.len() + value.as_ref().map_or(0, |v| v.len());
                keys_values.push((key, value));
                end += 1;
            }
            for (key, value) in &keys_values {
                builder.push(&Record {
                    timestamp_ms,
                    key: Some(key),
                    value: value.as_deref(),
                    headers: &[],
                });
            }
            let batch = builder.build().expect("group records fit a batch");
            let result = if slot.is_gone() {
                Err(OpError::new(
                    ErrorCode::NotCoordinator,
                    "the coordinator was dropped",
                ))
            } else {
                self.produce_at(
                    slot.key(),
                    bytes::Bytes::from(batch),
                    0,
                    0,
                    Some(slot.leader_epoch),
                )
                .await
            };
            match result {
                Ok(outcome) => slot.written_end.set(outcome.log_end_offset.0),
                Err(e) => {
                    tracing::warn!(partition = slot.partition, error = %e.message, "group records not appended; reloading the coordinator");
                    self.drop_coordinator(slot);
                    return Err(not_coordinator(slot.partition, &e.message));
                }
            }
            start = end;
        }
        Ok(())
    }

    /// Waits until everything the coordinator wrote is stable and replicated.
    async fn wait_group_committed(&self, slot: &CoordinatorSlot) -> Result<(), OpError> {
        let key = slot.key();
        let (replica, epoch) = self
            .leader_replica(&key)
            .map_err(|e| not_coordinator(slot.partition, &e.message))?;
        if epoch != slot.leader_epoch {
            return Err(not_coordinator(slot.partition, "its leader epoch moved"));
        }
        let end = slot.written_end.get();
        replica
            .log
            .wait_for_ack(Offset(end))
            .await
            .map_err(|e| not_coordinator(slot.partition, &e.to_string()))?;
        self.update_high_watermark(&replica);
        let timeout_ms = self.config.groups.offsets_commit_timeout_ms;
        self.wait_committed(&key, &replica, epoch, end, timeout_ms)
            .await
            .map_err(|e| match e.code {
                ErrorCode::NotLeaderOrFollower => not_coordinator(slot.partition, &e.message),
                _ => e,
            })
    }

    /// Forgets a slot (its waiters answer NOT_COORDINATOR) and loads the
    /// partition again if this shard still leads it.
    /// The reload waits `LOAD_RETRY_MS`, so a write that keeps failing (a
    /// full disk, a record over the topic's batch bound) does not spin.
    fn drop_coordinator(self: &Rc<Self>, slot: &Rc<CoordinatorSlot>) {
        *slot.state.borrow_mut() = SlotState::Gone;
        let current = self.coordinators.borrow().get(&slot.partition).cloned();
        if current.is_some_and(|c| Rc::ptr_eq(&c, slot)) {
            self.coordinators.borrow_mut().remove(&slot.partition);
        }
        let not_before = self.clock.monotonic() + Duration::from_millis(LOAD_RETRY_MS);
        self.coordinator_reload_after
            .borrow_mut()
            .insert(slot.partition, not_before);
        let shard = self.clone();
        runtime::spawn(async move {
            runtime::sleep(Duration::from_millis(LOAD_RETRY_MS)).await;
            shard.sync_coordinators();
        })
        .detach();
    }

    /// After a metadata change: a coordinator for every `__consumer_offsets`
    /// partition this shard leads (loading the new ones), none for the rest;
    /// active coordinators learn the topics' partition counts.
    pub(super) fn sync_coordinators(self: &Rc<Self>) {
        let led: HashMap<i32, LeaderEpoch> = self
            .replicas
            .borrow()
            .iter()
            .filter(|(key, _)| key.topic == OFFSETS_TOPIC)
            .filter_map(|(key, replica)| {
                let role = replica.role();
                role.leader.then_some((key.partition, role.leader_epoch))
            })
            .collect();
        let stale: Vec<Rc<CoordinatorSlot>> = self
            .coordinators
            .borrow()
            .values()
            .filter(|slot| led.get(&slot.partition) != Some(&slot.leader_epoch))
            .cloned()
            .collect();
        for slot in stale {
            tracing::info!(partition = slot.partition, "no longer coordinating");
            *slot.state.borrow_mut() = SlotState::Gone;
            self.coordinators.borrow_mut().remove(&slot.partition);
        }
        let now = self.clock.monotonic();
        self.coordinator_reload_after
            .borrow_mut()
            .retain(|_, t| *t > now);
        for (partition, leader_epoch) in led {
            if self.coordinators.borrow().contains_key(&partition)
                || self
                    .coordinator_reload_after
                    .borrow()
                    .contains_key(&partition)
            {
                continue;
            }
            let slot = Rc::new(CoordinatorSlot {
                partition,
                leader_epoch,
                state: RefCell::new(SlotState::Loading),
                write_gate: SerialGate::new(),
                written_end: Cell::new(0),
            });
            self.coordinators
                .borrow_mut()
                .insert(partition, slot.clone());
            let shard = self.clone();
            runtime::spawn(async move { shard.load_coordinator(slot).await }).detach();
        }
        let topics = self.topic_partition_counts();
        let slots: Vec<Rc<CoordinatorSlot>> =
            self.coordinators.borrow().values().cloned().collect();
        for slot in slots {
            let shard = self.clone();
            let topics = topics.clone();
            runtime::spawn(async move {
                shard
                    .run_internal(&slot, |core, now| core.set_topics(topics, now))
                    .await;
            })
            .detach();
        }
    }

    /// Replays the partition's log into a fresh coordinator.
    async fn load_coordinator(self: Rc<Self>, slot: Rc<CoordinatorSlot>) {
        let key = slot.key();
        let started = self.clock.monotonic();
        let result: Result<(GroupCoordinator, i64, u64), String> = async {
            let replica = self.replica(&key).map_err(|e| e.message)?;
            let end = replica.log.log_end_offset();
            let mut core =
                // No topics yet: the current ones are given once loaded, so
                // every change since the log's records is applied then.
                GroupCoordinator::new(self.coordinator_config(), BTreeMap::new());
            let now = self.group_now();
            let mut offset = replica.log.log_start_offset();
            let mut records = 0u64;
            while offset < end {
                if slot.is_gone() {
                    return Err("leadership moved while loading".into());
                }
                let fetched = replica
                    .log
                    .read(offset, LOAD_READ_BYTES_MAX, end)
                    .await
                    .map_err(|e| e.to_string())?;
                if fetched.batch_count == 0 || fetched.next_offset <= offset {
                    break;
                }
                records += replay_batches(
                    &mut core,
                    &fetched.bytes,
                    now,
                    self.config.log.decompressed_bytes_max,
                )?;
                offset = fetched.next_offset;
            }
            core.restart_timers(self.group_now());
            Ok((core, end.0, records))
        }
        .await;
        if slot.is_gone() {
            return;
        }
        match result {
            Ok((core, end, records)) => {
                let groups = core.group_count();
                slot.written_end.set(end);
                *slot.state.borrow_mut() = SlotState::Active(core);
                let took_ms = self.clock.monotonic().saturating_sub(started).as_millis() as u64;
                tracing::info!(
                    partition = slot.partition,
                    groups,
                    records,
                    took_ms,
                    "coordinator loaded"
                );
                // Topic changes that arrived while loading.
                let topics = self.topic_partition_counts();
                self.run_internal(&slot, |core, now| core.set_topics(topics, now))
                    .await;
            }
            Err(e) => {
                tracing::error!(partition = slot.partition, error = %e, "loading the coordinator failed; retrying");
                self.drop_coordinator(&slot);
            }
        }
    }

    /// Runs a state change that answers nobody (a tick, a topic change)
    /// under the slot's gate and writes its records.
    async fn run_internal(
        self: &Rc<Self>,
        slot: &Rc<CoordinatorSlot>,
        change: impl FnOnce(&mut GroupCoordinator, Now) -> Vec<GroupRecord>,
    ) {
        let _gate = slot.write_gate.enter().await;
        if self.check_coordinator_writable(slot).is_err() {
            return;
        }
        let records = {
            let mut state = slot.state.borrow_mut();
            let SlotState::Active(core) = &mut *state else {
                return;
            };
            let records = change(core, self.group_now());
            // Only the groups the change touched: a tick runs every
            // GROUP_TICK_MS over coordinators that may hold many groups.
            let touched: std::collections::BTreeSet<&str> =
                records.iter().map(GroupRecord::group).collect();
            for group in touched {
                core.check_group(group);
            }
            records
        };
        if !records.is_empty() {
            self.metrics.on_group_records(&records);
            let _ = self.append_group_records(slot, &records).await;
        }
    }

    /// Expires sessions, stalled revocations and old offsets, forever.
    pub async fn run_group_ticks(self: Rc<Self>) {
        while !self.stopping.get() {
            runtime::sleep(Duration::from_millis(GROUP_TICK_MS)).await;
            let slots: Vec<Rc<CoordinatorSlot>> =
                self.coordinators.borrow().values().cloned().collect();
            for slot in slots {
                self.run_internal(&slot, |core, now| core.tick(now)).await;
            }
        }
    }

    /// The spec `__consumer_offsets` is created with: compacted, its
    /// replication factor capped by the live brokers.
    pub(super) fn offsets_topic_spec(&self) -> TopicSpec {
        let groups = &self.config.groups;
        let live = self
            .view
            .borrow()
            .brokers
            .values()
            .filter(|b| !b.fenced)
            .count()
            .max(1);
        let replication_factor = usize::from(groups.offsets_topic_replication_factor).min(live);
        let min_insync = if replication_factor >= 3 { 2 } else { 1 };
        TopicSpec {
            name: OFFSETS_TOPIC.to_string(),
            partitions: i32::try_from(groups.offsets_topic_partitions).expect("bounded"),
            replication_factor: i16::try_from(replication_factor).expect("bounded"),
            configs: [
                ("cleanup.policy".to_string(), "compact".to_string()),
                (
                    "segment.bytes".to_string(),
                    groups.offsets_topic_segment_bytes.to_string(),
                ),
                (
                    crate::cluster_view::MIN_INSYNC_REPLICAS.to_string(),
                    min_insync.to_string(),
                ),
            ]
            .into(),
        }
    }

    /// Shard 0 only: creates `__consumer_offsets` (once; a concurrent
    /// creation by another broker answers TOPIC_ALREADY_EXISTS, which is fine).
    pub(super) async fn ensure_offsets_topic(self: &Rc<Self>) -> Result<(), OpError> {
        assert_eq!(self.id, METADATA_SHARD, "topic admin runs on shard 0");
        if self.view.borrow().topic(OFFSETS_TOPIC).is_some() {
            return Ok(());
        }
        let spec = self.offsets_topic_spec();
        let outcome = self.create_topics_checked(vec![spec], true).await;
        match outcome.into_iter().next().and_then(|o| o.error) {
            None => Ok(()),
            Some(e) if e.code == ErrorCode::TopicAlreadyExists => Ok(()),
            Some(e) => Err(e),
        }
    }
}

fn run_op(
    core: &mut GroupCoordinator,
    op: GroupOp,
    now: Now,
) -> (Vec<GroupRecord>, Result<GroupAnswer, GroupError>) {
    match op {
        GroupOp::Heartbeat(request) => {
            let w = core.heartbeat(&request, now);
            (w.records, w.response.map(GroupAnswer::Heartbeat))
        }
        GroupOp::Commit(request) => {
            let w = core.commit(&request, now);
            (w.records, w.response.map(|()| GroupAnswer::Done))
        }
        GroupOp::FetchOffsets {
            group_id,
            partitions,
        } => (
            Vec::new(),
            core.fetch_offsets(&group_id, partitions.as_deref())
                .map(GroupAnswer::Offsets),
        ),
        GroupOp::Describe(group_id) => (
            Vec::new(),
            core.describe_group(&group_id).map(GroupAnswer::Described),
        ),
        GroupOp::Delete(group_id) => {
            let w = core.delete_group(&group_id, now);
            (w.records, w.response.map(|()| GroupAnswer::Done))
        }
        GroupOp::DeleteOffsets { group_id, topic } => {
            let w = core.delete_offsets(&group_id, &topic, now);
            (w.records, w.response.map(|()| GroupAnswer::Done))
        }
    }
}

/// Replays every record of the stored batches in `bytes`; returns how many.
/// Control batches carry no group records. A record that does not decode is
/// skipped with an error logged: it cannot be a group's latest state, since
/// this build wrote none like it.
fn replay_batches(
    core: &mut GroupCoordinator,
    mut bytes: &[u8],
    now: Now,
    decompressed_bytes_max: usize,
) -> Result<u64, String> {
    let mut count = 0;
    while !bytes.is_empty() {
        let total = protocol::record_batch::peek_total_bytes(bytes)
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| *n <= bytes.len())
            .ok_or("truncated batch while loading")?;
        let batch = RecordBatch::parse(&bytes[..total], STORED_BATCH_BYTES_MAX)
            .map_err(|e| e.to_string())?;
        bytes = &bytes[total..];
        if batch.header().is_control() {
            continue;
        }
        let section = batch
            .records_section(decompressed_bytes_max)
            .map_err(|e| e.to_string())?;
        for record in section.iter() {
            let record = record.map_err(|e| e.to_string())?;
            let Some(key) = record.key else { continue };
            match GroupRecord::decode(key, record.value) {
                Ok(r) => {
                    core.replay(&r, now);
                    count += 1;
                }
                Err(e) => {
                    tracing::error!(offset = record.offset.0, error = %e, "skipping an unreadable group record")
                }
            }
        }
    }
    Ok(count)
}

impl Shard {
    /// Groups by state and committed offsets of this shard's coordinators,
    /// with the lag the last probe measured (`group_lag`).
    pub(super) fn group_gauges(&self) -> crate::metrics::GroupGauges {
        let mut gauges = crate::metrics::GroupGauges::default();
        let now_ms = self.clock.now_ms();
        let lag = self.group_lag.borrow();
        for slot in self.coordinators.borrow().values() {
            let SlotState::Active(core) = &*slot.state.borrow() else {
                continue;
            };
            for summary in core.list_groups() {
                *gauges
                    .groups_by_state
                    .entry(summary.state.name())
                    .or_default() += 1;
                let Ok(description) = core.describe_group(&summary.group_id) else {
                    continue;
                };
                for (tp, committed) in description.offsets {
                    let key = (
                        summary.group_id.clone(),
                        tp.topic.clone(),
                        tp.partition.0 as i32,
                    );
                    let sample = lag.get(&key);
                    gauges.committed.push(crate::metrics::CommittedGauge {
                        group: summary.group_id.clone(),
                        topic: tp.topic,
                        partition: tp.partition.0,
                        offset: committed.offset,
                        lag_records: sample.map(|s| (s.high_watermark - committed.offset).max(0)),
                        lag_seconds: sample.map(|s| {
                            s.first_unread_timestamp_ms
                                .map_or(0.0, |ts| (now_ms - ts).max(0) as f64 / 1000.0)
                        }),
                    });
                }
            }
        }
        gauges
    }
}
