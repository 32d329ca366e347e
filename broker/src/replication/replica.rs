//! One partition replica's replication state as a state machine, without
//! I/O: its role, its leader state while it leads, its leader-epoch history
//! and whether an ISR change is on its way. Events come in (a role from the
//! metadata, an append at an epoch, a cut, a follower's fetch, the time for
//! an ISR check, a controller's answer) and decisions go out; the shard does
//! the I/O they call for (saving the epoch history, answering, asking the
//! controller) and keeps the high watermark, which waiters wait on. The
//! simulator drives the same state machine.

use protocol::{BrokerEpoch, BrokerId, ErrorCode, LeaderEpoch, Offset, PartitionEpoch};

use super::ack::{self, AckDecision, AckView};
use super::epochs::EpochHistory;
use super::follower::{self, FollowerAction, LeaderAnswer};
use super::leader::{
    check_follower_fetch, FetchAccepted, FollowerFetch, FollowerFetchCheck, LeaderState,
};
use super::role::{role_change, Role, RoleChange};

/// What applying a role did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoleApplied {
    /// A leadership (or a new epoch of it) started.
    pub new_leadership: bool,
    /// Stopped leading at the old epoch: its waiting writes fail.
    pub demoted: bool,
    /// The epoch history changed and must be saved.
    pub epochs_changed: bool,
}

/// A leader's verdict on a follower's fetch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FollowerFetchVerdict {
    /// Accepted and counted: serve it (and move the high watermark).
    Serve,
    Refuse(ErrorCode, String),
    /// The follower's log parts from this one: it cuts first.
    Diverging {
        epoch: LeaderEpoch,
        end_offset: Offset,
    },
}

/// An ISR change for the controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IsrChange {
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: PartitionEpoch,
    pub new_isr: Vec<BrokerId>,
    /// Broker epochs of `new_isr`, in the same order.
    pub new_isr_epochs: Vec<BrokerEpoch>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaCore {
    me: BrokerId,
    role: Role,
    leader: Option<LeaderState>,
    epochs: EpochHistory,
    alter_isr_in_flight: bool,
}

impl ReplicaCore {
    /// A replica just opened with `epochs` recovered from its directory, in a
    /// role older than any the controller gives out (`Role::opened`).
    pub fn new(me: BrokerId, like: &Role, epochs: EpochHistory) -> ReplicaCore {
        ReplicaCore {
            me,
            role: Role::opened(like),
            leader: None,
            epochs,
            alter_isr_in_flight: false,
        }
    }

    pub fn role(&self) -> &Role {
        &self.role
    }

    pub fn epochs(&self) -> &EpochHistory {
        &self.epochs
    }

    pub fn leader_state(&self) -> Option<&LeaderState> {
        self.leader.as_ref()
    }

    /// Whether a leader's high watermark `hw` covers everything it held when
    /// its epoch began. Until it does, the high watermark may be one the old
    /// leader had already passed (a follower learns it one fetch late), so
    /// offsets answered from it could go backwards for a consumer; Kafka
    /// answers OFFSET_NOT_AVAILABLE then, and so does ListOffsets here.
    pub fn high_watermark_established(&self, hw: Offset) -> bool {
        let epoch_start = self
            .epochs
            .start_of(self.role.leader_epoch)
            .unwrap_or(Offset::ZERO);
        !self.role.leader || hw >= epoch_start
    }

    /// Whether this replica leads at `leader_epoch`.
    pub fn leads_at(&self, leader_epoch: LeaderEpoch) -> bool {
        self.role.leader && self.role.leader_epoch == leader_epoch
    }

    /// A follower still following at `leader_epoch`.
    pub fn follows_at(&self, leader_epoch: LeaderEpoch) -> bool {
        !self.role.leader && self.role.leader_epoch == leader_epoch
    }

    /// Moves to `role` by `role_change`; `None` when it is the same or an
    /// older one. A new leadership starts its epoch at `log_end` and tracks
    /// its followers afresh from `high_watermark`.
    pub fn apply_role(
        &mut self,
        role: Role,
        log_end: Offset,
        high_watermark: Offset,
        now_ms: u64,
    ) -> Option<RoleApplied> {
        let (new_leadership, demoted) = match role_change(&self.role, &role) {
            RoleChange::Unchanged | RoleChange::Stale => return None,
            RoleChange::Apply {
                new_leadership,
                demoted,
            } => (new_leadership, demoted),
        };
        self.role = role;
        let mut epochs_changed = false;
        if new_leadership {
            epochs_changed = self.epochs.assign(self.role.leader_epoch, log_end);
            self.leader = Some(LeaderState::new(
                self.me,
                &self.role.replicas,
                high_watermark.min(log_end),
                now_ms,
            ));
            self.alter_isr_in_flight = false;
        } else if !self.role.leader {
            self.leader = None;
        }
        self.check();
        Some(RoleApplied {
            new_leadership,
            demoted,
            epochs_changed,
        })
    }

