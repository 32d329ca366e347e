//! `GroupConsumer`: a member of a consumer group (KIP-848). It subscribes
//! to topics; the group's coordinator decides which partitions it reads.
//! `Membership` (membership.rs) makes every membership decision; this file
//! is its driver: it sends heartbeats, starts partitions from their
//! committed offsets, commits and stops revoked ones, and fetches with a
//! `Consumer` of the partitions the member owns.
//!
//! One task owns everything. `poll` applies heartbeat answers, reconciles,
//! auto-commits and returns records. The heartbeat request itself runs as a
//! spawned task (one at a time) so a slow or moving coordinator never holds
//! up records, and `poll` wakes as soon as its answer arrives (a revocation
//! is acted on at once, not after the fetch wait). Nothing runs between
//! polls: as in Kafka, an application must poll at least once per session
//! timeout, or the coordinator removes the member and hands its partitions
//! to others (the member finds out, drops them as lost, and joins again).

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use protocol::{ApiKey, ErrorCode, MemberEpoch};
use tokio::task::JoinSet;

use crate::accumulator::TopicPartition;
use crate::cluster::Cluster;
use crate::config::{ClientConfig, GroupConfig};
use crate::consumer::{Consumer, SeekTo};
use crate::consumer_record::ConsumerRecord;
use crate::coordinator::{Coordinator, RetryPolicy};
use crate::error::{ClientError, Result};
use crate::group_types::{CommittedOffset, HeartbeatResponse, GROUP_PARTITIONS_MAX};
use crate::membership::{random_member_id, HeartbeatFailure, MemberSettings, Membership};
use crate::messages;

/// Bound on events held for `take_events`; past it the oldest are dropped.
pub const GROUP_EVENTS_MAX: usize = 1_024;
/// Bound on commits (`commit_async` and auto-commits) in flight.
pub const COMMITS_IN_FLIGHT_MAX: usize = 4;
/// Bound on the leave heartbeat of `close`.
const LEAVE_WAIT_MS_MAX: u64 = 5_000;

/// A change of the member's partitions, or a commit that failed where no
/// caller could hear it; see `GroupConsumer::take_events`.
#[derive(Clone, Debug)]
pub enum GroupEvent {
    /// Started: fetched from the committed offset, or from `offset_reset`
    /// without one.
    Assigned(Vec<TopicPartition>),
    /// Given up because the coordinator took them away; their positions
    /// were committed first when auto-commit or `commit_on_revoke` is on.
    Revoked(Vec<TopicPartition>),
    /// Dropped without a commit: the member was fenced or its session
    /// ended, and another member may own them already.
    Lost(Vec<TopicPartition>),
    /// An auto-commit, a `commit_async` or the commit before a revocation
    /// failed.
    CommitFailed(ClientError),
}

#[derive(Debug)]
struct CommitOutcome {
    offsets: BTreeMap<TopicPartition, i64>,
    result: Result<()>,
}

/// A member of a consumer group that reads what the coordinator assigns it.
#[derive(Debug)]
pub struct GroupConsumer {
    cluster: Cluster,
    config: GroupConfig,
    consumer: Consumer,
    coordinator: Coordinator,
    membership: Membership,
    /// At most one heartbeat in flight.
    heartbeat: JoinSet<Result<HeartbeatResponse>>,
    /// At most `COMMITS_IN_FLIGHT_MAX`.
    commits: JoinSet<CommitOutcome>,
    /// The offset last committed for each owned partition, so unchanged
    /// positions are not committed again.
    committed: BTreeMap<TopicPartition, i64>,
    events: VecDeque<GroupEvent>,
    next_auto_commit_at: Instant,
    /// Set after starting partitions failed (the coordinator or the
    /// metadata was not ready): when to try again.
    start_retry_at: Option<Instant>,
    /// Partitions being started: assigned to the consumer, not yet owned.
    /// Non-empty on entry only when a cancelled `poll` left them half done.
    starting: Vec<TopicPartition>,
}

impl GroupConsumer {
    pub async fn connect(
        bootstrap: &str,
        client_config: ClientConfig,
        config: GroupConfig,
    ) -> Result<GroupConsumer> {
        GroupConsumer::new(Cluster::connect(bootstrap, client_config).await?, config)
    }

