//! The coordinator of the groups that live in one `__consumer_offsets`
//! partition, as a state machine: requests, ticks and topic changes in;
//! records to write and answers out. It changes its state only by replaying
//! the records it emits (`replay`), the same function that loads a
//! partition, so a coordinator that took over from the log is the one that
//! wrote it (timers aside: every session restarts at load).
//!
//! Membership follows KIP-848: members heartbeat with their subscription and
//! what they own; the group epoch moves whenever members or subscriptions
//! change and a new target assignment is computed at it; each member is led
//! to its target incrementally: partitions it must give up are revoked first,
//! and a partition goes to its new owner only once no other member holds it.

use std::collections::{BTreeMap, BTreeSet};

use thiserror::Error;

use super::assignor;
use super::records::{
    AssignorKind, CurrentValue, GroupRecord, GroupValue, MemberState, MemberValue, OffsetValue,
    TargetValue,
};
use super::*;

/// The coordinator's clocks: monotonic for sessions and deadlines, wall for
/// commit times and offset expiry.
#[derive(Clone, Copy, Debug)]
pub struct Now {
    pub monotonic_ms: u64,
    pub wall_ms: i64,
}

#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    /// Offsets of a group without members are deleted this long after its
    /// last commit (Kafka's `offsets.retention.minutes`).
    pub offsets_retention_ms: i64,
}