    /// Records that `epoch` starts at `start` (an append); true if the
    /// history changed and must be saved.
    pub fn note_epoch(&mut self, epoch: LeaderEpoch, start: Offset) -> bool {
        let changed = self.epochs.assign(epoch, start);
        self.check();
        changed
    }

    /// The log was cut to end at `new_end`; true if the history changed.
    pub fn cut(&mut self, new_end: Offset) -> bool {
        let changed = self.epochs.truncate_to(new_end);
        self.check();
        changed
    }

    /// Holds after every change: leader state exists exactly while leading,
    /// and a leader's epoch history ends in its own epoch (it appends only
    /// in it, and no record of its log is from a later one).
    fn check(&self) {
        assert_eq!(
            self.leader.is_some(),
            self.role.leader,
            "leader state exactly while leading (role {:?})",
            self.role
        );
        if self.role.leader {
            assert_eq!(
                self.epochs.latest_epoch(),
                Some(self.role.leader_epoch),
                "a leader's epoch history ends in its own epoch"
            );
        }
    }

    /// A leader's high watermark from its ISR's progress and its own stable
    /// offset, never below `current`; `None` when not leading.
    pub fn high_watermark(&mut self, current: Offset, stable_end: Offset) -> Option<Offset> {
        let state = self.leader.as_mut()?;
        Some(current.max(state.update_high_watermark(&self.role.isr, stable_end)))
    }

    /// A leader's checks of a follower's fetch at `offset` (leadership,
    /// divergence, the follower's incarnation against `registered_epoch`,
    /// the broker epoch the metadata holds for it), recording its progress
    /// when accepted.
    pub fn follower_fetch(
        &mut self,
        fetch: &FollowerFetch,
        offset: Offset,
        log_end: Offset,
        registered_epoch: Option<BrokerEpoch>,
        now_ms: u64,
    ) -> FollowerFetchVerdict {
        let Some(state) = self.leader.as_mut().filter(|_| self.role.leader) else {
            return FollowerFetchVerdict::Refuse(
                ErrorCode::NotLeaderOrFollower,
                "not the leader".to_string(),
            );
        };
        match check_follower_fetch(self.role.leader_epoch, fetch, offset, &self.epochs, log_end) {
            FollowerFetchCheck::Serve => {}
            FollowerFetchCheck::Refuse(code, message) => {
                return FollowerFetchVerdict::Refuse(code, message)
            }
            FollowerFetchCheck::Diverging { epoch, end_offset } => {
                return FollowerFetchVerdict::Diverging { epoch, end_offset }
            }
        }
        // An incarnation older than the one the metadata registered is a
        // zombie: its progress may not be on any disk that still counts.
        if let Some(registered) = registered_epoch.filter(|&r| fetch.broker_epoch < r) {
            return FollowerFetchVerdict::Refuse(
                ErrorCode::NotLeaderOrFollower,
                format!(
                    "broker {} fetches at epoch {}, registered at {registered}",
                    fetch.broker_id, fetch.broker_epoch
                ),
            );
        }
        match state.on_fetch(fetch.broker_id, fetch.broker_epoch, offset, log_end, now_ms) {
            FetchAccepted::Accepted => FollowerFetchVerdict::Serve,
            FetchAccepted::StaleBrokerEpoch => FollowerFetchVerdict::Refuse(
                ErrorCode::NotLeaderOrFollower,
                format!(
                    "broker {} fetches from an older incarnation (epoch {})",
                    fetch.broker_id, fetch.broker_epoch
                ),
            ),
            FetchAccepted::NotReplica => FollowerFetchVerdict::Refuse(
                ErrorCode::NotLeaderOrFollower,
                format!("broker {} is not a replica", fetch.broker_id),
            ),
        }
    }

    /// What this follower does with its leader's answer.
    pub fn follower_action(&self, answer: &LeaderAnswer, own_log_end: Offset) -> FollowerAction {
        follower::decide(answer, own_log_end, &self.epochs)
    }

    /// A leader's periodic ISR check: the change to ask the controller for,
    /// if any and none is on its way (it is then on its way).
    pub fn isr_change(
        &mut self,
        now_ms: u64,
        lag_max_ms: u64,
        my_broker_epoch: BrokerEpoch,
        ineligible: &std::collections::BTreeSet<BrokerId>,
    ) -> Option<IsrChange> {
        if self.alter_isr_in_flight || !self.role.leader {
            return None;
        }
        let state = self.leader.as_ref()?;
        let epoch_start = self
            .epochs
            .start_of(self.role.leader_epoch)
            .unwrap_or(Offset::ZERO);
        let new_isr =
            state.desired_isr(&self.role.isr, epoch_start, now_ms, lag_max_ms, ineligible)?;
        let new_isr_epochs = state.member_epochs(&new_isr, my_broker_epoch);
        self.alter_isr_in_flight = true;
        Some(IsrChange {
            leader_epoch: self.role.leader_epoch,
            partition_epoch: self.role.partition_epoch,
            new_isr,
            new_isr_epochs,
        })
    }