    /// Validates `config`; joins the group on the first `poll` after
    /// `subscribe`. Members of one process that share `cluster` share its
    /// connections, and with them each other's fetch waits (`Consumer::new`):
    /// give each member a `Cluster` of its own.
    pub fn new(cluster: Cluster, config: GroupConfig) -> Result<GroupConsumer> {
        config.validate(cluster.config())?;
        let consumer = Consumer::new(cluster.clone(), config.consumer.clone())?;
        let policy = RetryPolicy {
            backoff_ms: config.retry_backoff_ms,
            backoff_ms_max: config.retry_backoff_ms_max,
            wait_ms_max: config.request_wait_ms_max,
        };
        let coordinator = Coordinator::new(cluster.clone(), &config.group_id, policy);
        let settings = MemberSettings {
            group_id: config.group_id.clone(),
            instance_id: config.instance_id.clone(),
            client_id: cluster.config().client_id.clone(),
            session_timeout_ms: config.session_timeout_ms,
            rebalance_timeout_ms: config.rebalance_timeout_ms,
            assignor: config.assignor.clone(),
            retry_backoff_ms: config.retry_backoff_ms,
            retry_backoff_ms_max: config.retry_backoff_ms_max,
        };
        let next_auto_commit_at =
            Instant::now() + Duration::from_millis(config.auto_commit_interval_ms);
        Ok(GroupConsumer {
            cluster,
            consumer,
            coordinator,
            membership: Membership::new(settings, random_member_id()),
            config,
            heartbeat: JoinSet::new(),
            commits: JoinSet::new(),
            committed: BTreeMap::new(),
            events: VecDeque::new(),
            next_auto_commit_at,
            start_retry_at: None,
            starting: Vec::new(),
        })
    }

    pub fn group_id(&self) -> &str {
        &self.config.group_id
    }

    pub fn member_id(&self) -> &str {
        self.membership.member_id()
    }

    /// The epoch the coordinator gave last; 0 while joining.
    pub fn member_epoch(&self) -> MemberEpoch {
        self.membership.member_epoch()
    }

    /// What a transactional producer needs to commit this member's
    /// offsets in its transaction (`Producer::send_offsets_to_transaction`).
    pub fn group_metadata(&self) -> crate::messages::ConsumerGroupMetadata {
        crate::messages::ConsumerGroupMetadata {
            group_id: self.group_id().to_owned(),
            member_id: self.member_id().to_owned(),
            member_epoch: self.member_epoch(),
        }
    }

    /// Sets the topics to read (replacing any earlier subscription). The
    /// member joins, or sends the change, on the next `poll`.
    pub fn subscribe(&mut self, topics: &[String]) -> Result<()> {
        self.membership.subscribe(topics, Instant::now())
    }

    /// The partitions the member owns now, in order.
    pub fn assignment(&self) -> Vec<TopicPartition> {
        self.membership.owned().iter().cloned().collect()
    }

    /// Takes the assignment changes and failed background commits since the
    /// last call, oldest first.
    pub fn take_events(&mut self) -> Vec<GroupEvent> {
        self.events.drain(..).collect()
    }

    /// Offset of the next record `poll` returns for an owned partition.
    pub fn position(&self, topic: &str, partition: i32) -> Option<i64> {
        self.consumer.position(topic, partition)
    }

    /// Moves an owned partition (see `Consumer::seek`); the next commit
    /// commits the new position.
    pub async fn seek(&mut self, topic: &str, partition: i32, to: SeekTo) -> Result<i64> {
        self.owned(topic, partition)?;
        self.consumer.seek(topic, partition, to).await
    }

    /// Stops returning records of an owned partition until `resume`; the
    /// member keeps it and keeps heartbeating.
    pub fn pause(&mut self, topic: &str, partition: i32) -> Result<()> {
        self.owned(topic, partition)?;
        self.consumer.pause(topic, partition)
    }

    pub fn resume(&mut self, topic: &str, partition: i32) -> Result<()> {
        self.owned(topic, partition)?;
        self.consumer.resume(topic, partition)
    }

