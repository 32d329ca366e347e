//! Group coordinators on this shard: one per `__consumer_offsets` partition
//! the shard leads, each a `group::coordinator::GroupCoordinator` hosted as
//! `hosted` describes (loaded from that partition's log, changes appended in
//! order, answers once replicated). Requests, the timer tick and topic
//! changes drive it.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use super::hosted::{HostedCore, Slot, Slots};
use super::{OpError, Shard};
use crate::cluster_view::TopicSpec;
use crate::group::coordinator::{
    CommitRequest, CoordinatorConfig, GroupCoordinator, GroupDescription, GroupError, GroupSummary,
    HeartbeatRequest, HeartbeatResponse, Now,
};
use crate::group::records::{GroupRecord, OffsetValue};
use crate::group::{TopicPartition, OFFSETS_TOPIC};
use crate::runtime;
use protocol::{ProducerEpoch, ProducerId};

/// How often coordinators expire sessions and offsets.
pub const GROUP_TICK_MS: u64 = 250;

/// What a client asks of the coordinator of a group.
#[derive(Debug)]
pub enum GroupOp {
    Heartbeat(HeartbeatRequest),
    Commit(CommitRequest),
    /// A commit inside a producer's transaction (TxnOffsetCommit).
    TxnCommit {
        request: CommitRequest,
        producer_id: ProducerId,
        producer_epoch: ProducerEpoch,
    },
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
            GroupOp::Commit(r) | GroupOp::TxnCommit { request: r, .. } => &r.group_id,
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

pub(super) type GroupSlot = Slot<GroupCoordinator>;

fn group_error(e: GroupError) -> OpError {
    OpError::new(e.code(), e.to_string())
}

impl HostedCore for GroupCoordinator {
    type Record = GroupRecord;
    const TOPIC: &'static str = OFFSETS_TOPIC;

    fn slots(shard: &Shard) -> &Slots<GroupCoordinator> {
        &shard.coordinators
    }

    fn fresh(shard: &Shard) -> GroupCoordinator {
        // No topics yet: the current ones are given once loaded, so every
        // change since the log's records is applied then.
        GroupCoordinator::new(shard.coordinator_config(), BTreeMap::new())
    }

    fn replay_record(
        &mut self,
        shard: &Shard,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), String> {
        let record = GroupRecord::decode(key, value).map_err(|e| e.to_string())?;
        self.replay(&record, shard.group_now());
        Ok(())
    }

    fn replay_transactional(
        &mut self,
        _shard: &Shard,
        producer_id: ProducerId,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), String> {
        let record = GroupRecord::decode(key, value).map_err(|e| e.to_string())?;
        self.replay_txn(producer_id.0, &record);
        Ok(())
    }

    fn replay_marker(&mut self, shard: &Shard, producer_id: ProducerId, commit: bool) {
        self.complete_txn(producer_id.0, commit, shard.group_now());
    }

    fn finish_load(&mut self, shard: &Shard) {
        self.restart_timers(shard.group_now());
    }

    fn on_loaded(shard: &Rc<Shard>, slot: &Rc<GroupSlot>) {
        // Topic changes that arrived while loading.
        Self::on_metadata(shard, vec![slot.clone()]);
    }

    fn on_metadata(shard: &Rc<Shard>, slots: Vec<Rc<GroupSlot>>) {
        let topics = shard.topic_partition_counts();
        for slot in slots {
            let shard = shard.clone();
            let topics = topics.clone();
            runtime::spawn(async move {
                shard
                    .hosted_internal(&slot, |core: &mut GroupCoordinator| {
                        let records = core.set_topics(topics, shard.group_now());
                        check_touched(core, &records);
                        (records, ())
                    })
                    .await;
            })
            .detach();
        }
    }

    fn encode(record: &GroupRecord) -> (bytes::Bytes, Option<bytes::Bytes>) {
        (record.encode_key(), record.encode_value())
    }

    fn write_timeout_ms(shard: &Shard) -> u64 {
        shard.config.groups.offsets_commit_timeout_ms
    }

    fn on_written(shard: &Shard, records: &[GroupRecord]) {
        shard.metrics.on_group_records(records);
    }
}

/// Checks only the groups a change touched: a tick runs every
/// GROUP_TICK_MS over coordinators that may hold many groups.
fn check_touched(core: &GroupCoordinator, records: &[GroupRecord]) {
    let touched: std::collections::BTreeSet<&str> =
        records.iter().map(GroupRecord::group).collect();
    for group in touched {
        core.check_group(group);
    }
}

impl Shard {
    pub(super) fn group_now(&self) -> Now {
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
            .filter(|(name, _)| !super::is_internal_topic(name))
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
        let now = self.group_now();
        let producer = match &op {
            GroupOp::TxnCommit {
                producer_id,
                producer_epoch,
                ..
            } => Some((*producer_id, *producer_epoch)),
            _ => None,
        };
        self.hosted_call_as(partition, producer, |core: &mut GroupCoordinator| {
            let group_id = op.group_id().to_string();
            let out = run_op(core, op, now);
            core.check_group(&group_id);
            out
        })
        .await?
        .map_err(group_error)
    }

    /// Groups of every coordinator on this shard.
    pub(super) fn list_local_groups(&self) -> Vec<GroupSummary> {
        let mut out = Vec::new();
        self.coordinators
            .for_each_active(|core| out.extend(core.list_groups()));
        out
    }

    /// Expires sessions, stalled revocations and old offsets, forever.
    pub async fn run_group_ticks(self: Rc<Self>) {
        while !self.stopping.get() {
            runtime::sleep(Duration::from_millis(GROUP_TICK_MS)).await;
            for slot in self.coordinators.list() {
                let now = self.group_now();
                self.hosted_internal(&slot, |core: &mut GroupCoordinator| {
                    let records = core.tick(now);
                    check_touched(core, &records);
                    (records, ())
                })
                .await;
            }
        }
    }

    /// The spec `__consumer_offsets` is created with.
    pub(super) fn offsets_topic_spec(&self) -> TopicSpec {
        let groups = &self.config.groups;
        self.internal_topic_spec(
            OFFSETS_TOPIC,
            groups.offsets_topic_partitions,
            groups.offsets_topic_replication_factor,
            groups.offsets_topic_segment_bytes,
        )
    }

    /// Shard 0 only: creates `__consumer_offsets` once.
    pub(super) async fn ensure_offsets_topic(self: &Rc<Self>) -> Result<(), OpError> {
        let spec = self.offsets_topic_spec();
        self.ensure_internal_topic(spec).await
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
        GroupOp::TxnCommit {
            request,
            producer_id,
            ..
        } => {
            let w = core.txn_commit(&request, producer_id.0, now);
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

impl Shard {
    /// Groups by state and committed offsets of this shard's coordinators,
    /// with the lag the last probe measured (`group_lag`).
    pub(super) fn group_gauges(&self) -> crate::metrics::GroupGauges {
        let mut gauges = crate::metrics::GroupGauges::default();
        let now_ms = self.clock.now_ms();
        let lag = self.group_lag.borrow();
        self.coordinators.for_each_active(|core| {
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
        });
        gauges
    }
}
