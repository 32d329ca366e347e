//! `Membership`: one consumer's side of a KIP-848 group as a pure state
//! machine. Heartbeat answers, failures and the time go in; the heartbeat to
//! send, the partitions to start and to give up come out. It never does I/O
//! and never reads a clock (callers pass `now`), so every rebalance step can
//! be tested without a network. `GroupConsumer` (group.rs) drives it.
//!
//! The member owns a partition once it started it (positioned it from the
//! committed offset). The coordinator's answer is the member's whole
//! assignment: what it owns and is not in the answer must be given up
//! (revoked), what is in the answer and not owned must be started. The
//! member reports what it owns in every heartbeat, and heartbeats at once
//! after it gave something up, so the coordinator can hand it on.

use std::collections::BTreeSet;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use protocol::{ErrorCode, MemberEpoch};

use crate::accumulator::TopicPartition;
use crate::error::ClientError;
use crate::group_types::{
    HeartbeatRequest, HeartbeatResponse, GROUP_ID_BYTES_MAX, GROUP_PARTITIONS_MAX,
    MEMBER_ID_BYTES_MAX, SUBSCRIBED_TOPICS_MAX,
};

/// Bounds on the heartbeat interval the coordinator asks for: never busier
/// than every 50 ms, never slower than half the session (so one lost
/// heartbeat does not end it).
const HEARTBEAT_INTERVAL_MS_MIN: u64 = 50;
/// Characters of a member id the member chooses itself.
pub const MEMBER_ID_CHARS: usize = 22;

/// The settings a member sends with every heartbeat.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberSettings {
    pub group_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub session_timeout_ms: u32,
    pub rebalance_timeout_ms: u32,
    pub assignor: Option<String>,
    /// First pause after a failed heartbeat, doubled per failure in a row.
    pub retry_backoff_ms: u64,
    pub retry_backoff_ms_max: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// No subscription yet: nothing to send.
    Unsubscribed,
    /// Joining (again): the next heartbeat carries `MemberEpoch::JOIN`.
    Joining,
    /// The coordinator answered a join; heartbeats carry its epoch.
    Member,
    /// Left for good (`leave`); nothing more is sent.
    Left,
}

/// What a failed heartbeat asks the driver to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeartbeatFailure {
    /// The coordinator no longer knows the member at this epoch: these
    /// partitions are lost (stop fetching, do not commit) and the member
    /// joins again at once.
    Fenced { lost: Vec<TopicPartition> },
    /// Try again after the backoff (the coordinator may have moved).
    Retry,
    /// An error retrying cannot fix (a bad group id, a full group, an
    /// unknown assignor): surface it; the member still tries again after
    /// the backoff.
    Fatal,
}

/// A member's view of its group.
#[derive(Debug)]
pub struct Membership {
    settings: MemberSettings,
    phase: Phase,
    member_id: String,
    member_epoch: MemberEpoch,
    subscription: BTreeSet<String>,
    /// What the member started and reports to the coordinator.
    owned: BTreeSet<TopicPartition>,
    /// The coordinator's last answer: everything the member may own.
    assignment: BTreeSet<TopicPartition>,
    heartbeat_interval: Duration,
    /// When the next heartbeat is due; `None` while none may be sent.
    next_heartbeat_at: Option<Instant>,
    heartbeat_in_flight: bool,
    /// Failed heartbeats in a row, for the backoff.
    failures: u32,
    /// When the coordinator last answered; the session is counted from it.
    last_answer_at: Option<Instant>,
    /// Whether the coordinator may know this member id (a join was sent
    /// since the member last lost its partitions), so `leave` must tell it.
    join_sent: bool,
}

impl Membership {
    pub fn new(settings: MemberSettings, member_id: String) -> Membership {
        assert!(
            !member_id.is_empty() && member_id.len() <= MEMBER_ID_BYTES_MAX,
            "member id of {} bytes",
            member_id.len()
        );
        let session_ms = u64::from(settings.session_timeout_ms);
        let membership = Membership {
            settings,
            phase: Phase::Unsubscribed,
            member_id,
            member_epoch: MemberEpoch::JOIN,
            subscription: BTreeSet::new(),
            owned: BTreeSet::new(),
            assignment: BTreeSet::new(),
            heartbeat_interval: Duration::from_millis(session_ms / 3),
            next_heartbeat_at: None,
            heartbeat_in_flight: false,
            failures: 0,
            last_answer_at: None,
            join_sent: false,
        };
        membership.check_invariants();
        membership
    }