    pub fn paused(&self) -> Vec<TopicPartition> {
        self.consumer.paused()
    }

    fn owned(&self, topic: &str, partition: i32) -> Result<()> {
        if self.membership.owns(&TopicPartition::new(topic, partition)) {
            Ok(())
        } else {
            Err(ClientError::UnknownPartition {
                topic: topic.to_owned(),
                partition,
            })
        }
    }

    /// Returns records of owned partitions, or waits up to `timeout` for
    /// some. Also sends heartbeats, acts on their answers (starting and
    /// revoking partitions) and auto-commits. Errors: a failed fetch (as
    /// `Consumer::poll`), a heartbeat error that retrying cannot fix (the
    /// member keeps trying on later polls), or failing to read committed
    /// offsets for a reason other than a moving coordinator.
    ///
    /// Cancel safe: a cancelled `poll` loses no record and leaves every
    /// step (a revocation, a start) to be done again by the next one.
    pub async fn poll(&mut self, timeout: Duration) -> Result<Vec<ConsumerRecord>> {
        let deadline = Instant::now() + timeout;
        loop {
            self.step().await?;
            let now = Instant::now();
            let slice = self.wake_at(deadline).saturating_duration_since(now);
            tokio::select! {
                biased;
                Some(joined) = self.heartbeat.join_next(), if !self.heartbeat.is_empty() => {
                    let answer = joined.expect("heartbeat tasks are aborted only by close");
                    self.on_heartbeat(answer)?;
                }
                Some(joined) = self.commits.join_next(), if !self.commits.is_empty() => {
                    self.on_commit(joined.expect("commit tasks are never aborted"));
                }
                records = self.consumer.poll(slice) => {
                    let records = records?;
                    if !records.is_empty() {
                        return Ok(records);
                    }
                }
            }
            if Instant::now() >= deadline {
                return Ok(Vec::new());
            }
        }
    }

    /// Everything due before records: session check, reconciliation,
    /// auto-commit, the next heartbeat.
    async fn step(&mut self) -> Result<()> {
        let lost = self.membership.check_session(Instant::now());
        if !lost.is_empty() {
            self.lose(lost);
        }
        self.reconcile().await?;
        self.auto_commit(Instant::now());
        self.send_heartbeat(Instant::now());
        if cfg!(debug_assertions) {
            self.check_invariants();
        }
        Ok(())
    }

    /// The earliest of `deadline` and every timer that has work to do.
    fn wake_at(&self, deadline: Instant) -> Instant {
        let timers = [
            self.membership.next_heartbeat_at(),
            self.config
                .enable_auto_commit
                .then_some(self.next_auto_commit_at),
            self.start_retry_at,
        ];
        timers.into_iter().flatten().fold(deadline, Instant::min)
    }

    fn send_heartbeat(&mut self, now: Instant) {
        let Some(request) = self.membership.heartbeat(now) else {
            return;
        };
        assert!(self.heartbeat.is_empty(), "one heartbeat at a time");
        let body = messages::group_heartbeat_request(&request);
        let coordinator = self.coordinator.clone();
        // An answer later than the session is worthless: the coordinator has
        // removed the member by then.
        let wait = Duration::from_millis(
            self.config
                .request_wait_ms_max
                .min(u64::from(self.config.session_timeout_ms)),
        );
        self.heartbeat.spawn(async move {
            coordinator
                .call_within(
                    ApiKey::GroupHeartbeat,
                    &body,
                    messages::group_heartbeat_response,
                    wait,
                )
                .await
        });
    }

    fn on_heartbeat(&mut self, answer: Result<HeartbeatResponse>) -> Result<()> {
        let now = Instant::now();
        match answer {
            Ok(response) => {
                self.membership.on_heartbeat_response(response, now);
                Ok(())
            }
            Err(error) => match self.membership.on_heartbeat_error(&error, now) {
                HeartbeatFailure::Fenced { lost } => {
                    self.lose(lost);
                    Ok(())
                }
                HeartbeatFailure::Retry => Ok(()),
                HeartbeatFailure::Fatal => Err(error),
            },
        }
    }