    /// The controller took the change asked at `asked`: the role to apply
    /// (through `apply_role`, which ignores it if a newer one arrived first),
    /// if this replica still leads at that epoch.
    pub fn isr_changed(
        &mut self,
        asked: LeaderEpoch,
        isr: Vec<BrokerId>,
        partition_epoch: PartitionEpoch,
    ) -> Option<Role> {
        self.alter_isr_in_flight = false;
        self.leads_at(asked).then(|| Role {
            isr,
            partition_epoch,
            ..self.role.clone()
        })
    }

    /// The change failed or was refused; another may be asked for.
    pub fn isr_change_failed(&mut self) {
        self.alter_isr_in_flight = false;
    }

    /// Whether an acks=all write of `[.., end)` appended at `leader_epoch`
    /// may be answered, with the high watermark at `high_watermark`.
    pub fn ack(
        &self,
        leader_epoch: LeaderEpoch,
        high_watermark: Offset,
        end: Offset,
    ) -> AckDecision {
        ack::decide(AckView {
            leads_at_append_epoch: self.leads_at(leader_epoch),
            high_watermark,
            batch_end: end,
            isr_len: self.role.isr.len(),
            min_insync: self.role.min_insync,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::role::tests::role;
    use super::*;

    fn o(offset: i64) -> Offset {
        Offset(offset)
    }

    #[test]
    fn a_leadership_starts_its_epoch_and_a_demotion_fails_its_writes() {
        let mut core = ReplicaCore::new(
            BrokerId(1),
            &role(false, 0, 0, &[1, 2]),
            EpochHistory::default(),
        );
        let applied = core
            .apply_role(role(true, 3, 4, &[1, 2]), o(10), o(8), 0)
            .unwrap();
        assert!(applied.new_leadership && applied.epochs_changed && !applied.demoted);
        assert_eq!(core.epochs().start_of(LeaderEpoch(3)), Some(o(10)));
        assert!(
            !core.high_watermark_established(o(8)),
            "records [8, 10) came from the old leader: not yet known committed"
        );
        assert!(core.high_watermark_established(o(10)));
        assert_eq!(
            core.apply_role(role(true, 3, 4, &[1, 2]), o(10), o(8), 0),
            None
        );
        // Appended [10, 12) at epoch 3; the follower has fetched past it.
        let fetch = FollowerFetch {
            broker_id: BrokerId(2),
            broker_epoch: BrokerEpoch(5),
            current_leader_epoch: LeaderEpoch(3),
            last_fetched_epoch: LeaderEpoch(3),
        };
        assert_eq!(
            core.follower_fetch(&fetch, o(12), o(12), Some(BrokerEpoch(5)), 1),
            FollowerFetchVerdict::Serve
        );
        assert_eq!(core.high_watermark(o(8), o(12)), Some(o(12)));
        assert_eq!(
            core.ack(LeaderEpoch(3), o(12), o(12)),
            AckDecision::Committed
        );
        let applied = core
            .apply_role(role(false, 4, 5, &[2]), o(12), o(12), 2)
            .unwrap();
        assert!(applied.demoted);
        assert_eq!(
            core.ack(LeaderEpoch(3), o(12), o(12)),
            AckDecision::NotLeader
        );
        assert_eq!(
            core.high_watermark(o(12), o(12)),
            None,
            "followers keep no leader state"
        );
    }

    #[test]
    fn a_zombie_incarnation_is_refused_and_isr_changes_go_one_at_a_time() {
        let mut core = ReplicaCore::new(
            BrokerId(1),
            &role(false, 0, 0, &[1, 2]),
            EpochHistory::default(),
        );
        core.apply_role(role(true, 1, 1, &[1, 2]), o(0), o(0), 0)
            .unwrap();
        let fetch = FollowerFetch {
            broker_id: BrokerId(2),
            broker_epoch: BrokerEpoch(5),
            current_leader_epoch: LeaderEpoch(1),
            last_fetched_epoch: LeaderEpoch::NONE,
        };
        assert!(matches!(
            core.follower_fetch(&fetch, o(0), o(0), Some(BrokerEpoch(7)), 0),
            FollowerFetchVerdict::Refuse(ErrorCode::NotLeaderOrFollower, _)
        ));
        // Follower 2 never fetches: after the lag bound it leaves the ISR.
        let change = core
            .isr_change(5_000, 1_000, BrokerEpoch(9), &Default::default())
            .expect("shrink");
        assert_eq!(change.new_isr, vec![BrokerId(1)]);
        assert_eq!(change.new_isr_epochs, vec![BrokerEpoch(9)]);
        assert_eq!(
            core.isr_change(5_001, 1_000, BrokerEpoch(9), &Default::default()),
            None,
            "one on its way"
        );
        let next = core
            .isr_changed(LeaderEpoch(1), vec![BrokerId(1)], PartitionEpoch(2))
            .unwrap();
        assert!(core.apply_role(next, o(0), o(0), 5_002).is_some());
        assert_eq!(core.role().isr, vec![BrokerId(1)]);
        assert_eq!(
            core.isr_changed(LeaderEpoch(0), vec![], PartitionEpoch(3)),
            None
        );
    }
}
