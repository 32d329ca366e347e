//! Coordinators hosted on the leaders of an internal compacted topic's
//! partitions (group coordinators on `__consumer_offsets`, transaction
//! coordinators on `__transaction_state`): one slot per led partition,
//! loaded from that partition's log. A request (or a timer tick) runs the
//! state machine and appends the records it emitted, one change at a time
//! in the order they were made (the slot's write gate); its answer goes out
//! only once the high watermark passes everything the coordinator has
//! written, so no client sees a state that a failover could take back. A
//! failed append leaves the in-memory state ahead of the log: the slot is
//! dropped and loaded again from the log after a pause.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt::Debug;
use std::rc::Rc;
use std::time::Duration;

use protocol::record_batch::marker::{parse_marker, MarkerKind};
use protocol::record_batch::stamp_producer;
use protocol::{
    BatchBuilder, Compression, ErrorCode, LeaderEpoch, Offset, ProducerEpoch, ProducerId, Record,
    RecordBatch, Sequence,
};

use super::{OpError, Shard};
use crate::log::config::STORED_BATCH_BYTES_MAX;
use crate::partition::PartitionKey;
use crate::runtime::{self, SerialGate};

/// Pause before loading a partition again after a failed load or write.
const LOAD_RETRY_MS: u64 = 1_000;
/// Bytes read per step while loading a partition.
const LOAD_READ_BYTES_MAX: usize = 1 << 20;
/// Uncompressed bytes of coordinator records in one appended batch.
pub const HOSTED_BATCH_BYTES_MAX: usize = 256 << 10;

/// A coordinator state machine the shard hosts on an internal topic.
pub(super) trait HostedCore: Sized + Debug + 'static {
    type Record: Debug;
    /// The internal topic whose partitions hold the state.
    const TOPIC: &'static str;

    /// This kind's slots on the shard.
    fn slots(shard: &Shard) -> &Slots<Self>;
    /// An empty coordinator to load a partition into.
    fn fresh(shard: &Shard) -> Self;
    /// Applies one stored record while loading.
    fn replay_record(
        &mut self,
        shard: &Shard,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), String>;
    /// Applies a record of `producer_id`'s transaction while loading; it
    /// takes effect at the transaction's marker.
    fn replay_transactional(
        &mut self,
        shard: &Shard,
        _producer_id: ProducerId,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), String> {
        self.replay_record(shard, key, value)
    }
    /// A transaction marker of `producer_id` in the partition (loading, or
    /// written live).
    fn replay_marker(&mut self, _shard: &Shard, _producer_id: ProducerId, _commit: bool) {}
    /// Once every record is replayed, before the slot serves.
    fn finish_load(&mut self, _shard: &Shard) {}
    /// Once the slot serves: work the loaded state owes (a task may be
    /// spawned).
    fn on_loaded(_shard: &Rc<Shard>, _slot: &Rc<Slot<Self>>) {}
    /// After a metadata change, for every slot kept.
    fn on_metadata(_shard: &Rc<Shard>, _slots: Vec<Rc<Slot<Self>>>) {}
    /// Key and value of a record as stored.
    fn encode(record: &Self::Record) -> (bytes::Bytes, Option<bytes::Bytes>);
    /// How long a written change may wait for replication.
    fn write_timeout_ms(shard: &Shard) -> u64;
    /// Counts records written, for metrics.
    fn on_written(_shard: &Shard, _records: &[Self::Record]) {}
}

#[derive(Debug)]
pub(super) enum SlotState<C> {
    Loading,
    Active(C),
    /// Dropped (leadership moved, or a write failed): answers NOT_COORDINATOR.
    Gone,
}

/// The coordinator of one internal partition this shard leads.
#[derive(Debug)]
pub(super) struct Slot<C> {
    pub(super) partition: i32,
    pub(super) leader_epoch: LeaderEpoch,
    pub(super) state: RefCell<SlotState<C>>,
    /// Orders state changes with their appends.
    write_gate: SerialGate,
    /// End of what this coordinator has written (or loaded): answers wait
    /// until the high watermark reaches it.
    written_end: Cell<i64>,
}

impl<C: HostedCore> Slot<C> {
    fn key(&self) -> PartitionKey {
        PartitionKey {
            topic: C::TOPIC.to_string(),
            partition: self.partition,
        }
    }