    pub fn member_id(&self) -> &str {
        &self.member_id
    }

    pub fn member_epoch(&self) -> MemberEpoch {
        self.member_epoch
    }

    pub fn group_id(&self) -> &str {
        &self.settings.group_id
    }

    /// Whether the coordinator answered a join and the member has not lost
    /// its membership since.
    pub fn is_member(&self) -> bool {
        self.phase == Phase::Member
    }

    pub fn subscription(&self) -> &BTreeSet<String> {
        &self.subscription
    }

    /// The partitions the member owns (started and not given up).
    pub fn owned(&self) -> &BTreeSet<TopicPartition> {
        &self.owned
    }

    pub fn owns(&self, tp: &TopicPartition) -> bool {
        self.owned.contains(tp)
    }

    /// Replaces the subscription; a change is sent with the next heartbeat,
    /// which is due at once. The first subscription starts the join.
    pub fn subscribe(&mut self, topics: &[String], now: Instant) -> Result<(), ClientError> {
        assert!(self.phase != Phase::Left, "subscribe after leaving");
        if topics.len() > SUBSCRIBED_TOPICS_MAX {
            return Err(ClientError::InvalidConfig {
                field: "subscription",
                reason: format!("more than {SUBSCRIBED_TOPICS_MAX} topics"),
            });
        }
        if let Some(bad) = topics
            .iter()
            .find(|t| t.is_empty() || t.len() > GROUP_ID_BYTES_MAX)
        {
            return Err(ClientError::InvalidConfig {
                field: "subscription",
                reason: format!(
                    "topic name `{bad}` is empty or longer than {GROUP_ID_BYTES_MAX} bytes"
                ),
            });
        }
        let topics: BTreeSet<String> = topics.iter().cloned().collect();
        if topics == self.subscription && self.phase != Phase::Unsubscribed {
            return Ok(());
        }
        self.subscription = topics;
        if self.phase == Phase::Unsubscribed {
            self.phase = Phase::Joining;
        }
        self.next_heartbeat_at = Some(now);
        self.check_invariants();
        Ok(())
    }

    /// When the next heartbeat is due, if one may be sent (none in flight).
    pub fn next_heartbeat_at(&self) -> Option<Instant> {
        if self.heartbeat_in_flight {
            None
        } else {
            self.next_heartbeat_at
        }
    }

    /// The heartbeat to send now, if one is due; the member then waits for
    /// its answer (`on_heartbeat_response` or `on_heartbeat_error`) before
    /// it sends another. It carries the subscription and everything owned.
    pub fn heartbeat(&mut self, now: Instant) -> Option<HeartbeatRequest> {
        let due = self.next_heartbeat_at.is_some_and(|at| at <= now);
        if !due || self.heartbeat_in_flight {
            return None;
        }
        assert!(matches!(self.phase, Phase::Joining | Phase::Member));
        self.heartbeat_in_flight = true;
        self.next_heartbeat_at = None;
        if self.phase == Phase::Joining {
            self.join_sent = true;
        }
        let request = self.request(self.member_epoch);
        Some(HeartbeatRequest {
            subscribed_topics: Some(self.subscription.iter().cloned().collect()),
            owned: Some(self.owned.iter().cloned().collect()),
            ..request
        })
    }

    fn request(&self, member_epoch: MemberEpoch) -> HeartbeatRequest {
        HeartbeatRequest {
            group_id: self.settings.group_id.clone(),
            member_id: self.member_id.clone(),
            member_epoch,
            instance_id: self.settings.instance_id.clone(),
            client_id: self.settings.client_id.clone(),
            session_timeout_ms: self.settings.session_timeout_ms,
            rebalance_timeout_ms: self.settings.rebalance_timeout_ms,
            subscribed_topics: None,
            assignor: self.settings.assignor.clone(),
            owned: None,
        }
    }