    /// Revokes what the coordinator took away, then starts what it gave.
    async fn reconcile(&mut self) -> Result<()> {
        if !self.starting.is_empty() {
            // A cancelled start: forget it; `to_start` still lists what is
            // still assigned.
            let half_done = std::mem::take(&mut self.starting);
            self.consumer.unassign(&half_done);
        }
        let revoke = self.membership.to_revoke();
        if !revoke.is_empty() {
            self.revoke(revoke).await;
        }
        let start = self.membership.to_start();
        let now = Instant::now();
        if start.is_empty() {
            self.start_retry_at = None;
        } else if self.start_retry_at.is_none_or(|at| at <= now) {
            self.start_retry_at = None;
            self.start(start).await?;
        }
        Ok(())
    }

    /// Commits (when configured to), stops and gives up `partitions`; the
    /// membership then heartbeats at once so they can move on. A failed
    /// commit does not hold the revocation up: the coordinator would fence
    /// a member that keeps partitions past the rebalance timeout.
    async fn revoke(&mut self, partitions: Vec<TopicPartition>) {
        if self.config.enable_auto_commit || self.config.commit_on_revoke {
            let offsets = self.uncommitted(&partitions);
            if !offsets.is_empty() {
                if let Err(error) = self.commit_now(offsets).await {
                    self.push_event(GroupEvent::CommitFailed(error));
                }
            }
        }
        self.consumer.unassign(&partitions);
        for tp in &partitions {
            self.committed.remove(tp);
        }
        self.membership.revoked(&partitions, Instant::now());
        self.push_event(GroupEvent::Revoked(partitions));
    }

    /// Positions newly assigned partitions at their committed offsets (the
    /// consumer's `offset_reset` applies to those without one) and hands them
    /// to the consumer. A coordinator or metadata that is not ready yet
    /// leaves them for a later `poll`.
    async fn start(&mut self, partitions: Vec<TopicPartition>) -> Result<()> {
        let body = messages::offset_fetch_request(&self.config.group_id, Some(&partitions));
        let committed = match self
            .coordinator
            .call(ApiKey::OffsetFetch, &body, messages::offset_fetch_response)
            .await
        {
            Ok(committed) => committed,
            Err(error) if error.is_retriable() => {
                self.retry_start_later();
                return Ok(());
            }
            Err(error) => return Err(error),
        };
        let mut by_topic: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        for tp in &partitions {
            by_topic
                .entry(tp.topic.clone())
                .or_default()
                .push(tp.partition);
        }
        let mut started = Vec::new();
        for (topic, indexes) in by_topic {
            self.starting
                .extend(indexes.iter().map(|&p| TopicPartition::new(&topic, p)));
            match self.consumer.assign(&topic, Some(&indexes)).await {
                Ok(_) => {}
                Err(error) if metadata_behind(&error) => {
                    // The coordinator knows a topic or partition our metadata
                    // does not show yet; a failed refresh is retried later.
                    let _ = self.cluster.refresh_metadata().await;
                    self.retry_start_later();
                    continue;
                }
                Err(error) => return Err(error),
            }
            for p in indexes {
                let tp = TopicPartition::new(&topic, p);
                if let Some(CommittedOffset { offset, .. }) = committed.get(&tp) {
                    self.consumer
                        .seek(&topic, p, SeekTo::Offset(*offset))
                        .await?;
                }
                started.push(tp);
            }
        }
        // Not started (metadata behind): back out of the consumer.
        let not_started: Vec<TopicPartition> = self
            .starting
            .drain(..)
            .filter(|tp| !started.contains(tp))
            .collect();
        self.consumer.unassign(&not_started);
        let stale = self.membership.started(&started, Instant::now());
        // Nothing applied a heartbeat answer since `to_start`: one task.
        assert!(stale.is_empty(), "partitions taken away while starting");
        for tp in &started {
            if let Some(CommittedOffset { offset, .. }) = committed.get(tp) {
                self.committed.insert(tp.clone(), *offset);
            }
        }
        if !started.is_empty() {
            self.push_event(GroupEvent::Assigned(started));
        }
        Ok(())
    }

