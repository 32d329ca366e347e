//! Consumption through consumer groups, for `ringlog-loadgen run
//! --consumer-group`: `GroupConsumers` starts `--consumers` members (one
//! `client::GroupConsumer` each, in its own task) in each of the run's
//! groups, waits until every group is stable before producers start, tells
//! the drain when each group has read everything acked, and at the end
//! closes the members (commit, leave) and summarises each group with its
//! committed lag. Members account records as the load generator's own
//! consumers do: end-to-end latency from the payload stamp, per-second
//! counts, and the verify history, kept per group because every group
//! reads every record (a record read by two groups is no duplicate).
//!
//! Members auto-commit every `AUTO_COMMIT_INTERVAL_MS` and on close, so a
//! partition that moves between members goes on from where it was; the
//! load generator never commits for them. Before producers start, a member
//! moves every partition it is given to the log end and commits there:
//! records read then predate the run and are skipped, so a group that
//! committed in an earlier run still measures only this run's records.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use client::{
    Admin, Cluster, ConsumerConfig, ConsumerRecord, GroupConfig, GroupConsumer, OffsetReset,
    SeekTo, TopicPartition,
};
use tokio::task::JoinHandle;

use crate::consume::{
    record_consumed, wall_us, History, RideThroughCounters, FETCH_BYTES_MAX,
    FETCH_PARTITION_BYTES_MAX, FETCH_WAIT_MS, RETRY_BACKOFF_MS,
};
use crate::group_progress::{GroupEventCounts, GroupProgress};
use crate::group_stability::{MemberView, Stability};
use crate::histograms::WorkerStats;
use crate::run_config::RunConfig;
use crate::verify::{HistoryRecord, VerifyReport};

/// How long the groups may take to join and settle before producers start.
/// Settling takes a few heartbeat intervals (a member gives partitions up
/// on one heartbeat, the next member takes them on its own).
pub const GROUP_STABLE_WAIT_MS_MAX: u64 = 30_000;
/// Members' session: the coordinator asks for a heartbeat every third of
/// it, so a shorter session settles a group sooner. Long enough that a
/// member starved of CPU by a saturated two-core machine is not fenced.
const GROUP_SESSION_TIMEOUT_MS: u32 = 10_000;
/// The "committing every second".
pub const AUTO_COMMIT_INTERVAL_MS: u64 = 1_000;
/// Bound on a group request (commit, leave): a coordinator that is gone at
/// the end costs at most this per member.
const GROUP_REQUEST_WAIT_MS_MAX: u64 = 10_000;
/// Bound on one member poll, so a member notices the end of the run soon.
const MEMBER_POLL_MS: u64 = 100;
/// Pause between readiness checks.
const STABLE_CHECK_MS: u64 = 50;
/// Bound on describing one group for its committed lag at the end.
const LAG_WAIT_MS_MAX: u64 = 5_000;

/// A group's committed position against the log end, after its members left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommittedLag {
    /// Sum over the topic's partitions of log end minus committed offset.
    pub lag_records: i64,
    /// Partitions with both a committed offset and a known log end.
    pub partitions_known: u32,
}

/// One group at the end of a run.
#[derive(Debug, Clone)]
pub struct GroupSummary {
    pub group_id: String,
    pub members: u32,
    /// Every record returned to the run, re-reads included.
    pub records_read: u64,
    /// Records at offsets the group had not read before.
    pub records_new: u64,
    pub events: GroupEventCounts,
    /// The first member that failed to commit or leave on close, and why.
    pub close_error: Option<String>,
    /// From `Admin::describe_group` once the members left, or why it could
    /// not be had; `None` before it was asked.
    pub committed_lag: Option<Result<CommittedLag, String>>,
    /// With `verify`: this group's reads checked against every ack.
    pub verify: Option<VerifyReport>,
}

impl GroupSummary {
    /// One line: id, members, reads, events, committed lag.
    pub fn render_line(&self, partitions: u32) -> String {
        let lag = match &self.committed_lag {
            Some(Ok(lag)) => format!(
                "committed lag {} records ({} of {partitions} partitions committed)",
                lag.lag_records, lag.partitions_known
            ),
            Some(Err(why)) => format!("committed lag unknown: {why}"),
            None => "committed lag not asked".to_string(),
        };
        let events = &self.events;
        let mut line = format!(
            "group {}: {} members · consumed {} records ({} new) · assigned {} revoked {} lost {} commit failures {} · {lag}",
            self.group_id,
            self.members,
            self.records_read,
            self.records_new,
            events.assigned,
            events.revoked,
            events.lost,
            events.commit_failures,
        );
        if let Some(error) = &self.close_error {
            line.push_str(&format!(" · close failed: {error}"));
        }
        line
    }
}