    /// Takes the coordinator's answer: the new epoch, the interval and the
    /// whole assignment. What to start and revoke follows from
    /// `to_start`/`to_revoke`.
    pub fn on_heartbeat_response(&mut self, response: HeartbeatResponse, now: Instant) {
        assert!(self.heartbeat_in_flight, "an answer without a heartbeat");
        self.heartbeat_in_flight = false;
        if self.phase == Phase::Left {
            return;
        }
        if response.member_epoch.0 < 0 {
            // Not an answer to a join or heartbeat: the coordinator no longer
            // counts the member in. Start over.
            self.lose_everything(now);
            return;
        }
        if !response.member_id.is_empty() && response.member_id.len() <= MEMBER_ID_BYTES_MAX {
            self.member_id = response.member_id;
        }
        self.phase = Phase::Member;
        self.member_epoch = response.member_epoch;
        let assignment = response.assignment;
        assert!(
            assignment.len() <= GROUP_PARTITIONS_MAX,
            "the decoder bounds an assignment"
        );
        self.assignment = assignment;
        self.heartbeat_interval = self.clamp_interval(response.heartbeat_interval_ms);
        self.failures = 0;
        self.last_answer_at = Some(now);
        if self.next_heartbeat_at.is_none() {
            self.next_heartbeat_at = Some(now + self.heartbeat_interval);
        }
        self.check_invariants();
    }

    fn clamp_interval(&self, interval_ms: u32) -> Duration {
        let session_ms = u64::from(self.settings.session_timeout_ms);
        let asked_ms = match u64::from(interval_ms) {
            0 => session_ms / 3,
            ms => ms,
        };
        let max_ms = (session_ms / 2).max(HEARTBEAT_INTERVAL_MS_MIN);
        Duration::from_millis(asked_ms.clamp(HEARTBEAT_INTERVAL_MS_MIN, max_ms))
    }

    /// Takes a failed heartbeat and says what the driver must do.
    pub fn on_heartbeat_error(&mut self, error: &ClientError, now: Instant) -> HeartbeatFailure {
        assert!(self.heartbeat_in_flight, "a failure without a heartbeat");
        self.heartbeat_in_flight = false;
        if self.phase == Phase::Left {
            return HeartbeatFailure::Retry;
        }
        let failure = match error {
            ClientError::Broker {
                code: ErrorCode::FencedMemberEpoch | ErrorCode::UnknownMemberId,
                ..
            } => {
                let lost = self.lose_everything(now);
                return HeartbeatFailure::Fenced { lost };
            }
            // A static member restarted while its previous process is still
            // in the group: the id is released when that one's session ends.
            ClientError::Broker {
                code: ErrorCode::UnreleasedInstanceId,
                ..
            } => HeartbeatFailure::Retry,
            error if error.is_retriable() => HeartbeatFailure::Retry,
            _ => HeartbeatFailure::Fatal,
        };
        self.failures = self.failures.saturating_add(1);
        let retry_at = now + self.backoff();
        self.next_heartbeat_at = Some(
            self.next_heartbeat_at
                .map_or(retry_at, |at| at.max(retry_at)),
        );
        self.check_invariants();
        failure
    }

    fn backoff(&self) -> Duration {
        let factor = 1u64 << self.failures.saturating_sub(1).min(20);
        Duration::from_millis(
            self.settings
                .retry_backoff_ms
                .saturating_mul(factor)
                .min(self.settings.retry_backoff_ms_max),
        )
    }

    /// Drops every partition and goes back to joining with epoch 0 at once;
    /// returns what was owned.
    fn lose_everything(&mut self, now: Instant) -> Vec<TopicPartition> {
        let lost: Vec<TopicPartition> = std::mem::take(&mut self.owned).into_iter().collect();
        self.assignment.clear();
        self.member_epoch = MemberEpoch::JOIN;
        self.phase = Phase::Joining;
        self.failures = 0;
        self.last_answer_at = None;
        self.next_heartbeat_at = Some(now);
        self.check_invariants();
        lost
    }