    fn retry_start_later(&mut self) {
        self.start_retry_at =
            Some(Instant::now() + Duration::from_millis(self.config.retry_backoff_ms_max));
    }

    /// Drops partitions without committing them.
    fn lose(&mut self, lost: Vec<TopicPartition>) {
        self.consumer.unassign(&lost);
        for tp in &lost {
            self.committed.remove(tp);
        }
        if !lost.is_empty() {
            self.push_event(GroupEvent::Lost(lost));
        }
    }

    fn push_event(&mut self, event: GroupEvent) {
        if self.events.len() >= GROUP_EVENTS_MAX {
            self.events.pop_front();
        }
        self.events.push_back(event);
    }

    /// Positions of `partitions` that differ from what was last committed.
    fn uncommitted(&self, partitions: &[TopicPartition]) -> BTreeMap<TopicPartition, i64> {
        partitions
            .iter()
            .filter_map(|tp| {
                let position = self.consumer.position(&tp.topic, tp.partition)?;
                (self.committed.get(tp) != Some(&position)).then(|| (tp.clone(), position))
            })
            .collect()
    }

    fn owned_positions(&self) -> BTreeMap<TopicPartition, i64> {
        let owned: Vec<TopicPartition> = self.assignment();
        self.uncommitted(&owned)
    }

    fn auto_commit(&mut self, now: Instant) {
        if !self.config.enable_auto_commit || now < self.next_auto_commit_at {
            return;
        }
        self.next_auto_commit_at = now + Duration::from_millis(self.config.auto_commit_interval_ms);
        if !self.commits.is_empty() || !self.membership.is_member() {
            return; // One background commit at a time is enough to keep up.
        }
        let offsets = self.owned_positions();
        if !offsets.is_empty() {
            self.spawn_commit(offsets);
        }
    }

    fn commit_body(&self, offsets: &BTreeMap<TopicPartition, i64>) -> Vec<u8> {
        messages::offset_commit_request(
            &self.config.group_id,
            self.membership.member_id(),
            self.membership.member_epoch(),
            offsets,
        )
    }

    fn spawn_commit(&mut self, offsets: BTreeMap<TopicPartition, i64>) {
        assert!(self.commits.len() < COMMITS_IN_FLIGHT_MAX);
        let body = self.commit_body(&offsets);
        let coordinator = self.coordinator.clone();
        self.commits.spawn(async move {
            let result = coordinator
                .call(
                    ApiKey::OffsetCommit,
                    &body,
                    messages::offset_commit_response,
                )
                .await;
            CommitOutcome { offsets, result }
        });
    }

    fn on_commit(&mut self, outcome: CommitOutcome) {
        match outcome.result {
            Ok(()) => self.note_committed(outcome.offsets),
            Err(error) => self.push_event(GroupEvent::CommitFailed(error)),
        }
    }

    fn note_committed(&mut self, offsets: BTreeMap<TopicPartition, i64>) {
        for (tp, offset) in offsets {
            if self.membership.owns(&tp) {
                self.committed.insert(tp, offset);
            }
        }
    }

    async fn commit_now(&mut self, offsets: BTreeMap<TopicPartition, i64>) -> Result<()> {
        let body = self.commit_body(&offsets);
        self.coordinator
            .call(
                ApiKey::OffsetCommit,
                &body,
                messages::offset_commit_response,
            )
            .await?;
        self.note_committed(offsets);
        Ok(())
    }

    /// Commits the positions of every owned partition (what `poll` has
    /// returned so far, or where `seek` moved it) and waits for the answer,
    /// which comes once the commit is replicated. STALE_MEMBER_EPOCH,
    /// FENCED_MEMBER_EPOCH and UNKNOWN_MEMBER_ID come back as errors: the
    /// member lost partitions, and the next `poll` finds out which.
    pub async fn commit(&mut self) -> Result<()> {
        let offsets = self.owned_positions();
        if offsets.is_empty() {
            return Ok(());
        }
        self.commit_now(offsets).await
    }