/// A group's summary and its verify history, before it is checked.
#[derive(Debug)]
pub struct FinishedGroup {
    pub summary: GroupSummary,
    pub consumed: Vec<HistoryRecord>,
}

/// Why a member stopped: its close result.
#[derive(Debug)]
struct MemberOutcome {
    close_error: Option<String>,
}

/// One group of the run and its members' tasks.
struct RunGroup {
    id: String,
    progress: Arc<Mutex<GroupProgress>>,
    views: Vec<Arc<Mutex<MemberView>>>,
    tasks: Vec<JoinHandle<anyhow::Result<MemberOutcome>>>,
    consumed: Option<History>,
}

/// Every group of the run.
pub(crate) struct GroupConsumers {
    config: Arc<RunConfig>,
    /// For describing a group that did not settle.
    cluster: Cluster,
    groups: Vec<RunGroup>,
    /// Set once every group is stable, just before producers start.
    measuring: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl GroupConsumers {
    /// Starts `consumers` members in each group; `stats` and `clusters`
    /// hold one entry per member, group by group (each member has
    /// connections of its own, as each assigned consumer does, so the two
    /// ways of consuming compare like for like). Members join in the
    /// background. `cluster` describes a group that does not settle.
    pub(crate) fn start(
        config: &Arc<RunConfig>,
        cluster: &Cluster,
        clusters: &[Cluster],
        stats: &[Arc<Mutex<WorkerStats>>],
        counters: &Arc<RideThroughCounters>,
    ) -> anyhow::Result<GroupConsumers> {
        let ids = config.group_ids();
        assert!(!ids.is_empty(), "groups need --consumer-group");
        assert_eq!(stats.len(), ids.len() * config.consumers as usize);
        assert_eq!(clusters.len(), stats.len());
        let mut member_clusters = clusters.iter();
        let measuring = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let mut groups = Vec::with_capacity(ids.len());
        let mut member_stats = stats.iter();
        for id in ids {
            let progress = Arc::new(Mutex::new(GroupProgress::new(config.partitions)));
            let consumed: Option<History> = config.verify.then(Default::default);
            let mut views = Vec::new();
            let mut tasks = Vec::new();
            for _ in 0..config.consumers {
                let view = Arc::new(Mutex::new(MemberView::default()));
                let member_cluster = member_clusters.next().expect("one per member").clone();
                let consumer = GroupConsumer::new(member_cluster, group_config(&id))
                    .with_context(|| format!("group {id}: configuring a member"))?;
                let member = GroupMember {
                    config: config.clone(),
                    consumer,
                    stats: member_stats.next().expect("one per member").clone(),
                    progress: progress.clone(),
                    view: view.clone(),
                    consumed: consumed.clone(),
                    measuring: measuring.clone(),
                    stop: stop.clone(),
                    counters: counters.clone(),
                };
                views.push(view);
                tasks.push(tokio::spawn(member.run()));
            }
            groups.push(RunGroup {
                id,
                progress,
                views,
                tasks,
                consumed,
            });
        }
        Ok(GroupConsumers {
            config: config.clone(),
            cluster: cluster.clone(),
            groups,
            measuring,
            stop,
        })
    }

    /// Waits until every group is stable, then lets members count what they
    /// read. Fails after `GROUP_STABLE_WAIT_MS_MAX`, naming each unsettled
    /// group and what it lacks, or as soon as a member fails. On failure
    /// the members are told to stop; the runtime's end cancels them.
    pub(crate) async fn wait_stable(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        let deadline = started + Duration::from_millis(GROUP_STABLE_WAIT_MS_MAX);
        loop {
            if let Err(error) = self.check_members_alive().await {
                self.stop.store(true, Ordering::Relaxed);
                return Err(error);
            }
            let unstable: Vec<String> = self
                .groups
                .iter()
                .filter_map(|group| {
                    let stability = self.stability(group);
                    (!stability.is_stable()).then(|| format!("{}: {stability}", group.id))
                })
                .collect();
            if unstable.is_empty() {
                self.measuring.store(true, Ordering::Release);
                crate::say_err!(
                    "consumer groups {} stable after {} ms",
                    self.config.group_ids().join(", "),
                    started.elapsed().as_millis()
                );
                return Ok(());
            }
            if Instant::now() >= deadline {
                // What the coordinator holds beside what the members see,
                // read before they stop: which side a stall is on.
                let mut described = Vec::new();
                for group in &self.groups {
                    if !self.stability(group).is_stable() {
                        described.push(self.describe_unsettled(group).await);
                    }
                }
                self.stop.store(true, Ordering::Relaxed);
                bail!(
                    "consumer groups not stable after {GROUP_STABLE_WAIT_MS_MAX} ms: {}\n{}",
                    unstable.join("; "),
                    described.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(STABLE_CHECK_MS)).await;
        }
    }

    /// One line per member as the members see themselves, then the
    /// coordinator's view of the group (bounded by `LAG_WAIT_MS_MAX`).
    async fn describe_unsettled(&self, group: &RunGroup) -> String {
        let mut lines = vec![format!("group {}, as its members see it:", group.id)];
        for (i, view) in group.views.iter().enumerate() {
            let view = view.lock().expect("view lock").clone();
            lines.push(format!(
                "  member {i}: joined {}, owns {:?}, positioned {}",
                view.joined, view.owned, view.positioned
            ));
        }
        let admin = Admin::from_cluster(self.cluster.clone());
        let wait = Duration::from_millis(LAG_WAIT_MS_MAX);
        match tokio::time::timeout(wait, admin.describe_group(&group.id)).await {
            Ok(Ok(description)) => {
                lines.push(format!(
                    "  coordinator: state {}, group epoch {}, target epoch {}",
                    description.state, description.group_epoch.0, description.target_epoch.0
                ));
                let topic = &self.config.topic;
                let partitions = |set: &BTreeSet<TopicPartition>| -> Vec<i32> {
                    set.iter()
                        .filter(|tp| &tp.topic == topic)
                        .map(|tp| tp.partition)
                        .collect()
                };
                for member in &description.members {
                    lines.push(format!(
                        "  {}: epoch {}, state {}, assigned {:?}, revoking {:?}, target {:?}",
                        member.member_id,
                        member.member_epoch.0,
                        member.state,
                        partitions(&member.assigned),
                        partitions(&member.pending_revocation),
                        partitions(&member.target)
                    ));
                }
            }
            Ok(Err(error)) => lines.push(format!("  coordinator: describe failed: {error}")),
            Err(_) => lines.push(format!(
                "  coordinator: no answer within {LAG_WAIT_MS_MAX} ms"
            )),
        }
        lines.join("\n")
    }

    fn stability(&self, group: &RunGroup) -> Stability {
        let views: Vec<MemberView> = group
            .views
            .iter()
            .map(|v| v.lock().expect("view lock").clone())
            .collect();
        Stability::of(self.config.partitions, &views)
    }

    /// A member that ended before the run did so on an error: return it.
    async fn check_members_alive(&mut self) -> anyhow::Result<()> {
        for group in &mut self.groups {
            if let Some(task) = group.tasks.iter_mut().find(|t| t.is_finished()) {
                let outcome = task.await.context("group member task")?;
                outcome.with_context(|| format!("group {}", group.id))?;
                bail!("a member of group {} stopped before the run", group.id);
            }
        }
        Ok(())
    }

    /// Whether every group has read as many new records as were acked.
    pub(crate) fn caught_up(&self, acked_messages: u64) -> bool {
        self.groups.iter().all(|group| {
            group
                .progress
                .lock()
                .expect("progress lock")
                .caught_up(acked_messages)
        })
    }

    /// Stops every member (each commits and leaves) and collects what each
    /// group read. A member's error fails the run, as an assigned
    /// consumer's does; a failed close is reported, not fatal.
    pub(crate) async fn finish(self) -> anyhow::Result<Vec<FinishedGroup>> {
        self.stop.store(true, Ordering::Relaxed);
        let mut finished = Vec::with_capacity(self.groups.len());
        for group in self.groups {
            let mut close_error = None;
            let members = group.tasks.len() as u32;
            for task in group.tasks {
                let outcome = task
                    .await
                    .context("group member task")?
                    .with_context(|| format!("group {}", group.id))?;
                close_error = close_error.or(outcome.close_error);
            }
            let progress = group.progress.lock().expect("progress lock").clone();
            let consumed = group.consumed.map_or_else(Vec::new, |history| {
                std::mem::take(&mut *history.lock().expect("history lock"))
            });
            finished.push(FinishedGroup {
                summary: GroupSummary {
                    group_id: group.id,
                    members,
                    records_read: progress.records_read(),
                    records_new: progress.records_new(),
                    events: progress.events,
                    close_error,
                    committed_lag: None,
                    verify: None,
                },
                consumed,
            });
        }
        Ok(finished)
    }
}

/// A member's settings: auto-commit every second, start at the log end,
/// fetch as the assigned consumers do.
fn group_config(group_id: &str) -> GroupConfig {
    GroupConfig {
        session_timeout_ms: GROUP_SESSION_TIMEOUT_MS,
        enable_auto_commit: true,
        auto_commit_interval_ms: AUTO_COMMIT_INTERVAL_MS,
        request_wait_ms_max: GROUP_REQUEST_WAIT_MS_MAX,
        consumer: ConsumerConfig {
            fetch_wait_ms_max: FETCH_WAIT_MS as u64,
            fetch_bytes_max: FETCH_BYTES_MAX as u32,
            partition_fetch_bytes_max: FETCH_PARTITION_BYTES_MAX as u32,
            offset_reset: OffsetReset::Latest,
            ..ConsumerConfig::default()
        },
        ..GroupConfig::new(group_id)
    }
}

/// Describes each finished group for its committed lag on `topic`: with
/// every member gone, what their last commits left unread.
pub(crate) async fn describe_committed_lags(
    cluster: &Cluster,
    topic: &str,
    groups: &mut [FinishedGroup],
) {
    let admin = Admin::from_cluster(cluster.clone());
    for group in groups {
        let summary = &mut group.summary;
        summary.committed_lag = Some(committed_lag(&admin, &summary.group_id, topic).await);
    }
}

/// The group's committed lag on `topic`, bounded by `LAG_WAIT_MS_MAX`.
async fn committed_lag(admin: &Admin, group_id: &str, topic: &str) -> Result<CommittedLag, String> {
    let wait = Duration::from_millis(LAG_WAIT_MS_MAX);
    let description = match tokio::time::timeout(wait, admin.describe_group(group_id)).await {
        Ok(Ok(description)) => description,
        Ok(Err(error)) => return Err(error.to_string()),
        Err(_) => return Err(format!("no answer within {LAG_WAIT_MS_MAX} ms")),
    };
    let mut lag = CommittedLag {
        lag_records: 0,
        partitions_known: 0,
    };
    for partition in description.partitions.iter().filter(|p| p.topic == topic) {
        if let Some(records) = partition.lag_records {
            lag.lag_records += records;
            lag.partitions_known += 1;
        }
    }
    Ok(lag)
}

/// One member: polls until the run ends, then closes.
struct GroupMember {
    config: Arc<RunConfig>,
    consumer: GroupConsumer,
    stats: Arc<Mutex<WorkerStats>>,
    progress: Arc<Mutex<GroupProgress>>,
    view: Arc<Mutex<MemberView>>,
    consumed: Option<History>,
    measuring: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    counters: Arc<RideThroughCounters>,
}

/// A member's state before the run: partitions moved to the log end, and
/// whether that position still needs committing.
#[derive(Default)]
struct Joining {
    at_end: BTreeSet<u32>,
    commit_pending: bool,
}

impl GroupMember {
    /// Polls at least every `MEMBER_POLL_MS` (heartbeats ride on polls).
    /// Before the run, positions what it owns at the log end; during it,
    /// accounts every record. A retriable failure is ridden through.
    async fn run(mut self) -> anyhow::Result<MemberOutcome> {
        self.consumer.subscribe(&[self.config.topic.clone()])?;
        let mut joining = Joining::default();
        while !self.stop.load(Ordering::Relaxed) {
            let polled = self
                .consumer
                .poll(Duration::from_millis(MEMBER_POLL_MS))
                .await;
            let events = self.consumer.take_events();
            if !events.is_empty() {
                self.progress
                    .lock()
                    .expect("progress lock")
                    .note_events(&events);
            }
            let records = match polled {
                Ok(records) => records,
                Err(error) if error.is_retriable() => {
                    self.counters.fetch_errors.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(RETRY_BACKOFF_MS)).await;
                    continue;
                }
                Err(error) => return Err(error).context("polling"),
            };
            // Read after the poll: producers start only after this is set,
            // so records polled while it was clear predate the run.
            if self.measuring.load(Ordering::Acquire) {
                self.take(&records)?;
            } else {
                self.join_step(&mut joining).await;
            }
        }
        let close_error = self.consumer.close().await.err().map(|e| e.to_string());
        Ok(MemberOutcome { close_error })
    }

    /// Before the run: moves newly owned partitions to the log end, commits
    /// there once all are moved, and reports the member's view. A failed
    /// seek or commit is tried again on the next turn.
    async fn join_step(&mut self, joining: &mut Joining) {
        let topic = self.config.topic.clone();
        let owned: Vec<u32> = self
            .consumer
            .assignment()
            .iter()
            .filter(|tp| tp.topic == topic)
            .filter_map(|tp| u32::try_from(tp.partition).ok())
            .filter(|p| *p < self.config.partitions)
            .collect();
        joining.at_end.retain(|p| owned.contains(p));
        for &partition in &owned {
            if joining.at_end.contains(&partition) {
                continue;
            }
            if self
                .consumer
                .seek(&topic, partition as i32, SeekTo::Latest)
                .await
                .is_ok()
            {
                joining.at_end.insert(partition);
                joining.commit_pending = true;
            }
        }
        let all_at_end = joining.at_end.len() == owned.len();
        if all_at_end && joining.commit_pending && self.consumer.commit().await.is_ok() {
            joining.commit_pending = false;
        }
        *self.view.lock().expect("view lock") = MemberView {
            joined: self.consumer.member_epoch().0 > 0,
            positioned: all_at_end && !joining.commit_pending,
            owned,
        };
    }

    /// Accounts one poll's records: stats, group progress, verify history.
    fn take(&self, records: &[ConsumerRecord]) -> anyhow::Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let now_us = wall_us();
        let mut history = Vec::new();
        {
            let mut stats = self.stats.lock().expect("stats lock");
            let mut progress = self.progress.lock().expect("progress lock");
            for record in records {
                let partition = u32::try_from(record.partition)
                    .ok()
                    .filter(|p| *p < self.config.partitions)
                    .with_context(|| {
                        format!(
                            "a record of partition {} of a topic with {}",
                            record.partition, self.config.partitions
                        )
                    })?;
                let value = record.value.as_deref().unwrap_or_default();
                let header = record_consumed(self.config.payload, &mut stats, value, now_us)?;
                progress.observe(partition, record.offset);
                if self.consumed.is_some() {
                    history.push(HistoryRecord::new(
                        partition,
                        record.offset as u64,
                        header.value_id,
                    ));
                }
            }
        }
        if let Some(consumed) = &self.consumed {
            consumed.lock().expect("history lock").extend(history);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The end-of-run line names the group, its members, its reads and
    // events, and its committed lag, or why the lag is unknown.
    #[test]
    fn renders_one_line_per_group() {
        let mut summary = GroupSummary {
            group_id: "lg-1".to_string(),
            members: 2,
            records_read: 1_005,
            records_new: 1_000,
            events: GroupEventCounts {
                assigned: 3,
                revoked: 1,
                lost: 0,
                commit_failures: 0,
            },
            close_error: None,
            committed_lag: Some(Ok(CommittedLag {
                lag_records: 0,
                partitions_known: 16,
            })),
            verify: None,
        };
        assert_eq!(
            summary.render_line(16),
            "group lg-1: 2 members · consumed 1005 records (1000 new) · assigned 3 revoked 1 lost 0 commit failures 0 · committed lag 0 records (16 of 16 partitions committed)"
        );
        summary.committed_lag = Some(Err("no answer within 5000 ms".to_string()));
        summary.close_error = Some("coordinator gone".to_string());
        let line = summary.render_line(16);
        assert!(line.ends_with(
            "committed lag unknown: no answer within 5000 ms · close failed: coordinator gone"
        ));
    }

    // Members commit every second and start at the log end.
    #[test]
    fn members_commit_every_second_from_the_end() {
        let config = group_config("lg");
        assert!(config.enable_auto_commit);
        assert_eq!(config.auto_commit_interval_ms, 1_000);
        assert_eq!(config.consumer.offset_reset, OffsetReset::Latest);
        assert!(config
            .validate(&client::ClientConfig {
                request_timeout_ms: crate::driver::REQUEST_TIMEOUT_MS,
                ..client::ClientConfig::default()
            })
            .is_ok());
    }
}