    pub(super) fn is_gone(&self) -> bool {
        matches!(*self.state.borrow(), SlotState::Gone)
    }
}

/// One kind's slots on a shard, by partition.
#[derive(Debug)]
pub(super) struct Slots<C> {
    map: RefCell<HashMap<i32, Rc<Slot<C>>>>,
    /// Partitions whose coordinator failed: not reloaded before this
    /// monotonic time.
    reload_after: RefCell<HashMap<i32, Duration>>,
}

impl<C> Default for Slots<C> {
    fn default() -> Slots<C> {
        Slots {
            map: RefCell::new(HashMap::new()),
            reload_after: RefCell::new(HashMap::new()),
        }
    }
}

impl<C> Slots<C> {
    pub(super) fn list(&self) -> Vec<Rc<Slot<C>>> {
        self.map.borrow().values().cloned().collect()
    }

    pub(super) fn get(&self, partition: i32) -> Option<Rc<Slot<C>>> {
        self.map.borrow().get(&partition).cloned()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.map.borrow().is_empty()
    }

    /// Calls `f` with every loaded coordinator.
    pub(super) fn for_each_active(&self, mut f: impl FnMut(&C)) {
        for slot in self.map.borrow().values() {
            if let SlotState::Active(core) = &*slot.state.borrow() {
                f(core);
            }
        }
    }
}

pub(super) fn not_coordinator<C: HostedCore>(partition: i32, why: &str) -> OpError {
    OpError::new(
        ErrorCode::NotCoordinator,
        format!(
            "this shard does not coordinate {}-{partition}: {why}",
            C::TOPIC
        ),
    )
}

impl Shard {
    /// Runs one change on the coordinator of `partition`: `change` returns
    /// the records to write and the answer, which is returned once the
    /// records (and everything written before) are replicated.
    pub(super) async fn hosted_call<C: HostedCore, T>(
        self: &Rc<Self>,
        partition: i32,
        change: impl FnOnce(&mut C) -> (Vec<C::Record>, T),
    ) -> Result<T, OpError> {
        self.hosted_call_as(partition, None, change).await
    }

    /// `hosted_call` whose records are written as part of `producer`'s
    /// transaction (a transactional batch under its id and epoch). A
    /// producer the partition knows at a newer epoch is refused before
    /// anything changes.
    pub(super) async fn hosted_call_as<C: HostedCore, T>(
        self: &Rc<Self>,
        partition: i32,
        producer: Option<(ProducerId, ProducerEpoch)>,
        change: impl FnOnce(&mut C) -> (Vec<C::Record>, T),
    ) -> Result<T, OpError> {
        let slot = C::slots(self)
            .map
            .borrow()
            .get(&partition)
            .cloned()
            .ok_or_else(|| not_coordinator::<C>(partition, "not its leader here"))?;
        let answer = {
            let _gate = slot.write_gate.enter().await;
            self.check_hosted_writable(&slot)?;
            if let Some((id, epoch)) = producer {
                self.next_sequence_of(&slot, id, epoch)?;
            }
            let (records, answer) = {
                let mut state = slot.state.borrow_mut();
                let core = match &mut *state {
                    SlotState::Loading => {
                        return Err(OpError::new(
                            ErrorCode::CoordinatorLoadInProgress,
                            format!("{}-{partition} is loading", C::TOPIC),
                        ))
                    }
                    SlotState::Gone => return Err(not_coordinator::<C>(partition, "it moved")),
                    SlotState::Active(core) => core,
                };
                change(core)
            };
            let wrote = !records.is_empty();
            if wrote {
                C::on_written(self, &records);
                self.append_hosted(&slot, &records, producer).await?;
            }
            (answer, wrote)
        };
        // Errors wait too: "no such group" right after an unreplicated
        // delete would otherwise show a state a failover can undo.
        if let Err(e) = self.wait_hosted_committed(&slot).await {
            if answer.1 {
                // The state moved on with records whose fate is unknown
                // (and may owe work, such as a prepared transaction's
                // markers): the log decides, through a reload.
                self.drop_hosted(&slot);
            }
            return Err(e);
        }
        Ok(answer.0)
    }