    /// As `commit`, without waiting for the answer; a failure shows up as
    /// `GroupEvent::CommitFailed`. Waits only while `COMMITS_IN_FLIGHT_MAX`
    /// commits are in flight.
    pub async fn commit_async(&mut self) {
        let offsets = self.owned_positions();
        if offsets.is_empty() {
            return;
        }
        while self.commits.len() >= COMMITS_IN_FLIGHT_MAX {
            let joined = self.commits.join_next().await.expect("commits in flight");
            self.on_commit(joined.expect("commit tasks are never aborted"));
        }
        self.spawn_commit(offsets);
    }

    /// Commits exactly `offsets` (the offset of the next record to read for
    /// each partition) and waits for the answer.
    pub async fn commit_offsets(&mut self, offsets: &BTreeMap<TopicPartition, i64>) -> Result<()> {
        if offsets.len() > GROUP_PARTITIONS_MAX {
            return Err(ClientError::InvalidConfig {
                field: "offsets",
                reason: format!("more than {GROUP_PARTITIONS_MAX} partitions"),
            });
        }
        if let Some((tp, offset)) = offsets.iter().find(|(_, o)| **o < 0) {
            return Err(ClientError::InvalidConfig {
                field: "offsets",
                reason: format!(
                    "offset {offset} of {}/{} is negative",
                    tp.topic, tp.partition
                ),
            });
        }
        self.commit_now(offsets.clone()).await
    }

    /// The group's committed offsets of `partitions`; partitions without
    /// one are absent.
    pub async fn committed(
        &self,
        partitions: &[TopicPartition],
    ) -> Result<BTreeMap<TopicPartition, CommittedOffset>> {
        let body = messages::offset_fetch_request(&self.config.group_id, Some(partitions));
        self.coordinator
            .call(ApiKey::OffsetFetch, &body, messages::offset_fetch_response)
            .await
    }

    /// Waits for commits in flight, commits every owned position when
    /// auto-commit is on, and leaves the group (epoch -1; -2 for a static
    /// member). Every step is bounded; the first failure is returned after
    /// the member has left.
    pub async fn close(mut self) -> Result<()> {
        // The answer to a heartbeat in flight no longer matters.
        self.heartbeat.abort_all();
        let mut first_error = None;
        while let Some(joined) = self.commits.join_next().await {
            let outcome = joined.expect("commit tasks are never aborted");
            match outcome.result {
                Ok(()) => self.note_committed(outcome.offsets),
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        if self.config.enable_auto_commit {
            if let Err(error) = self.commit().await {
                first_error.get_or_insert(error);
            }
        }
        let owned = self.assignment();
        self.consumer.unassign(&owned);
        if let Some(leave) = self.membership.leave() {
            let body = messages::group_heartbeat_request(&leave);
            let wait =
                Duration::from_millis(LEAVE_WAIT_MS_MAX.min(self.config.request_wait_ms_max));
            let answer = self
                .coordinator
                .call_within(
                    ApiKey::GroupHeartbeat,
                    &body,
                    messages::group_heartbeat_response,
                    wait,
                )
                .await;
            match answer {
                Ok(_) => {}
                // Already gone: what leaving wanted.
                Err(ClientError::Broker {
                    code: ErrorCode::UnknownMemberId,
                    ..
                }) => {}
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The consumer reads exactly what the member owns, plus what it is
    /// starting. O(partitions): run in debug builds only.
    fn check_invariants(&self) {
        self.membership.check_invariants();
        let assigned = self.consumer.assignment();
        for tp in self.membership.owned() {
            assert!(
                assigned.binary_search(tp).is_ok(),
                "owned {tp:?} not fetched"
            );
        }
        for tp in &assigned {
            assert!(
                self.membership.owns(tp) || self.starting.contains(tp),
                "fetching {tp:?}, which is not owned"
            );
        }
        for tp in self.committed.keys() {
            assert!(self.membership.owns(tp), "commit bookkeeping of {tp:?}");
        }
    }
}

/// Whether assigning failed because the local metadata lags the
/// coordinator's (a new topic or partition), which a refresh fixes.
fn metadata_behind(error: &ClientError) -> bool {
    matches!(
        error,
        ClientError::UnknownTopic(_) | ClientError::UnknownPartition { .. }
    ) || error.is_retriable()
}