impl Default for CoordinatorConfig {
    fn default() -> CoordinatorConfig {
        CoordinatorConfig {
            offsets_retention_ms: 7 * 24 * 3600 * 1000,
        }
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum GroupError {
    #[error("{0} has offsets committed in a transaction still open; retry")]
    UnstableOffsetCommit(TopicPartition),
    #[error("invalid group id: {0}")]
    InvalidGroupId(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("unknown member {0}")]
    UnknownMemberId(String),
    #[error("member epoch {sent} is fenced (the coordinator has {current})")]
    FencedMemberEpoch {
        sent: MemberEpoch,
        current: MemberEpoch,
    },
    #[error("member epoch {sent} is stale and the member no longer owns {partition}")]
    StaleMemberEpoch {
        sent: MemberEpoch,
        partition: TopicPartition,
    },
    #[error("group {0} does not exist")]
    GroupIdNotFound(String),
    #[error("group {0} has members")]
    NonEmptyGroup(String),
    #[error("group {0} already has {MEMBERS_PER_GROUP_MAX} members")]
    GroupMaxSizeReached(String),
    #[error("instance id {0:?} is held by a live member; it is released when that member leaves with epoch -2 or its session ends")]
    UnreleasedInstanceId(String),
    #[error("this coordinator already holds {0} groups")]
    CoordinatorFull(usize),
    #[error("unknown assignor {0:?} (sticky or range)")]
    UnsupportedAssignor(String),
    #[error("unknown topic or partition {0}")]
    UnknownTopicOrPartition(TopicPartition),
    #[error("a member of group {group} subscribes to {topic}")]
    GroupSubscribedToTopic { group: String, topic: String },
}

impl GroupError {
    pub fn code(&self) -> protocol::ErrorCode {
        use protocol::ErrorCode as C;
        match self {
            GroupError::InvalidGroupId(_) => C::InvalidGroupId,
            GroupError::InvalidRequest(_) => C::InvalidRequest,
            GroupError::UnknownMemberId(_) => C::UnknownMemberId,
            GroupError::FencedMemberEpoch { .. } => C::FencedMemberEpoch,
            GroupError::StaleMemberEpoch { .. } => C::StaleMemberEpoch,
            GroupError::GroupIdNotFound(_) => C::GroupIdNotFound,
            GroupError::NonEmptyGroup(_) => C::NonEmptyGroup,
            GroupError::GroupMaxSizeReached(_) => C::GroupMaxSizeReached,
            GroupError::UnsupportedAssignor(_) => C::UnsupportedAssignor,
            GroupError::UnreleasedInstanceId(_) => C::UnreleasedInstanceId,
            GroupError::CoordinatorFull(_) => C::GroupMaxSizeReached,
            GroupError::UnknownTopicOrPartition(_) => C::UnknownTopicOrPartition,
            GroupError::UnstableOffsetCommit(_) => C::UnstableOffsetCommit,
            GroupError::GroupSubscribedToTopic { .. } => C::GroupSubscribedToTopic,
        }
    }
}

/// What an event produced: records to write (in order) and the answer, to be
/// sent only once those records (and everything written before) are
/// committed.
#[derive(Debug)]
pub struct Written<T> {
    pub records: Vec<GroupRecord>,
    pub response: Result<T, GroupError>,
}

#[derive(Clone, Debug)]
pub struct HeartbeatRequest {
    pub group_id: String,
    /// Chosen by the client (a random id) when it first joins.
    pub member_id: String,
    pub member_epoch: MemberEpoch,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: u32,
    pub rebalance_timeout_ms: u32,
    /// `None`: unchanged since the last heartbeat.
    pub subscribed_topics: Option<Vec<String>>,
    pub assignor: Option<String>,
    /// What the member owns now; `None`: unchanged.
    pub owned: Option<Vec<TopicPartition>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeartbeatResponse {
    pub member_id: String,
    pub member_epoch: MemberEpoch,
    pub heartbeat_interval_ms: u32,
    /// Everything the member may own now (its full assignment).
    pub assignment: BTreeSet<TopicPartition>,
}

#[derive(Clone, Debug)]
pub struct CommitRequest {
    pub group_id: String,
    /// Empty with epoch -1 for a commit outside membership (tools, resets),
    /// accepted only while the group has no members.
    pub member_id: String,
    pub member_epoch: MemberEpoch,
    pub offsets: Vec<(TopicPartition, i64, String)>,
}

/// A group's state as `ringlog group list` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupState {
    Empty,
    Reconciling,
    Stable,
}

impl GroupState {
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "empty",
            GroupState::Reconciling => "reconciling",
            GroupState::Stable => "stable",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupSummary {
    pub group_id: String,
    pub state: GroupState,
    pub members: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberDescription {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub member_epoch: MemberEpoch,
    pub state: MemberState,
    pub subscribed: BTreeSet<String>,
    pub assigned: BTreeSet<TopicPartition>,
    pub pending_revocation: BTreeSet<TopicPartition>,
    pub target: BTreeSet<TopicPartition>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupDescription {
    pub group_id: String,
    pub state: GroupState,
    pub group_epoch: GroupEpoch,
    pub target_epoch: GroupEpoch,
    pub assignor: AssignorKind,
    pub members: Vec<MemberDescription>,
    pub offsets: BTreeMap<TopicPartition, OffsetValue>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Member {
    meta: Option<MemberValue>,
    current: Option<CurrentValue>,
}

/// Timers are not part of the replicated state.
#[derive(Clone, Copy, Debug, Default)]
struct MemberTimers {
    session_deadline_ms: u64,
    revocation_deadline_ms: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Group {
    meta: Option<GroupValue>,
    members: BTreeMap<String, Member>,
    target: Option<TargetValue>,
    offsets: BTreeMap<TopicPartition, OffsetValue>,
}

impl Group {
    fn is_gone(&self) -> bool {
        self.meta.is_none()
            && self.members.is_empty()
            && self.target.is_none()
            && self.offsets.is_empty()
    }

    fn live_members(&self) -> impl Iterator<Item = (&String, &MemberValue, &CurrentValue)> {
        self.members
            .iter()
            .filter_map(|(id, m)| Some((id, m.meta.as_ref()?, m.current.as_ref()?)))
    }

    fn state(&self) -> GroupState {
        let target_epoch = self.target.as_ref().map_or(GroupEpoch(0), |t| t.epoch);
        if self.members.is_empty() {
            GroupState::Empty
        } else if self.members.values().all(|m| {
            m.current.as_ref().is_some_and(|c| {
                c.state == MemberState::Stable
                    && (c.member_epoch.0 == target_epoch.0
                        || c.member_epoch == MemberEpoch::LEAVE_STATIC)
            })
        }) {
            GroupState::Stable
        } else {
            GroupState::Reconciling
        }
    }

    fn owner_of(&self, tp: &TopicPartition, except: &str) -> Option<&str> {
        self.members.iter().find_map(|(id, m)| {
            let c = m.current.as_ref()?;
            (id != except && (c.assigned.contains(tp) || c.pending_revocation.contains(tp)))
                .then_some(id.as_str())
        })
    }
}

/// The groups of one `__consumer_offsets` partition.
#[derive(Debug, Default)]
pub struct GroupCoordinator {
    config: CoordinatorConfig,
    groups: BTreeMap<String, Group>,
    timers: BTreeMap<(String, String), MemberTimers>,
    /// Partition counts of the cluster's topics, from the metadata.
    topics: BTreeMap<String, u32>,
    /// Offsets committed inside a transaction, by producer id: they take
    /// effect when the transaction's commit marker reaches this partition
    /// and vanish at its abort marker.
    pending_txn: BTreeMap<i64, Vec<(String, TopicPartition, OffsetValue)>>,
}

impl GroupCoordinator {
    pub fn new(config: CoordinatorConfig, topics: BTreeMap<String, u32>) -> GroupCoordinator {
        GroupCoordinator {
            config,
            groups: BTreeMap::new(),
            timers: BTreeMap::new(),
            topics,
            pending_txn: BTreeMap::new(),
        }
    }

    /// Applies an offset record of a transaction (a transactional batch of
    /// `producer_id`): held until the transaction's marker.
    pub fn replay_txn(&mut self, producer_id: i64, record: &GroupRecord) {
        if let GroupRecord::Offset {
            group,
            partition,
            value: Some(value),
        } = record
        {
            let pending = self.pending_txn.entry(producer_id).or_default();
            if pending.len() < PENDING_TXN_OFFSETS_MAX {
                pending.push((group.clone(), partition.clone(), value.clone()));
            }
        }
    }

    /// A transaction marker of `producer_id` reached this partition: its
    /// offsets take effect (commit) or are dropped (abort). A repeated
    /// marker changes nothing.
    pub fn complete_txn(&mut self, producer_id: i64, commit: bool, now: Now) {
        let Some(pending) = self.pending_txn.remove(&producer_id) else {
            return;
        };
        if !commit {
            return;
        }
        for (group, partition, value) in pending {
            self.replay(
                &GroupRecord::Offset {
                    group,
                    partition,
                    value: Some(value),
                },
                now,
            );
        }
    }

    /// Offsets waiting for their transaction's marker, over all producers.
    pub fn pending_txn_offsets(&self) -> usize {
        self.pending_txn.values().map(Vec::len).sum()
    }

    /// Applies one stored record: the only way the groups change.
    pub fn replay(&mut self, record: &GroupRecord, now: Now) {
        let name = record.group().to_string();
        let group = self.groups.entry(name.clone()).or_default();
        match record {
            GroupRecord::Offset {
                partition, value, ..
            } => match value {
                Some(v) => {
                    group.offsets.insert(partition.clone(), v.clone());
                }
                None => {
                    group.offsets.remove(partition);
                }
            },
            GroupRecord::Group { value, .. } => group.meta = value.clone(),
            GroupRecord::Target { value, .. } => group.target = value.clone(),
            GroupRecord::Member {
                member_id, value, ..
            } => {
                let member = group.members.entry(member_id.clone()).or_default();
                member.meta = value.clone();
                let key = (name.clone(), member_id.clone());
                if value.is_some() {
                    let session = value
                        .as_ref()
                        .map_or(0, |v| u64::from(v.session_timeout_ms));
                    let timers = self.timers.entry(key).or_default();
                    timers.session_deadline_ms = now.monotonic_ms + session;
                }
                if member.meta.is_none() && member.current.is_none() {
                    group.members.remove(member_id);
                    self.timers.remove(&(name.clone(), member_id.clone()));
                }
            }
            GroupRecord::Current {
                member_id, value, ..
            } => {
                let member = group.members.entry(member_id.clone()).or_default();
                member.current = value.clone();
                if member.meta.is_none() && member.current.is_none() {
                    group.members.remove(member_id);
                    self.timers.remove(&(name.clone(), member_id.clone()));
                }
            }
        }
        if group.is_gone() {
            self.groups.remove(&name);
        }
    }

    fn emit(&mut self, out: &mut Vec<GroupRecord>, record: GroupRecord, now: Now) {
        self.replay(&record, now);
        out.push(record);
    }

    /// Restarts every member's session (and a revoking member's revocation
    /// deadline) at `now`: called once a partition is loaded, since timers are
    /// not in the log.
    pub fn restart_timers(&mut self, now: Now) {
        for ((group, member), timers) in &mut self.timers {
            let session = self
                .groups
                .get(group)
                .and_then(|g| g.members.get(member))
                .and_then(|m| m.meta.as_ref())
                .map_or(0, |m| u64::from(m.session_timeout_ms));
            timers.session_deadline_ms = now.monotonic_ms + session;
            let member = self.groups.get(group).and_then(|g| g.members.get(member));
            let revoking = member
                .and_then(|m| m.current.as_ref())
                .is_some_and(|c| c.state == MemberState::UnrevokedPartitions);
            let rebalance = member
                .and_then(|m| m.meta.as_ref())
                .map_or(0, |m| u64::from(m.rebalance_timeout_ms));
            timers.revocation_deadline_ms = revoking.then(|| now.monotonic_ms + rebalance);
        }
    }

    pub fn heartbeat(&mut self, req: &HeartbeatRequest, now: Now) -> Written<HeartbeatResponse> {
        let mut records = Vec::new();
        let response = self.heartbeat_inner(req, now, &mut records);
        Written { records, response }
    }

    fn heartbeat_inner(
        &mut self,
        req: &HeartbeatRequest,
        now: Now,
        out: &mut Vec<GroupRecord>,
    ) -> Result<HeartbeatResponse, GroupError> {
        check_group_id(&req.group_id)?;
        check_name("member id", &req.member_id, MEMBER_ID_BYTES_MAX)?;
        check_name("client id", &req.client_id, CLIENT_ID_BYTES_MAX)?;
        check_name("client host", &req.client_host, CLIENT_ID_BYTES_MAX)?;
        if req.member_id.is_empty() {
            return Err(GroupError::InvalidRequest("member id is empty".into()));
        }
        if let Some(id) = &req.instance_id {
            check_name("instance id", id, GROUP_ID_BYTES_MAX)?;
            if id.is_empty() {
                return Err(GroupError::InvalidRequest("instance id is empty".into()));
            }
        }
        if !(SESSION_TIMEOUT_MS_MIN..=SESSION_TIMEOUT_MS_MAX).contains(&req.session_timeout_ms) {
            return Err(GroupError::InvalidRequest(format!(
                "session timeout {} ms outside {SESSION_TIMEOUT_MS_MIN}..={SESSION_TIMEOUT_MS_MAX}",
                req.session_timeout_ms
            )));
        }
        if !(REBALANCE_TIMEOUT_MS_MIN..=REBALANCE_TIMEOUT_MS_MAX)
            .contains(&req.rebalance_timeout_ms)
        {
            return Err(GroupError::InvalidRequest(format!(
                "rebalance timeout {} ms outside {REBALANCE_TIMEOUT_MS_MIN}..={REBALANCE_TIMEOUT_MS_MAX}",
                req.rebalance_timeout_ms
            )));
        }
        if let Some(topics) = &req.subscribed_topics {
            if topics.len() > SUBSCRIBED_TOPICS_MAX {
                return Err(GroupError::InvalidRequest(format!(
                    "more than {SUBSCRIBED_TOPICS_MAX} topics"
                )));
            }
            for t in topics {
                check_name("topic", t, GROUP_ID_BYTES_MAX)?;
            }
        }
        if req
            .owned
            .as_ref()
            .is_some_and(|o| o.len() > PARTITIONS_PER_REQUEST_MAX)
        {
            return Err(GroupError::InvalidRequest(format!(
                "more than {PARTITIONS_PER_REQUEST_MAX} partitions"
            )));
        }
        let assignor = match &req.assignor {
            Some(name) => Some(
                AssignorKind::from_name(name)
                    .ok_or_else(|| GroupError::UnsupportedAssignor(name.clone()))?,
            ),
            None => None,
        };
        let owned: Option<BTreeSet<TopicPartition>> =
            req.owned.as_ref().map(|o| o.iter().cloned().collect());
        let group_id = req.group_id.as_str();
        let member_id = req.member_id.as_str();

        match req.member_epoch {
            MemberEpoch::LEAVE => {
                if self.member(group_id, member_id).is_some() {
                    self.remove_member(group_id, member_id, now, out);
                }
                return Ok(self.response(group_id, member_id, MemberEpoch::LEAVE));
            }
            MemberEpoch::LEAVE_STATIC => {
                let (meta, current) = self
                    .member(group_id, member_id)
                    .ok_or_else(|| GroupError::UnknownMemberId(member_id.into()))?;
                if meta.instance_id.is_none() {
                    return Err(GroupError::InvalidRequest(
                        "only a static member (with an instance id) leaves with epoch -2".into(),
                    ));
                }
                let mut left = current.clone();
                if left.member_epoch != MemberEpoch::LEAVE_STATIC {
                    left.previous_member_epoch = left.member_epoch;
                    left.member_epoch = MemberEpoch::LEAVE_STATIC;
                    self.emit(out, current_record(group_id, member_id, Some(left)), now);
                }
                return Ok(self.response(group_id, member_id, MemberEpoch::LEAVE_STATIC));
            }
            MemberEpoch::JOIN => {
                let subscribed: BTreeSet<String> = req
                    .subscribed_topics
                    .clone()
                    .unwrap_or_default()
                    .into_iter()
                    .collect();
                let meta = MemberValue {
                    instance_id: req.instance_id.clone(),
                    client_id: req.client_id.clone(),
                    client_host: req.client_host.clone(),
                    subscribed,
                    session_timeout_ms: req.session_timeout_ms,
                    rebalance_timeout_ms: req.rebalance_timeout_ms,
                };
                let replaced = req.instance_id.as_ref().and_then(|instance| {
                    self.groups
                        .get(group_id)?
                        .live_members()
                        .find_map(|(id, m, _)| {
                            (m.instance_id.as_ref() == Some(instance)).then(|| id.clone())
                        })
                });
                if let Some(old) = replaced.filter(|old| old != member_id) {
                    // Only a member that left for a while (-2) hands its
                    // place over; a live one keeps it until its session ends,
                    // so two processes never read its partitions at once.
                    let left = self
                        .member(group_id, &old)
                        .is_some_and(|(_, c)| c.member_epoch == MemberEpoch::LEAVE_STATIC);
                    if !left {
                        let instance = req.instance_id.clone().unwrap_or_default();
                        return Err(GroupError::UnreleasedInstanceId(instance));
                    }
                    self.replace_static_member(group_id, &old, member_id, meta, now, out);
                } else {
                    if !self.groups.contains_key(group_id)
                        && self.groups.len() >= GROUPS_PER_COORDINATOR_MAX
                    {
                        return Err(GroupError::CoordinatorFull(GROUPS_PER_COORDINATOR_MAX));
                    }
                    if self.member(group_id, member_id).is_some() {
                        // A known member asking to join again has dropped
                        // everything it owned (it was fenced or lost its state).
                        self.remove_member(group_id, member_id, now, out);
                    }
                    let members = self.groups.get(group_id).map_or(0, |g| g.members.len());
                    if members >= MEMBERS_PER_GROUP_MAX {
                        return Err(GroupError::GroupMaxSizeReached(group_id.into()));
                    }
                    self.emit(out, member_record(group_id, member_id, Some(meta)), now);
                    let joined = CurrentValue {
                        member_epoch: MemberEpoch::JOIN,
                        previous_member_epoch: MemberEpoch::JOIN,
                        state: MemberState::Stable,
                        assigned: BTreeSet::new(),
                        pending_revocation: BTreeSet::new(),
                    };
                    self.emit(out, current_record(group_id, member_id, Some(joined)), now);
                    self.bump_and_assign(group_id, assignor, now, out);
                }
            }
            sent => {
                let (meta, current) = self
                    .member(group_id, member_id)
                    .ok_or_else(|| GroupError::UnknownMemberId(member_id.into()))?;
                let accepted = sent == current.member_epoch
                    || (sent == current.previous_member_epoch
                        && current.member_epoch != MemberEpoch::LEAVE_STATIC
                        && owned
                            .as_ref()
                            .is_some_and(|o| o.is_subset(&current.assigned)));
                if !accepted || sent.0 < 0 {
                    return Err(GroupError::FencedMemberEpoch {
                        sent,
                        current: current.member_epoch,
                    });
                }
                let mut updated = meta.clone();
                if let Some(topics) = &req.subscribed_topics {
                    updated.subscribed = topics.iter().cloned().collect();
                }
                updated.session_timeout_ms = req.session_timeout_ms;
                updated.rebalance_timeout_ms = req.rebalance_timeout_ms;
                updated.client_id = req.client_id.clone();
                updated.client_host = req.client_host.clone();
                let resubscribed = updated.subscribed != meta.subscribed;
                if updated != *meta {
                    self.emit(out, member_record(group_id, member_id, Some(updated)), now);
                }
                let group_assignor = self
                    .groups
                    .get(group_id)
                    .and_then(|g| g.meta.as_ref())
                    .map(|m| m.assignor);
                if resubscribed || assignor.is_some_and(|a| Some(a) != group_assignor) {
                    self.bump_and_assign(group_id, assignor, now, out);
                }
            }
        }
        self.reconcile(group_id, member_id, owned.as_ref(), now, out);
        let session = u64::from(req.session_timeout_ms);
        if let Some(t) = self
            .timers
            .get_mut(&(group_id.to_string(), member_id.to_string()))
        {
            t.session_deadline_ms = now.monotonic_ms + session;
        }
        let epoch = self
            .member(group_id, member_id)
            .map_or(MemberEpoch::LEAVE, |(_, c)| c.member_epoch);
        Ok(self.response(group_id, member_id, epoch))
    }

    fn response(&self, group_id: &str, member_id: &str, epoch: MemberEpoch) -> HeartbeatResponse {
        let member = self.member(group_id, member_id);
        let session = member.map_or(SESSION_TIMEOUT_MS_DEFAULT, |(m, _)| m.session_timeout_ms);
        HeartbeatResponse {
            member_id: member_id.to_string(),
            member_epoch: epoch,
            heartbeat_interval_ms: (session / 3).min(HEARTBEAT_INTERVAL_MS_MAX),
            assignment: if epoch.0 >= 0 {
                member.map(|(_, c)| c.assigned.clone()).unwrap_or_default()
            } else {
                BTreeSet::new()
            },
        }
    }

    fn member(&self, group_id: &str, member_id: &str) -> Option<(&MemberValue, &CurrentValue)> {
        let m = self.groups.get(group_id)?.members.get(member_id)?;
        Some((m.meta.as_ref()?, m.current.as_ref()?))
    }

    /// A static member came back under a new member id: it takes over the
    /// old one's place, assignment and epoch, with no rebalance.
    fn replace_static_member(
        &mut self,
        group_id: &str,
        old: &str,
        new: &str,
        meta: MemberValue,
        now: Now,
        out: &mut Vec<GroupRecord>,
    ) {
        let (old_meta, old_current) = self.member(group_id, old).expect("replaced member exists");
        let mut current = old_current.clone();
        if current.member_epoch == MemberEpoch::LEAVE_STATIC {
            current.member_epoch = current.previous_member_epoch;
        }
        let resubscribed = old_meta.subscribed != meta.subscribed;
        let revoking = current.state == MemberState::UnrevokedPartitions;
        let rebalance_timeout_ms = u64::from(meta.rebalance_timeout_ms);
        self.emit(out, current_record(group_id, old, None), now);
        self.emit(out, member_record(group_id, old, None), now);
        self.emit(out, member_record(group_id, new, Some(meta)), now);
        self.emit(out, current_record(group_id, new, Some(current)), now);
        // A revocation it inherited runs against the new member's clock.
        if let Some(t) = self
            .timers
            .get_mut(&(group_id.to_string(), new.to_string()))
        {
            t.revocation_deadline_ms = revoking.then(|| now.monotonic_ms + rebalance_timeout_ms);
        }
        let group = &self.groups[group_id];
        if let Some(mut target) = group.target.clone() {
            if let Some(partitions) = target.members.remove(old) {
                target.members.insert(new.to_string(), partitions);
                self.emit(
                    out,
                    GroupRecord::Target {
                        group: group_id.into(),
                        value: Some(target),
                    },
                    now,
                );
            }
        }
        if resubscribed {
            self.bump_and_assign(group_id, None, now, out);
        }
    }

    fn remove_member(
        &mut self,
        group_id: &str,
        member_id: &str,
        now: Now,
        out: &mut Vec<GroupRecord>,
    ) {
        self.emit(out, current_record(group_id, member_id, None), now);
        self.emit(out, member_record(group_id, member_id, None), now);
        self.bump_and_assign(group_id, None, now, out);
    }

    /// A new group epoch and the target assignment at it.
    fn bump_and_assign(
        &mut self,
        group_id: &str,
        assignor: Option<AssignorKind>,
        now: Now,
        out: &mut Vec<GroupRecord>,
    ) {
        // What the new target needs, not the whole group (offsets may be many).
        let empty = Group::default();
        let group = self.groups.get(group_id).unwrap_or(&empty);
        let meta = group.meta.clone();
        let members_empty = group.members.is_empty();
        let subscriptions: BTreeMap<String, BTreeSet<String>> = group
            .live_members()
            .map(|(id, m, _)| (id.clone(), m.subscribed.clone()))
            .collect();
        let previous = group
            .target
            .as_ref()
            .map(|t| t.members.clone())
            .unwrap_or_default();
        let (epoch, kind) = match &meta {
            Some(m) => (m.epoch.next(), assignor.unwrap_or(m.assignor)),
            None => (GroupEpoch(1), assignor.unwrap_or_default()),
        };
        let empty_since_ms = match (&meta, members_empty) {
            (_, false) => -1,
            (Some(m), true) if m.empty_since_ms >= 0 => m.empty_since_ms,
            (_, true) => now.wall_ms,
        };
        self.emit(
            out,
            GroupRecord::Group {
                group: group_id.into(),
                value: Some(GroupValue {
                    epoch,
                    assignor: kind,
                    empty_since_ms,
                }),
            },
            now,
        );
        let members = assignor::assign(kind, &subscriptions, &self.topics, &previous);
        self.emit(
            out,
            GroupRecord::Target {
                group: group_id.into(),
                value: Some(TargetValue { epoch, members }),
            },
            now,
        );
    }

    /// Moves one member towards the target: revoke first, then add what no
    /// other member holds any more.
    fn reconcile(
        &mut self,
        group_id: &str,
        member_id: &str,
        owned: Option<&BTreeSet<TopicPartition>>,
        now: Now,
        out: &mut Vec<GroupRecord>,
    ) {
        let Some(group) = self.groups.get(group_id) else {
            return;
        };
        let Some((meta, current)) = self.member(group_id, member_id) else {
            return;
        };
        if current.member_epoch == MemberEpoch::LEAVE_STATIC {
            return;
        }
        let rebalance_timeout_ms = u64::from(meta.rebalance_timeout_ms);
        let Some(target) = group.target.as_ref() else {
            return;
        };
        let empty = BTreeSet::new();
        let target_partitions = target.members.get(member_id).unwrap_or(&empty);
        let mut next = current.clone();
        if next.state == MemberState::UnrevokedPartitions {
            let revoked = owned.is_some_and(|o| o.is_disjoint(&next.pending_revocation));
            if !revoked {
                return;
            }
            next.pending_revocation.clear();
        } else if next.member_epoch.0 == target.epoch.0 && next.state == MemberState::Stable {
            return;
        }
        let revoke: BTreeSet<TopicPartition> = next
            .assigned
            .difference(target_partitions)
            .cloned()
            .collect();
        let key = (group_id.to_string(), member_id.to_string());
        if !revoke.is_empty() {
            next.assigned.retain(|tp| !revoke.contains(tp));
            next.pending_revocation = revoke;
            next.state = MemberState::UnrevokedPartitions;
        } else {
            let free: Vec<TopicPartition> = target_partitions
                .difference(&next.assigned)
                .filter(|tp| group.owner_of(tp, member_id).is_none())
                .cloned()
                .collect();
            next.assigned.extend(free);
            if next.member_epoch.0 != target.epoch.0 {
                next.previous_member_epoch = next.member_epoch;
                next.member_epoch = MemberEpoch(target.epoch.0);
            }
            next.state = if next.assigned == *target_partitions {
                MemberState::Stable
            } else {
                MemberState::UnreleasedPartitions
            };
        }
        let deadline = (next.state == MemberState::UnrevokedPartitions)
            .then(|| now.monotonic_ms + rebalance_timeout_ms);
        let changed = next != *current;
        if let Some(t) = self.timers.get_mut(&key) {
            if changed || deadline.is_none() {
                t.revocation_deadline_ms = deadline;
            }
        }
        if changed {
            self.emit(out, current_record(group_id, member_id, Some(next)), now);
        }
    }

    /// Sessions that ran out and revocations that took too long remove their
    /// member; offsets of groups without members expire.
    pub fn tick(&mut self, now: Now) -> Vec<GroupRecord> {
        let mut out = Vec::new();
        let expired: Vec<(String, String)> = self
            .timers
            .iter()
            .filter(|(key, t)| {
                now.monotonic_ms >= t.session_deadline_ms
                    || t.revocation_deadline_ms.is_some_and(|d| {
                        now.monotonic_ms >= d
                            && self
                                .member(&key.0, &key.1)
                                .is_some_and(|(_, c)| c.state == MemberState::UnrevokedPartitions)
                    })
            })
            .map(|(key, _)| key.clone())
            .collect();
        // All of a group's expired members go before one rebalance.
        let mut by_group: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (group, member) in expired {
            if self.member(&group, &member).is_some() {
                by_group.entry(group).or_default().push(member);
            }
        }
        for (group, members) in by_group {
            for member in &members {
                self.emit(&mut out, current_record(&group, member, None), now);
                self.emit(&mut out, member_record(&group, member, None), now);
            }
            self.bump_and_assign(&group, None, now, &mut out);
        }
        // Groups without members: deleted once retention passed since the
        // later of their last commit and the moment they became empty (at
        // once when they hold no offsets).
        let retention_ms = self.config.offsets_retention_ms;
        let stale: Vec<String> = self
            .groups
            .iter()
            .filter(|(_, g)| {
                if !g.members.is_empty() {
                    return false;
                }
                let last_commit = g.offsets.values().map(|o| o.commit_time_ms).max();
                let empty_since = g.meta.as_ref().map_or(-1, |m| m.empty_since_ms);
                match last_commit {
                    None => true,
                    Some(last) => now.wall_ms.saturating_sub(last.max(empty_since)) >= retention_ms,
                }
            })
            .map(|(name, _)| name.clone())
            .collect();
        for group in stale {
            self.delete_group_records(&group, now, &mut out);
        }
        out
    }

    /// The cluster's topics changed: offsets of topics that no longer exist
    /// go, and groups subscribed to a topic whose partitions changed get a
    /// new target. A coordinator loaded from the log starts from no topics
    /// and is given the current ones, so a change that happened while no
    /// coordinator was loaded (or whose records were lost with the old
    /// leader) is applied then.
    pub fn set_topics(&mut self, topics: BTreeMap<String, u32>, now: Now) -> Vec<GroupRecord> {
        let mut out = Vec::new();
        let changed: BTreeSet<String> = self
            .topics
            .iter()
            .filter(|(t, n)| topics.get(*t) != Some(*n))
            .map(|(t, _)| t.clone())
            .chain(
                topics
                    .keys()
                    .filter(|t| !self.topics.contains_key(*t))
                    .cloned(),
            )
            .collect();
        self.topics = topics;
        if changed.is_empty() {
            return out;
        }
        let names: Vec<String> = self.groups.keys().cloned().collect();
        for name in names {
            let group = &self.groups[&name];
            // Offsets of topics the cluster no longer has (deleted now, or
            // while no coordinator had this partition loaded).
            let gone: Vec<TopicPartition> = group
                .offsets
                .keys()
                .filter(|tp| !self.topics.contains_key(&tp.topic))
                .cloned()
                .collect();
            let affected = group
                .live_members()
                .any(|(_, m, _)| m.subscribed.iter().any(|t| changed.contains(t)));
            for tp in gone {
                self.emit(
                    &mut out,
                    GroupRecord::Offset {
                        group: name.clone(),
                        partition: tp,
                        value: None,
                    },
                    now,
                );
            }
            if affected {
                self.bump_and_assign(&name, None, now, &mut out);
            }
        }
        out
    }

    pub fn commit(&mut self, req: &CommitRequest, now: Now) -> Written<()> {
        let mut records = Vec::new();
        let response = self.commit_inner(req, now, &mut records, None);
        Written { records, response }
    }

    /// A commit inside `producer_id`'s transaction (TxnOffsetCommit),
    /// checked as a plain commit is: its records are written in the
    /// producer's transactional batch and take effect at the commit marker.
    pub fn txn_commit(&mut self, req: &CommitRequest, producer_id: i64, now: Now) -> Written<()> {
        let pending = self.pending_txn.get(&producer_id).map_or(0, Vec::len);
        if pending == 0 && self.pending_txn.len() >= PENDING_TXN_PRODUCERS_MAX {
            return Written {
                records: Vec::new(),
                response: Err(GroupError::CoordinatorFull(PENDING_TXN_PRODUCERS_MAX)),
            };
        }
        if pending + req.offsets.len() > PENDING_TXN_OFFSETS_MAX {
            return Written {
                records: Vec::new(),
                response: Err(GroupError::InvalidRequest(format!(
                    "a transaction commits at most {PENDING_TXN_OFFSETS_MAX} offsets here"
                ))),
            };
        }
        let mut records = Vec::new();
        let response = self.commit_inner(req, now, &mut records, Some(producer_id));
        Written { records, response }
    }

    fn commit_inner(
        &mut self,
        req: &CommitRequest,
        now: Now,
        out: &mut Vec<GroupRecord>,
        txn: Option<i64>,
    ) -> Result<(), GroupError> {
        check_group_id(&req.group_id)?;
        if req.offsets.len() > PARTITIONS_PER_REQUEST_MAX {
            return Err(GroupError::InvalidRequest(format!(
                "more than {PARTITIONS_PER_REQUEST_MAX} partitions"
            )));
        }
        let group_id = req.group_id.as_str();
        if req.member_id.is_empty() {
            if req.member_epoch != MemberEpoch::LEAVE {
                return Err(GroupError::InvalidRequest(
                    "a commit without a member id carries member epoch -1".into(),
                ));
            }
            if self
                .groups
                .get(group_id)
                .is_some_and(|g| !g.members.is_empty())
            {
                return Err(GroupError::NonEmptyGroup(group_id.into()));
            }
        } else {
            let (_, current) = self
                .member(group_id, &req.member_id)
                .ok_or_else(|| GroupError::UnknownMemberId(req.member_id.clone()))?;
            let sent = req.member_epoch;
            if sent.0 < 0 || sent.0 > current.member_epoch.0 {
                return Err(GroupError::FencedMemberEpoch {
                    sent,
                    current: current.member_epoch,
                });
            }
            if sent != current.member_epoch {
                for (tp, _, _) in &req.offsets {
                    if !current.assigned.contains(tp) && !current.pending_revocation.contains(tp) {
                        return Err(GroupError::StaleMemberEpoch {
                            sent,
                            partition: tp.clone(),
                        });
                    }
                }
            }
        }
        for (tp, offset, metadata) in &req.offsets {
            let exists = self
                .topics
                .get(&tp.topic)
                .is_some_and(|n| tp.partition.0 < *n);
            if !exists {
                return Err(GroupError::UnknownTopicOrPartition(tp.clone()));
            }
            if *offset < 0 {
                return Err(GroupError::InvalidRequest(format!(
                    "offset {offset} for {tp} is negative"
                )));
            }
            if metadata.len() > OFFSET_METADATA_BYTES_MAX {
                return Err(GroupError::InvalidRequest(format!(
                    "metadata longer than {OFFSET_METADATA_BYTES_MAX} bytes"
                )));
            }
        }
        for (tp, offset, metadata) in &req.offsets {
            let value = OffsetValue {
                offset: *offset,
                metadata: metadata.clone(),
                commit_time_ms: now.wall_ms,
            };
            let record = GroupRecord::Offset {
                group: group_id.into(),
                partition: tp.clone(),
                value: Some(value),
            };
            match txn {
                None => self.emit(out, record, now),
                Some(producer_id) => {
                    self.replay_txn(producer_id, &record);
                    out.push(record);
                }
            }
        }
        Ok(())
    }

    /// Committed offsets of a group: all of them, or those named.
    pub fn fetch_offsets(
        &self,
        group_id: &str,
        partitions: Option<&[TopicPartition]>,
    ) -> Result<Vec<(TopicPartition, Option<OffsetValue>)>, GroupError> {
        check_group_id(group_id)?;
        let empty = BTreeMap::new();
        let offsets = self.groups.get(group_id).map_or(&empty, |g| &g.offsets);
        // A member starting a partition must not read an offset an open
        // transaction (perhaps a fenced owner's) may still replace: it
        // retries once the marker decided (Kafka's require_stable).
        if let Some(list) = partitions {
            for pending in self.pending_txn.values().flatten() {
                if pending.0 == group_id && list.contains(&pending.1) {
                    return Err(GroupError::UnstableOffsetCommit(pending.1.clone()));
                }
            }
        }
        Ok(match partitions {
            Some(list) => list
                .iter()
                .map(|tp| (tp.clone(), offsets.get(tp).cloned()))
                .collect(),
            None => offsets
                .iter()
                .map(|(tp, v)| (tp.clone(), Some(v.clone())))
                .collect(),
        })
    }

    pub fn list_groups(&self) -> Vec<GroupSummary> {
        self.groups
            .iter()
            .map(|(name, g)| GroupSummary {
                group_id: name.clone(),
                state: g.state(),
                members: g.members.len(),
            })
            .collect()
    }

    pub fn describe_group(&self, group_id: &str) -> Result<GroupDescription, GroupError> {
        check_group_id(group_id)?;
        let g = self
            .groups
            .get(group_id)
            .ok_or_else(|| GroupError::GroupIdNotFound(group_id.into()))?;
        let target = g.target.clone().unwrap_or(TargetValue {
            epoch: GroupEpoch(0),
            members: BTreeMap::new(),
        });
        Ok(GroupDescription {
            group_id: group_id.into(),
            state: g.state(),
            group_epoch: g.meta.as_ref().map_or(GroupEpoch(0), |m| m.epoch),
            target_epoch: target.epoch,
            assignor: g
                .meta
                .as_ref()
                .map_or_else(AssignorKind::default, |m| m.assignor),
            members: g
                .live_members()
                .map(|(id, m, c)| MemberDescription {
                    member_id: id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    member_epoch: c.member_epoch,
                    state: c.state,
                    subscribed: m.subscribed.clone(),
                    assigned: c.assigned.clone(),
                    pending_revocation: c.pending_revocation.clone(),
                    target: target.members.get(id).cloned().unwrap_or_default(),
                })
                .collect(),
            offsets: g.offsets.clone(),
        })
    }

    /// Deletes a group without members and all its offsets.
    pub fn delete_group(&mut self, group_id: &str, now: Now) -> Written<()> {
        let mut records = Vec::new();
        let response = (|| {
            check_group_id(group_id)?;
            let g = self
                .groups
                .get(group_id)
                .ok_or_else(|| GroupError::GroupIdNotFound(group_id.into()))?;
            if !g.members.is_empty() {
                return Err(GroupError::NonEmptyGroup(group_id.into()));
            }
            self.delete_group_records(group_id, now, &mut records);
            Ok(())
        })();
        Written { records, response }
    }

    fn delete_group_records(&mut self, group_id: &str, now: Now, out: &mut Vec<GroupRecord>) {
        let g = self.groups.get(group_id).cloned().unwrap_or_default();
        for tp in g.offsets.keys() {
            self.emit(
                out,
                GroupRecord::Offset {
                    group: group_id.into(),
                    partition: tp.clone(),
                    value: None,
                },
                now,
            );
        }
        if g.target.is_some() {
            self.emit(
                out,
                GroupRecord::Target {
                    group: group_id.into(),
                    value: None,
                },
                now,
            );
        }
        if g.meta.is_some() {
            self.emit(
                out,
                GroupRecord::Group {
                    group: group_id.into(),
                    value: None,
                },
                now,
            );
        }
    }

    /// Deletes a group's committed offsets of one topic, which no member may
    /// subscribe to.
    pub fn delete_offsets(&mut self, group_id: &str, topic: &str, now: Now) -> Written<()> {
        let mut records = Vec::new();
        let response = (|| {
            check_group_id(group_id)?;
            let g = self
                .groups
                .get(group_id)
                .ok_or_else(|| GroupError::GroupIdNotFound(group_id.into()))?;
            if g.live_members()
                .any(|(_, m, _)| m.subscribed.contains(topic))
            {
                return Err(GroupError::GroupSubscribedToTopic {
                    group: group_id.into(),
                    topic: topic.into(),
                });
            }
            let gone: Vec<TopicPartition> = g
                .offsets
                .keys()
                .filter(|tp| tp.topic == topic)
                .cloned()
                .collect();
            for tp in gone {
                self.emit(
                    &mut records,
                    GroupRecord::Offset {
                        group: group_id.into(),
                        partition: tp,
                        value: None,
                    },
                    now,
                );
            }
            Ok(())
        })();
        Written { records, response }
    }

    /// Checks what must hold whatever happened: no partition is held by two
    /// members, a member holds only partitions that exist, and a member past
    /// the target epoch does not exist. On in release builds: a coordinator
    /// that broke one of these would hand a partition to two readers.
    pub fn check_invariants(&self) {
        for name in self.groups.keys() {
            self.check_group(name);
        }
    }

    /// `check_invariants` for one group: what a request touched.
    pub fn check_group(&self, name: &str) {
        if let Some(g) = self.groups.get(name) {
            let mut held: BTreeMap<&TopicPartition, &str> = BTreeMap::new();
            let target_epoch = g.target.as_ref().map_or(0, |t| t.epoch.0);
            for (id, m) in &g.members {
                let Some(c) = &m.current else { continue };
                assert!(
                    c.assigned.is_disjoint(&c.pending_revocation),
                    "{name}/{id}: assigned and revoking {c:?}"
                );
                for tp in c.assigned.iter().chain(&c.pending_revocation) {
                    if let Some(other) = held.insert(tp, id) {
                        panic!("{name}: {tp} held by {other} and {id}");
                    }
                }
                assert!(
                    c.member_epoch.0 <= target_epoch,
                    "{name}/{id}: epoch {} past target {target_epoch}",
                    c.member_epoch
                );
                assert!(
                    m.meta.is_some(),
                    "{name}/{id}: assignment without member record"
                );
            }
            if let Some(meta) = &g.meta {
                assert!(
                    target_epoch <= meta.epoch.0,
                    "{name}: target epoch past group epoch"
                );
            }
        }
    }

    /// The replicated state, for comparing a coordinator with one loaded
    /// from its records.
    pub fn same_state(&self, other: &GroupCoordinator) -> bool {
        self.groups == other.groups
    }

    pub fn group_count(&self) -> usize {
        self.groups.len()
    }
}

fn member_record(group: &str, member_id: &str, value: Option<MemberValue>) -> GroupRecord {
    GroupRecord::Member {
        group: group.into(),
        member_id: member_id.into(),
        value,
    }
}

fn current_record(group: &str, member_id: &str, value: Option<CurrentValue>) -> GroupRecord {
    GroupRecord::Current {
        group: group.into(),
        member_id: member_id.into(),
        value,
    }
}

fn check_group_id(id: &str) -> Result<(), GroupError> {
    if id.is_empty() || id.len() > GROUP_ID_BYTES_MAX {
        return Err(GroupError::InvalidGroupId(format!(
            "group id must be 1..={GROUP_ID_BYTES_MAX} bytes"
        )));
    }
    Ok(())
}

fn check_name(what: &str, value: &str, max: usize) -> Result<(), GroupError> {
    if value.len() > max {
        return Err(GroupError::InvalidRequest(format!(
            "{what} longer than {max} bytes"
        )));
    }
    Ok(())
}