    /// Without an answer for a whole session the coordinator has removed the
    /// member and may have given its partitions to others: drop them (without
    /// committing) and join again. Returns the lost partitions; empty while
    /// the session holds or a heartbeat is still in flight.
    pub fn check_session(&mut self, now: Instant) -> Vec<TopicPartition> {
        let session = Duration::from_millis(u64::from(self.settings.session_timeout_ms));
        let expired = self.phase == Phase::Member
            && !self.heartbeat_in_flight
            && self
                .last_answer_at
                .is_some_and(|at| now.saturating_duration_since(at) >= session);
        if expired {
            self.lose_everything(now)
        } else {
            Vec::new()
        }
    }

    /// Owned partitions the coordinator took away, in order.
    pub fn to_revoke(&self) -> Vec<TopicPartition> {
        self.owned.difference(&self.assignment).cloned().collect()
    }

    /// Assigned partitions not started yet, in order.
    pub fn to_start(&self) -> Vec<TopicPartition> {
        if self.phase != Phase::Member {
            return Vec::new();
        }
        self.assignment.difference(&self.owned).cloned().collect()
    }

    /// The driver stopped these partitions (and committed them if it had
    /// to): they leave `owned`, and the coordinator hears so at once.
    pub fn revoked(&mut self, partitions: &[TopicPartition], now: Instant) {
        for tp in partitions {
            assert!(!self.assignment.contains(tp), "revoking assigned {tp:?}");
            assert!(self.owned.remove(tp), "revoking {tp:?}, which is not owned");
        }
        if !partitions.is_empty() {
            self.next_heartbeat_at = Some(now);
        }
        self.check_invariants();
    }

    /// The driver positioned these partitions: the member owns them and
    /// tells the coordinator at once. Partitions no longer assigned (a newer
    /// answer took them away meanwhile) are skipped and returned, for the
    /// driver to stop again.
    pub fn started(&mut self, partitions: &[TopicPartition], now: Instant) -> Vec<TopicPartition> {
        let mut stale = Vec::new();
        for tp in partitions {
            if self.assignment.contains(tp) {
                assert!(self.owned.insert(tp.clone()), "starting owned {tp:?}");
            } else {
                stale.push(tp.clone());
            }
        }
        if partitions.len() > stale.len() {
            self.next_heartbeat_at = Some(now);
        }
        self.check_invariants();
        stale
    }

    /// The heartbeat that leaves the group for good (epoch -1), or for a
    /// while for a static member (epoch -2, its partitions wait for it until
    /// its session ends); `None` when the coordinator cannot know the member.
    /// Everything owned is dropped; the driver has committed it before.
    pub fn leave(&mut self) -> Option<HeartbeatRequest> {
        let known = self.join_sent && matches!(self.phase, Phase::Joining | Phase::Member);
        self.phase = Phase::Left;
        self.owned.clear();
        self.assignment.clear();
        self.next_heartbeat_at = None;
        self.check_invariants();
        let epoch = if self.settings.instance_id.is_some() {
            MemberEpoch::LEAVE_STATIC
        } else {
            MemberEpoch::LEAVE
        };
        known.then(|| self.request(epoch))
    }

    pub fn check_invariants(&self) {
        assert!(self.owned.len() <= GROUP_PARTITIONS_MAX);
        match self.phase {
            Phase::Unsubscribed | Phase::Left => {
                assert!(self.owned.is_empty() && self.assignment.is_empty());
                assert!(self.next_heartbeat_at.is_none(), "nothing to send");
            }
            Phase::Joining | Phase::Member => {
                // Liveness: a member always has a heartbeat either waiting
                // for its answer or scheduled.
                assert!(
                    self.heartbeat_in_flight || self.next_heartbeat_at.is_some(),
                    "a member with no heartbeat to come"
                );
                if self.phase == Phase::Joining {
                    assert_eq!(self.member_epoch, MemberEpoch::JOIN, "joining at epoch 0");
                    assert!(self.owned.is_empty(), "a joining member owns nothing");
                    assert!(self.assignment.is_empty());
                } else {
                    assert!(self.member_epoch.0 >= 0, "a member has a real epoch");
                }
            }
        }
    }
}

