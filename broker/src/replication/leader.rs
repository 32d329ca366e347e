//! A partition leader's view of its followers: whether a follower's fetch may
//! be served (or where its log diverges), how far each follower has fetched
//! (by broker epoch, so a restarted follower starts over), when each was last
//! caught up, the high watermark that follows from the ISR, and which ISR
//! change to ask the controller for. Pure: time comes in as milliseconds,
//! nothing here does I/O.
//!
//! A follower fetches from its log end only once everything below it is
//! stable on its disk (see `fetcher`), and the leader counts its own records
//! only up to its own stable offset; so the high watermark, the minimum over
//! the ISR, passes a record only once every in-sync replica holds it stably.

use std::collections::{BTreeMap, BTreeSet};

use protocol::{BrokerEpoch, BrokerId, ErrorCode, LeaderEpoch, Offset};

use super::epochs::EpochHistory;

/// What a follower says about itself when it fetches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FollowerFetch {
    pub broker_id: BrokerId,
    /// The follower's registration with the controller;
    /// `BrokerEpoch::UNKNOWN` when it does not say.
    pub broker_epoch: BrokerEpoch,
    pub current_leader_epoch: LeaderEpoch,
    /// The epoch of the follower's last batch; -1 when its log is empty.
    pub last_fetched_epoch: LeaderEpoch,
}

/// The leader's answer to a follower's fetch, before any record is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FollowerFetchCheck {
    Serve,
    Refuse(ErrorCode, String),
    /// The follower's log parts from the leader's: epoch `epoch` ends at
    /// `end_offset` here, and the follower cuts its log there first.
    Diverging {
        epoch: LeaderEpoch,
        end_offset: Offset,
    },
}

/// Whether a follower's fetch at `offset` may be served by this leader at
/// `leader_epoch` whose log ends at `log_end` with epoch history `epochs`.
pub fn check_follower_fetch(
    leader_epoch: LeaderEpoch,
    fetch: &FollowerFetch,
    offset: Offset,
    epochs: &EpochHistory,
    log_end: Offset,
) -> FollowerFetchCheck {
    if fetch.current_leader_epoch != leader_epoch {
        let code = if fetch.current_leader_epoch < leader_epoch {
            ErrorCode::StaleLeaderEpoch
        } else {
            ErrorCode::NotLeaderOrFollower
        };
        return FollowerFetchCheck::Refuse(
            code,
            format!(
                "follower at leader epoch {}, leader at {leader_epoch}",
                fetch.current_leader_epoch
            ),
        );
    }
    if fetch.last_fetched_epoch >= LeaderEpoch(0) {
        let (epoch, epoch_end) = epochs.end_offset_for(fetch.last_fetched_epoch, log_end);
        if epoch_end < offset || epoch < fetch.last_fetched_epoch {
            return FollowerFetchCheck::Diverging {
                epoch,
                end_offset: epoch_end,
            };
        }
    }
    FollowerFetchCheck::Serve
}

/// How a leader took a follower's fetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FetchAccepted {
    Accepted,
    /// Not a replica of the partition.
    NotReplica,
    /// From an older incarnation of the follower than one already seen.
    StaleBrokerEpoch,
}

/// One follower as its fetches show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Progress {
    /// The broker epoch of the incarnation whose fetches these are; `None`
    /// until it fetches from this leadership.
    broker_epoch: Option<BrokerEpoch>,
    /// Every offset below this is stable on the follower. `None` until its
    /// current incarnation fetches from this leadership.
    log_end: Option<Offset>,
    /// The leader's log end when this follower last fetched.
    leader_end_at_last_fetch: Offset,
    /// Last time the follower had everything the leader had at its previous
    /// fetch.
    caught_up_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderState {
    me: BrokerId,
    followers: BTreeMap<BrokerId, Progress>,
    high_watermark: Offset,
}

impl LeaderState {
    /// A new leadership over `replicas` (this broker included), starting with
    /// the high watermark this replica knew. Every follower counts as caught
    /// up now, so none is dropped from the ISR before it could fetch.
    pub fn new(
        me: BrokerId,
        replicas: &[BrokerId],
        high_watermark: Offset,
        now_ms: u64,
    ) -> LeaderState {
        let followers = replicas
            .iter()
            .filter(|&&r| r != me)
            .map(|&r| {
                (
                    r,
                    Progress {
                        broker_epoch: None,
                        log_end: None,
                        leader_end_at_last_fetch: Offset::ZERO,
                        caught_up_ms: now_ms,
                    },
                )
            })
            .collect();
        LeaderState {
            me,
            followers,
            high_watermark,
        }
    }

    pub fn high_watermark(&self) -> Offset {
        self.high_watermark
    }