    /// Runs a change that answers nobody (a tick, a topic change) under the
    /// slot's gate and appends its records, without waiting for their
    /// replication (`wait_hosted_committed`); `None` when the slot does not
    /// serve or the append failed.
    pub(super) async fn hosted_internal<C: HostedCore, T>(
        self: &Rc<Self>,
        slot: &Rc<Slot<C>>,
        change: impl FnOnce(&mut C) -> (Vec<C::Record>, T),
    ) -> Option<T> {
        let _gate = slot.write_gate.enter().await;
        self.check_hosted_writable(slot).ok()?;
        let (records, out) = {
            let mut state = slot.state.borrow_mut();
            let SlotState::Active(core) = &mut *state else {
                return None;
            };
            change(core)
        };
        if !records.is_empty() {
            C::on_written(self, &records);
            self.append_hosted(slot, &records, None).await.ok()?;
        }
        Some(out)
    }

    /// A coordinator writes with acks=all: refuse before changing state when
    /// that cannot succeed.
    fn check_hosted_writable<C: HostedCore>(&self, slot: &Slot<C>) -> Result<(), OpError> {
        let (replica, epoch) = self
            .leader_replica(&slot.key())
            .map_err(|e| not_coordinator::<C>(slot.partition, &e.message))?;
        if epoch != slot.leader_epoch {
            return Err(not_coordinator::<C>(
                slot.partition,
                "its leader epoch moved",
            ));
        }
        let role = replica.role();
        if role.isr.len() < role.min_insync {
            return Err(OpError::new(
                ErrorCode::CoordinatorNotAvailable,
                format!(
                    "{}-{} has {} in-sync replicas, fewer than min.insync.replicas {}",
                    C::TOPIC,
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
    async fn append_hosted<C: HostedCore>(
        self: &Rc<Self>,
        slot: &Rc<Slot<C>>,
        records: &[C::Record],
        producer: Option<(ProducerId, ProducerEpoch)>,
    ) -> Result<(), OpError> {
        let timestamp_ms = self.clock.now_ms();
        let mut start = 0;
        while start < records.len() {
            let mut keys_values = Vec::new();
            let mut end = start;
            let mut bytes = 0;
            while end < records.len() && (end == start || bytes < HOSTED_BATCH_BYTES_MAX) {
                let (key, value) = C::encode(&records[end]);
                bytes += key.len() + value.as_ref().map_or(0, |v| v.len());
                keys_values.push((key, value));
                end += 1;
            }
            let mut builder =
                BatchBuilder::new(Compression::None).transactional(producer.is_some());
            for (key, value) in &keys_values {
                builder.push(&Record {
                    timestamp_ms,
                    key: Some(key),
                    value: value.as_deref(),
                    headers: &[],
                });
            }
            let mut batch = builder.build().expect("coordinator records fit a batch");
            if let Some((id, epoch)) = producer {
                // The coordinator is the partition's only writer (under the
                // slot's gate), so the next sequence cannot move meanwhile.
                let sequence = self.next_sequence_of(slot, id, epoch)?;
                stamp_producer(&mut batch, id, epoch, sequence);
            }
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
                    tracing::warn!(topic = C::TOPIC, partition = slot.partition, error = %e.message, "coordinator records not appended; reloading the coordinator");
                    self.drop_hosted(slot);
                    return Err(not_coordinator::<C>(slot.partition, &e.message));
                }
            }
            start = end;
        }
        Ok(())
    }

    /// The sequence `producer`'s next batch in the slot's partition starts
    /// at; PRODUCER_FENCED when the partition knows a newer epoch.
    fn next_sequence_of<C: HostedCore>(
        &self,
        slot: &Slot<C>,
        producer_id: ProducerId,
        producer_epoch: ProducerEpoch,
    ) -> Result<Sequence, OpError> {
        let replica = self.replica(&slot.key())?;
        let Some(entry) = replica.log.producer_entry(producer_id) else {
            return Ok(Sequence(0));
        };
        if producer_epoch < entry.epoch {
            return Err(OpError::new(
                ErrorCode::ProducerFenced,
                format!(
                    "producer {} epoch {} is fenced by epoch {}",
                    producer_id.0, producer_epoch.0, entry.epoch.0
                ),
            ));
        }
        if producer_epoch > entry.epoch {
            return Ok(Sequence(0));
        }
        Ok(entry.batches.back().map_or(Sequence(0), |b| {
            crate::log::producer_state::next_sequence(b.last_sequence)
        }))
    }

    /// A transaction marker was written to a partition this shard leads:
    /// the coordinator hosted there (if loaded) applies it. One that is
    /// loading reads it from the log (loading runs to the log's end).
    pub(super) async fn hosted_marker<C: HostedCore>(
        self: &Rc<Self>,
        partition: i32,
        producer_id: ProducerId,
        commit: bool,
    ) {
        let Some(slot) = C::slots(self).get(partition) else {
            return;
        };
        let _gate = slot.write_gate.enter().await;
        let mut state = slot.state.borrow_mut();
        if let SlotState::Active(core) = &mut *state {
            core.replay_marker(self, producer_id, commit);
        }
    }

    /// Waits until everything the coordinator wrote is stable and replicated.
    pub(super) async fn wait_hosted_committed<C: HostedCore>(
        &self,
        slot: &Slot<C>,
    ) -> Result<(), OpError> {
        let key = slot.key();
        let (replica, epoch) = self
            .leader_replica(&key)
            .map_err(|e| not_coordinator::<C>(slot.partition, &e.message))?;
        if epoch != slot.leader_epoch {
            return Err(not_coordinator::<C>(
                slot.partition,
                "its leader epoch moved",
            ));
        }
        let end = slot.written_end.get();
        replica
            .log
            .wait_for_ack(Offset(end))
            .await
            .map_err(|e| not_coordinator::<C>(slot.partition, &e.to_string()))?;
        self.update_high_watermark(&replica);
        self.wait_committed(&key, &replica, epoch, end, C::write_timeout_ms(self))
            .await
            .map_err(|e| match e.code {
                ErrorCode::NotLeaderOrFollower => not_coordinator::<C>(slot.partition, &e.message),
                _ => e,
            })
    }

    /// Forgets a slot (its waiters answer NOT_COORDINATOR) and loads the
    /// partition again if this shard still leads it.
    /// The reload waits `LOAD_RETRY_MS`, so a write that keeps failing (a
    /// full disk, a record over the topic's batch bound) does not spin.
    pub(super) fn drop_hosted<C: HostedCore>(self: &Rc<Self>, slot: &Rc<Slot<C>>) {
        *slot.state.borrow_mut() = SlotState::Gone;
        let slots = C::slots(self);
        let current = slots.map.borrow().get(&slot.partition).cloned();
        if current.is_some_and(|c| Rc::ptr_eq(&c, slot)) {
            slots.map.borrow_mut().remove(&slot.partition);
        }
        let not_before = self.clock.monotonic() + Duration::from_millis(LOAD_RETRY_MS);
        slots
            .reload_after
            .borrow_mut()
            .insert(slot.partition, not_before);
        let shard = self.clone();
        runtime::spawn(async move {
            runtime::sleep(Duration::from_millis(LOAD_RETRY_MS)).await;
            shard.sync_hosted::<C>();
        })
        .detach();
    }

    /// After a metadata change: a coordinator for every partition of
    /// `C::TOPIC` this shard leads (loading the new ones), none for the rest.
    pub(super) fn sync_hosted<C: HostedCore>(self: &Rc<Self>) {
        let led: HashMap<i32, LeaderEpoch> = self
            .replicas
            .borrow()
            .iter()
            .filter(|(key, _)| key.topic == C::TOPIC)
            .filter_map(|(key, replica)| {
                let role = replica.role();
                role.leader.then_some((key.partition, role.leader_epoch))
            })
            .collect();
        let slots = C::slots(self);
        let stale: Vec<Rc<Slot<C>>> = slots
            .map
            .borrow()
            .values()
            .filter(|slot| led.get(&slot.partition) != Some(&slot.leader_epoch))
            .cloned()
            .collect();
        for slot in stale {
            tracing::info!(
                topic = C::TOPIC,
                partition = slot.partition,
                "no longer coordinating"
            );
            *slot.state.borrow_mut() = SlotState::Gone;
            slots.map.borrow_mut().remove(&slot.partition);
        }
        let now = self.clock.monotonic();
        slots.reload_after.borrow_mut().retain(|_, t| *t > now);
        for (partition, leader_epoch) in led {
            if slots.map.borrow().contains_key(&partition)
                || slots.reload_after.borrow().contains_key(&partition)
            {
                continue;
            }
            let slot = Rc::new(Slot {
                partition,
                leader_epoch,
                state: RefCell::new(SlotState::Loading),
                write_gate: SerialGate::new(),
                written_end: Cell::new(0),
            });
            slots.map.borrow_mut().insert(partition, slot.clone());
            let shard = self.clone();
            runtime::spawn(async move { shard.load_hosted(slot).await }).detach();
        }
        C::on_metadata(self, slots.list());
    }

    /// Replays the partition's log into a fresh coordinator.
    async fn load_hosted<C: HostedCore>(self: Rc<Self>, slot: Rc<Slot<C>>) {
        let key = slot.key();
        let started = self.clock.monotonic();
        let result: Result<(C, i64, u64), String> = async {
            let replica = self.replica(&key).map_err(|e| e.message)?;
            let mut core = C::fresh(&self);
            let mut offset = replica.log.log_start_offset();
            let mut records = 0u64;
            // To the log's end as it is when the last read returns: markers
            // other writers append while loading are read here, since the
            // slot turns active in the same step (no await in between).
            let mut end = replica.log.log_end_offset();
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
                records += replay_batches(&mut core, &self, &fetched.bytes)?;
                offset = fetched.next_offset;
                end = replica.log.log_end_offset();
            }
            core.finish_load(&self);
            Ok((core, end.0, records))
        }
        .await;
        if slot.is_gone() {
            return;
        }
        match result {
            Ok((core, end, records)) => {
                slot.written_end.set(end);
                *slot.state.borrow_mut() = SlotState::Active(core);
                let took_ms = self.clock.monotonic().saturating_sub(started).as_millis() as u64;
                tracing::info!(
                    topic = C::TOPIC,
                    partition = slot.partition,
                    records,
                    took_ms,
                    "coordinator loaded"
                );
                C::on_loaded(&self, &slot);
            }
            Err(e) => {
                tracing::error!(topic = C::TOPIC, partition = slot.partition, error = %e, "loading the coordinator failed; retrying");
                self.drop_hosted(&slot);
            }
        }
    }
}

/// Replays every record of the stored batches in `bytes`; returns how many.
/// Control batches carry no coordinator records. A record that does not
/// decode is skipped with an error logged: it cannot be a coordinator's
/// latest state, since this build wrote none like it.
fn replay_batches<C: HostedCore>(
    core: &mut C,
    shard: &Shard,
    mut bytes: &[u8],
) -> Result<u64, String> {
    let decompressed_bytes_max = shard.config.log.decompressed_bytes_max;
    let mut count = 0;
    while !bytes.is_empty() {
        let total = protocol::record_batch::peek_total_bytes(bytes)
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| *n <= bytes.len())
            .ok_or("truncated batch while loading")?;
        let batch = RecordBatch::parse(&bytes[..total], STORED_BATCH_BYTES_MAX)
            .map_err(|e| e.to_string())?;
        bytes = &bytes[total..];
        let header = batch.header();
        if header.is_control() {
            match parse_marker(&batch) {
                Ok(marker) => {
                    core.replay_marker(shard, header.producer_id, marker.kind == MarkerKind::Commit)
                }
                Err(e) => {
                    tracing::error!(topic = C::TOPIC, error = %e, "skipping an unreadable control batch")
                }
            }
            continue;
        }
        let transactional = header.is_transactional().then_some(header.producer_id);
        let section = batch
            .records_section(decompressed_bytes_max)
            .map_err(|e| e.to_string())?;
        for record in section.iter() {
            let record = record.map_err(|e| e.to_string())?;
            let Some(key) = record.key else { continue };
            let replayed = match transactional {
                Some(id) => core.replay_transactional(shard, id, key, record.value),
                None => core.replay_record(shard, key, record.value),
            };
            match replayed {
                Ok(()) => count += 1,
                Err(e) => {
                    tracing::error!(topic = C::TOPIC, offset = record.offset.0, error = %e, "skipping an unreadable coordinator record")
                }
            }
        }
    }
    Ok(count)
}