/// A fresh member id: 22 characters of base 62 (about 131 bits), from the
/// process's randomly keyed hasher over the time, the process id and a
/// counter, so two members of one process or of two processes never pick the
/// same id.
pub fn random_member_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let word = |salt: u64| {
        std::collections::hash_map::RandomState::new().hash_one((
            salt,
            count,
            nanos,
            std::process::id(),
        ))
    };
    let mut bits = (u128::from(word(1)) << 64) | u128::from(word(2));
    let mut id = String::with_capacity(MEMBER_ID_CHARS);
    for _ in 0..MEMBER_ID_CHARS {
        id.push(char::from(ALPHABET[(bits % 62) as usize]));
        bits /= 62;
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(instance_id: Option<&str>) -> MemberSettings {
        MemberSettings {
            group_id: "g".into(),
            instance_id: instance_id.map(str::to_owned),
            client_id: "c".into(),
            session_timeout_ms: 6_000,
            rebalance_timeout_ms: 60_000,
            assignor: None,
            retry_backoff_ms: 100,
            retry_backoff_ms_max: 1_000,
        }
    }

    fn tps(list: &[(&str, i32)]) -> Vec<TopicPartition> {
        list.iter()
            .map(|(t, p)| TopicPartition::new(*t, *p))
            .collect()
    }

    fn answer(epoch: i32, assignment: &[(&str, i32)]) -> HeartbeatResponse {
        HeartbeatResponse {
            member_id: String::new(),
            member_epoch: MemberEpoch(epoch),
            heartbeat_interval_ms: 1_000,
            assignment: tps(assignment).into_iter().collect(),
        }
    }

    fn joined(start: Instant) -> Membership {
        let mut m = Membership::new(settings(None), "m1".into());
        m.subscribe(&["t".into()], start).unwrap();
        let join = m.heartbeat(start).expect("join is due at once");
        assert_eq!(join.member_epoch, MemberEpoch::JOIN);
        assert_eq!(join.owned, Some(Vec::new()));
        assert_eq!(join.subscribed_topics, Some(vec!["t".to_owned()]));
        m.on_heartbeat_response(answer(1, &[("t", 0), ("t", 1)]), start);
        m
    }

    #[test]
    fn join_then_start_then_heartbeat_on_the_interval() {
        // Proves the join sequence: nothing is sent before a subscription,
        // the join carries epoch 0 and nothing owned, the answer's partitions
        // are to be started, starting them triggers an immediate heartbeat
        // that reports them, and later heartbeats follow the interval.
        let t0 = Instant::now();
        let mut idle = Membership::new(settings(None), "m0".into());
        assert!(
            idle.heartbeat(t0).is_none(),
            "no heartbeat before subscribe"
        );
        let mut m = joined(t0);
        assert!(m.heartbeat(t0).is_none(), "one heartbeat at a time");
        assert_eq!(m.to_start(), tps(&[("t", 0), ("t", 1)]));
        assert!(m.to_revoke().is_empty());
        assert!(m.next_heartbeat_at().unwrap() > t0);
        let stale = m.started(&m.to_start(), t0);
        assert!(stale.is_empty());
        assert!(m.to_start().is_empty());
        let ack = m.heartbeat(t0).expect("acknowledging the new partitions");
        assert_eq!(ack.member_epoch, MemberEpoch(1));
        assert_eq!(ack.owned, Some(tps(&[("t", 0), ("t", 1)])));
        m.on_heartbeat_response(answer(1, &[("t", 0), ("t", 1)]), t0);
        assert!(m.heartbeat(t0 + Duration::from_millis(999)).is_none());
        assert!(m.heartbeat(t0 + Duration::from_millis(1_000)).is_some());
    }

    #[test]
    fn revocation_before_the_partition_moves_on() {
        // Proves a partition missing from the answer is to be revoked, stays
        // owned (and reported) until the driver revoked it, and that the
        // revocation asks for a heartbeat at once without owning it.
        let t0 = Instant::now();
        let mut m = joined(t0);
        m.started(&m.to_start(), t0);
        m.heartbeat(t0).unwrap();
        m.on_heartbeat_response(answer(2, &[("t", 0)]), t0);
        assert_eq!(m.member_epoch(), MemberEpoch(2));
        assert_eq!(m.to_revoke(), tps(&[("t", 1)]));
        assert!(m.to_start().is_empty());
        assert!(m.owns(&TopicPartition::new("t", 1)), "owned until revoked");
        let t1 = t0 + Duration::from_millis(10);
        m.revoked(&tps(&[("t", 1)]), t1);
        assert_eq!(m.next_heartbeat_at(), Some(t1));
        let hb = m.heartbeat(t1).unwrap();
        assert_eq!(hb.owned, Some(tps(&[("t", 0)])));
        // A later answer hands the partition back: it is started again.
        m.on_heartbeat_response(answer(3, &[("t", 0), ("t", 1)]), t1);
        assert_eq!(m.to_start(), tps(&[("t", 1)]));
    }

    #[test]
    fn fencing_loses_everything_and_rejoins() {
        // Proves FENCED_MEMBER_EPOCH and UNKNOWN_MEMBER_ID drop every owned
        // partition (returned as lost, not revoked) and rejoin at epoch 0
        // right away, while coordinator errors only back off.
        let t0 = Instant::now();
        for code in [ErrorCode::FencedMemberEpoch, ErrorCode::UnknownMemberId] {
            let mut m = joined(t0);
            m.started(&m.to_start(), t0);
            m.heartbeat(t0).unwrap();
            let failure = m.on_heartbeat_error(&ClientError::broker(code, None), t0);
            assert_eq!(
                failure,
                HeartbeatFailure::Fenced {
                    lost: tps(&[("t", 0), ("t", 1)])
                }
            );
            assert!(m.owned().is_empty() && m.to_start().is_empty());
            let rejoin = m.heartbeat(t0).expect("rejoin at once");
            assert_eq!(rejoin.member_epoch, MemberEpoch::JOIN);
            assert_eq!(rejoin.owned, Some(Vec::new()));
        }
        let mut m = joined(t0);
        m.started(&m.to_start(), t0);
        m.heartbeat(t0).unwrap();
        let failure =
            m.on_heartbeat_error(&ClientError::broker(ErrorCode::NotCoordinator, None), t0);
        assert_eq!(failure, HeartbeatFailure::Retry);
        assert_eq!(m.owned().len(), 2, "a moving coordinator loses nothing");
        assert_eq!(m.next_heartbeat_at(), Some(t0 + Duration::from_millis(100)));
        m.heartbeat(t0 + Duration::from_millis(100)).unwrap();
        m.on_heartbeat_error(
            &ClientError::broker(ErrorCode::CoordinatorNotAvailable, None),
            t0,
        );
        assert_eq!(
            m.next_heartbeat_at(),
            Some(t0 + Duration::from_millis(200)),
            "backoff doubles"
        );
        m.heartbeat(t0 + Duration::from_millis(200)).unwrap();
        let fatal = m.on_heartbeat_error(
            &ClientError::broker(ErrorCode::GroupMaxSizeReached, None),
            t0,
        );
        assert_eq!(fatal, HeartbeatFailure::Fatal);
        // A restarted static member whose previous process is still in the
        // group waits for it, retrying.
        let mut m = joined(t0);
        let later = t0 + Duration::from_secs(60);
        m.heartbeat(later).expect("a heartbeat is due");
        let unreleased = m.on_heartbeat_error(
            &ClientError::broker(ErrorCode::UnreleasedInstanceId, None),
            later,
        );
        assert_eq!(unreleased, HeartbeatFailure::Retry);
    }

    #[test]
    fn session_expiry_without_answers_drops_partitions() {
        // Proves a member that heard nothing for a whole session gives its
        // partitions up on its own (the coordinator has handed them on), but
        // not while a heartbeat is still waiting for its answer.
        let t0 = Instant::now();
        let mut m = joined(t0);
        m.started(&m.to_start(), t0);
        let late = t0 + Duration::from_millis(6_000);
        assert!(m
            .check_session(t0 + Duration::from_millis(5_999))
            .is_empty());
        m.heartbeat(late).unwrap();
        assert!(m.check_session(late).is_empty(), "in flight");
        m.on_heartbeat_error(
            &ClientError::RequestTimeout {
                address: "x".into(),
                timeout_ms: 1,
            },
            late,
        );
        assert_eq!(m.check_session(late), tps(&[("t", 0), ("t", 1)]));
        assert_eq!(m.heartbeat(late).unwrap().member_epoch, MemberEpoch::JOIN);
    }

    #[test]
    fn starting_a_partition_taken_away_meanwhile_is_stale() {
        // Proves a partition that a newer answer took away while the driver
        // was starting it does not become owned.
        let t0 = Instant::now();
        let mut m = joined(t0);
        let starting = m.to_start();
        let t1 = m.next_heartbeat_at().unwrap();
        m.heartbeat(t1).unwrap();
        m.on_heartbeat_response(answer(2, &[("t", 0)]), t1);
        assert_eq!(m.started(&starting, t1), tps(&[("t", 1)]));
        assert_eq!(
            m.owned().iter().cloned().collect::<Vec<_>>(),
            tps(&[("t", 0)])
        );
    }

    #[test]
    fn subscription_changes_and_leaving() {
        // Proves a new subscription is sent at once, an unchanged one is not,
        // and that leaving uses epoch -1 (-2 for a static member) and only
        // once the coordinator may know the member.
        let t0 = Instant::now();
        let mut m = joined(t0);
        m.started(&m.to_start(), t0);
        m.heartbeat(t0).unwrap();
        m.on_heartbeat_response(answer(1, &[("t", 0), ("t", 1)]), t0);
        m.subscribe(&["t".into()], t0).unwrap();
        assert!(m.heartbeat(t0).is_none(), "unchanged subscription");
        m.subscribe(&["t".into(), "u".into()], t0).unwrap();
        let hb = m.heartbeat(t0).unwrap();
        assert_eq!(
            hb.subscribed_topics,
            Some(vec!["t".to_owned(), "u".to_owned()])
        );
        m.on_heartbeat_response(answer(2, &[("t", 0), ("t", 1)]), t0);
        let leave = m.leave().unwrap();
        assert_eq!(leave.member_epoch, MemberEpoch::LEAVE);
        assert!(m.owned().is_empty());
        assert!(m.heartbeat(t0 + Duration::from_secs(60)).is_none());

        let mut never_joined = Membership::new(settings(None), "m2".into());
        assert!(never_joined.leave().is_none());

        let mut fixed = Membership::new(settings(Some("host-1")), "m3".into());
        fixed.subscribe(&["t".into()], t0).unwrap();
        fixed.heartbeat(t0).unwrap();
        fixed.on_heartbeat_response(answer(1, &[]), t0);
        let leave = fixed.leave().unwrap();
        assert_eq!(leave.member_epoch, MemberEpoch::LEAVE_STATIC);
        assert_eq!(leave.instance_id.as_deref(), Some("host-1"));
    }

    #[test]
    fn interval_is_bounded_by_the_session() {
        // Proves the coordinator's interval is used within bounds: at least
        // 50 ms, at most half the session, a third of it when absent.
        let t0 = Instant::now();
        let mut m = joined(t0);
        for (asked, expected_ms) in [(1_000, 1_000), (0, 2_000), (10, 50), (60_000, 3_000)] {
            m.heartbeat(m.next_heartbeat_at().unwrap()).unwrap();
            let at = Instant::now();
            m.on_heartbeat_response(
                HeartbeatResponse {
                    heartbeat_interval_ms: asked,
                    ..answer(1, &[("t", 0), ("t", 1)])
                },
                at,
            );
            assert_eq!(
                m.next_heartbeat_at(),
                Some(at + Duration::from_millis(expected_ms)),
                "interval {asked}"
            );
        }
    }

    #[test]
    fn member_ids_are_distinct_and_well_formed() {
        // Proves generated member ids have the documented shape and that many
        // in a row never repeat.
        let ids: BTreeSet<String> = (0..1_000).map(|_| random_member_id()).collect();
        assert_eq!(ids.len(), 1_000);
        for id in &ids {
            assert_eq!(id.len(), MEMBER_ID_CHARS);
            assert!(id.bytes().all(|b| b.is_ascii_alphanumeric()));
        }
    }
}