    pub fn follower_log_end(&self, follower: BrokerId) -> Option<Offset> {
        self.followers.get(&follower).and_then(|p| p.log_end)
    }

    /// A fetch by `follower` (its incarnation `broker_epoch`) at
    /// `fetch_offset` while the leader's log ends at `leader_end`. A newer
    /// incarnation starts over: what the old one had fetched may not have
    /// survived its restart.
    pub fn on_fetch(
        &mut self,
        follower: BrokerId,
        broker_epoch: BrokerEpoch,
        fetch_offset: Offset,
        leader_end: Offset,
        now_ms: u64,
    ) -> FetchAccepted {
        let Some(progress) = self.followers.get_mut(&follower) else {
            return FetchAccepted::NotReplica;
        };
        match progress.broker_epoch {
            Some(seen) if broker_epoch < seen => return FetchAccepted::StaleBrokerEpoch,
            Some(seen) if broker_epoch > seen => {
                progress.log_end = None;
                progress.leader_end_at_last_fetch = Offset::ZERO;
            }
            _ => {}
        }
        progress.broker_epoch = Some(broker_epoch);
        if fetch_offset >= leader_end || fetch_offset >= progress.leader_end_at_last_fetch {
            progress.caught_up_ms = now_ms;
        }
        progress.log_end = Some(fetch_offset.min(leader_end));
        progress.leader_end_at_last_fetch = leader_end;
        FetchAccepted::Accepted
    }

    /// The broker epoch `follower` last fetched with in this leadership.
    pub fn follower_broker_epoch(&self, follower: BrokerId) -> Option<BrokerEpoch> {
        self.followers.get(&follower).and_then(|p| p.broker_epoch)
    }

    /// Moves the high watermark to the smallest stable log end among the ISR
    /// (the leader's own, `leader_stable_end`, included), never backwards.
    /// Returns the new value.
    pub fn update_high_watermark(&mut self, isr: &[BrokerId], leader_stable_end: Offset) -> Offset {
        let leader_end = leader_stable_end;
        let mut low = leader_end;
        for member in isr.iter().filter(|&&m| m != self.me) {
            match self.followers.get(member).and_then(|p| p.log_end) {
                Some(end) => low = low.min(end),
                // A member that has not fetched yet holds the watermark.
                None => low = low.min(self.high_watermark),
            }
        }
        // Never below what it was (a new leader starts from the watermark it
        // knew), never above what the ISR holds stably.
        self.high_watermark = self.high_watermark.max(low.min(leader_end));
        self.high_watermark
    }

    /// The ISR to ask for, if it should change: members that have not caught
    /// up within `lag_max_ms` leave; followers that reached the high
    /// watermark (and the start of this leadership's epoch) join. Brokers in
    /// `ineligible` (fenced or unknown in this leader's metadata) neither
    /// stay nor join: the controller refuses an ISR naming one, so asking
    /// for it would also keep every lagging member in (KIP-841).
    pub fn desired_isr(
        &self,
        isr: &[BrokerId],
        epoch_start: Offset,
        now_ms: u64,
        lag_max_ms: u64,
        ineligible: &BTreeSet<BrokerId>,
    ) -> Option<Vec<BrokerId>> {
        let mut next: Vec<BrokerId> =
            isr.iter()
                .copied()
                .filter(|&m| {
                    m == self.me
                        || (!ineligible.contains(&m)
                            && self.followers.get(&m).is_some_and(|p| {
                                now_ms.saturating_sub(p.caught_up_ms) <= lag_max_ms
                            }))
                })
                .collect();
        for (&follower, progress) in &self.followers {
            let caught_up = !ineligible.contains(&follower)
                && now_ms.saturating_sub(progress.caught_up_ms) <= lag_max_ms
                && progress
                    .log_end
                    .is_some_and(|end| end >= self.high_watermark && end >= epoch_start);
            if caught_up && !next.contains(&follower) {
                next.push(follower);
            }
        }
        next.sort_unstable();
        let mut current = isr.to_vec();
        current.sort_unstable();
        (next != current).then_some(next)
    }

    /// The broker epochs to send with an ISR change to `members`: this
    /// broker's own for itself, else the epoch each follower fetched with, or
    /// `BrokerEpoch::UNKNOWN` for one that has not fetched from this
    /// leadership (the controller accepts that only for a member already in
    /// the ISR).
    pub fn member_epochs(
        &self,
        members: &[BrokerId],
        my_broker_epoch: BrokerEpoch,
    ) -> Vec<BrokerEpoch> {
        members
            .iter()
            .map(|&m| {
                if m == self.me {
                    my_broker_epoch
                } else {
                    self.follower_broker_epoch(m)
                        .unwrap_or(BrokerEpoch::UNKNOWN)
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(offset: i64) -> Offset {
        Offset(offset)
    }

    fn b(ids: &[u32]) -> Vec<BrokerId> {
        ids.iter().copied().map(BrokerId).collect()
    }

    #[test]
    fn high_watermark_is_the_isr_minimum_and_never_moves_back() {
        let mut leader = LeaderState::new(BrokerId(1), &b(&[1, 2, 3]), o(0), 0);
        let isr = b(&[1, 2, 3]);
        // Followers have not fetched: nothing is committed past the start.
        assert_eq!(leader.update_high_watermark(&isr, o(10)), o(0));
        leader.on_fetch(BrokerId(2), BrokerEpoch(1), o(10), o(10), 5);
        assert_eq!(
            leader.update_high_watermark(&isr, o(10)),
            o(0),
            "3 holds it"
        );
        leader.on_fetch(BrokerId(3), BrokerEpoch(1), o(7), o(10), 5);
        assert_eq!(leader.update_high_watermark(&isr, o(10)), o(7));
        // Without 3 in the ISR the watermark follows 2 and the leader.
        assert_eq!(leader.update_high_watermark(&b(&[1, 2]), o(10)), o(10));
        // Adding 3 back does not move it backwards.
        assert_eq!(leader.update_high_watermark(&isr, o(12)), o(10));
        // Alone, the leader's log end is the watermark.
        assert_eq!(leader.update_high_watermark(&b(&[1]), o(15)), o(15));
        // A fetch by a non-replica is not counted.
        assert_eq!(
            leader.on_fetch(BrokerId(9), BrokerEpoch(1), o(100), o(15), 6),
            FetchAccepted::NotReplica
        );
    }

    #[test]
    fn isr_shrinks_on_lag_and_grows_on_catch_up() {
        let lag_max_ms = 1_000;
        let mut leader = LeaderState::new(BrokerId(1), &b(&[1, 2, 3]), o(0), 0);
        let isr = b(&[1, 2, 3]);
        leader.on_fetch(BrokerId(2), BrokerEpoch(1), o(0), o(0), 100);
        leader.on_fetch(BrokerId(3), BrokerEpoch(1), o(0), o(0), 100);
        assert_eq!(
            leader.desired_isr(&isr, o(0), 900, lag_max_ms, &BTreeSet::new()),
            None
        );
        // 2 keeps fetching and keeps up while the leader appends; 3 stops.
        for t in 1..20u64 {
            let leader_end = (t * 10) as i64;
            leader.on_fetch(
                BrokerId(2),
                BrokerEpoch(1),
                o(leader_end - 10),
                o(leader_end),
                100 + t * 100,
            );
        }
        assert_eq!(
            leader.desired_isr(&isr, o(0), 2_000, lag_max_ms, &BTreeSet::new()),
            Some(b(&[1, 2])),
            "3 lagged past the bound; 2 never did although never at the very end"
        );
        let isr = b(&[1, 2]);
        leader.update_high_watermark(&isr, o(190));
        // 3 returns but is behind the high watermark: not yet.
        leader.on_fetch(BrokerId(3), BrokerEpoch(1), o(50), o(190), 2_100);
        assert_eq!(
            leader.desired_isr(&isr, o(0), 2_100, lag_max_ms, &BTreeSet::new()),
            None
        );
        leader.on_fetch(BrokerId(3), BrokerEpoch(1), o(190), o(190), 2_200);
        assert_eq!(
            leader.desired_isr(&isr, o(0), 2_200, lag_max_ms, &BTreeSet::new()),
            Some(b(&[1, 2, 3]))
        );
        // Not before it reached the start of this leader's epoch.
        assert_eq!(
            leader.desired_isr(&isr, o(500), 2_200, lag_max_ms, &BTreeSet::new()),
            None
        );
    }

    /// KIP-841: a fenced follower, even caught up, neither joins nor stays,
    /// so the change that drops a lagging member is one the controller
    /// takes.
    #[test]
    fn a_fenced_follower_neither_joins_nor_holds_back_a_shrink() {
        let lag_max_ms = 1_000;
        let mut leader = LeaderState::new(BrokerId(1), &b(&[1, 2, 3]), o(0), 0);
        let isr = b(&[1, 2]);
        // 3 keeps fetching and is caught up, but fenced; 2 stopped.
        for t in 1..20u64 {
            leader.on_fetch(BrokerId(3), BrokerEpoch(1), o(0), o(0), t * 100);
        }
        let fenced = BTreeSet::from([BrokerId(3)]);
        assert_eq!(
            leader.desired_isr(&isr, o(0), 2_000, lag_max_ms, &fenced),
            Some(b(&[1])),
            "2 leaves; 3 does not join while fenced"
        );
        assert_eq!(
            leader.desired_isr(&isr, o(0), 2_000, lag_max_ms, &BTreeSet::new()),
            Some(b(&[1, 3])),
            "unfenced, 3 joins"
        );
        assert_eq!(
            leader.desired_isr(&b(&[1, 3]), o(0), 2_000, lag_max_ms, &fenced),
            Some(b(&[1])),
            "a member fenced since leaves too"
        );
    }

    /// KIP-903: a follower that restarted (a new broker epoch) starts over;
    /// its earlier progress neither holds a place in the ISR nor lets it
    /// rejoin, and fetches from its old incarnation are refused.
    #[test]
    fn a_restarted_follower_starts_over() {
        let lag_max_ms = 1_000;
        let mut leader = LeaderState::new(BrokerId(1), &b(&[1, 2]), o(0), 0);
        leader.on_fetch(BrokerId(2), BrokerEpoch(7), o(100), o(100), 10);
        assert_eq!(leader.update_high_watermark(&b(&[1, 2]), o(100)), o(100));
        // 2 left the ISR (say it was fenced), then restarted with epoch 9.
        assert_eq!(
            leader.desired_isr(&b(&[1]), o(0), 20, lag_max_ms, &BTreeSet::new()),
            Some(b(&[1, 2])),
            "caught up before the restart"
        );
        assert_eq!(
            leader.on_fetch(BrokerId(2), BrokerEpoch(9), o(40), o(100), 30),
            FetchAccepted::Accepted
        );
        assert_eq!(
            leader.desired_isr(&b(&[1]), o(0), 40, lag_max_ms, &BTreeSet::new()),
            None,
            "its new incarnation is behind the high watermark"
        );
        assert_eq!(
            leader.on_fetch(BrokerId(2), BrokerEpoch(7), o(100), o(100), 50),
            FetchAccepted::StaleBrokerEpoch,
            "the old incarnation cannot speak for it"
        );
        assert_eq!(leader.follower_log_end(BrokerId(2)), Some(o(40)));
        leader.on_fetch(BrokerId(2), BrokerEpoch(9), o(100), o(100), 60);
        assert_eq!(
            leader.desired_isr(&b(&[1]), o(0), 60, lag_max_ms, &BTreeSet::new()),
            Some(b(&[1, 2]))
        );
        assert_eq!(
            leader.member_epochs(&b(&[1, 2]), BrokerEpoch(5)),
            vec![BrokerEpoch(5), BrokerEpoch(9)]
        );
    }

    #[test]
    fn follower_fetches_are_checked_against_the_leadership_and_the_epochs() {
        let epochs =
            EpochHistory::from_entries(vec![(LeaderEpoch(1), o(0)), (LeaderEpoch(3), o(10))]);
        let fetch = FollowerFetch {
            broker_id: BrokerId(2),
            broker_epoch: BrokerEpoch(5),
            current_leader_epoch: LeaderEpoch(3),
            last_fetched_epoch: LeaderEpoch(3),
        };
        assert_eq!(
            check_follower_fetch(LeaderEpoch(3), &fetch, o(12), &epochs, o(20)),
            FollowerFetchCheck::Serve
        );
        assert!(matches!(
            check_follower_fetch(LeaderEpoch(4), &fetch, o(12), &epochs, o(20)),
            FollowerFetchCheck::Refuse(ErrorCode::StaleLeaderEpoch, _)
        ));
        assert!(matches!(
            check_follower_fetch(LeaderEpoch(2), &fetch, o(12), &epochs, o(20)),
            FollowerFetchCheck::Refuse(ErrorCode::NotLeaderOrFollower, _)
        ));
        // Wrote epoch 1 past where the leader's epoch 1 ended.
        let behind = FollowerFetch {
            last_fetched_epoch: LeaderEpoch(1),
            ..fetch
        };
        assert_eq!(
            check_follower_fetch(LeaderEpoch(3), &behind, o(14), &epochs, o(20)),
            FollowerFetchCheck::Diverging {
                epoch: LeaderEpoch(1),
                end_offset: o(10)
            }
        );
        // An epoch the leader never had.
        let unknown = FollowerFetch {
            last_fetched_epoch: LeaderEpoch(2),
            ..fetch
        };
        assert_eq!(
            check_follower_fetch(LeaderEpoch(3), &unknown, o(11), &epochs, o(20)),
            FollowerFetchCheck::Diverging {
                epoch: LeaderEpoch(1),
                end_offset: o(10)
            }
        );
    }
}
