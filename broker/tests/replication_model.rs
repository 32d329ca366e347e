//! The follower truncation protocol against a simulated history of leader
//! changes: replicas append as leaders, leadership moves to any replica with
//! a new epoch, and a follower syncs with the leader through the functions
//! the broker runs (`replication::leader::check_follower_fetch` on the
//! leader, `replication::follower::decide` on the follower: last fetched
//! epoch → the leader's end of that epoch → cut → copy). After every sync the follower holds exactly the leader's records,
//! compared by record identity, not just by epochs, and it never cut a
//! record it shared with the leader.

use broker::replication::epochs::EpochHistory;
use broker::replication::follower::{decide, FollowerAction, LeaderAnswer};
use broker::replication::leader::{check_follower_fetch, FollowerFetch, FollowerFetchCheck};
use proptest::prelude::*;
use protocol::{BrokerId, ErrorCode, LeaderEpoch, Offset};

#[derive(Clone, Debug, Default)]
struct Replica {
    /// (epoch, record id) per offset.
    log: Vec<(i32, u64)>,
    history: EpochHistory,
}

impl Replica {
    fn end(&self) -> Offset {
        Offset(self.log.len() as i64)
    }

    fn append(&mut self, epoch: i32, id: u64) {
        let offset = self.end();
        self.history.assign(LeaderEpoch(epoch), offset);
        self.log.push((epoch, id));
    }

    fn truncate(&mut self, offset: Offset) {
        self.log.truncate(offset.0 as usize);
        self.history.truncate_to(offset);
    }
}

/// Replica fetches until the follower matches the leader, each decided by
/// the code the broker runs: the leader's `check_follower_fetch`, then the
/// follower's `decide` on the answer. Returns the shortest the follower's log
/// got on the way.
fn sync(follower: &mut Replica, leader: &Replica, leader_epoch: i32) -> usize {
    let mut shortest = follower.log.len();
    let mut rounds = 0;
    loop {
        rounds += 1;
        assert!(rounds < 64, "sync does not converge");
        let fetch_offset = follower.end();
        let fetch = FollowerFetch {
            broker_id: BrokerId(2),
            broker_epoch: protocol::BrokerEpoch(1),
            current_leader_epoch: LeaderEpoch(leader_epoch),
            last_fetched_epoch: follower.history.latest_epoch().unwrap_or(LeaderEpoch::NONE),
        };
        let mut answer = LeaderAnswer {
            error: ErrorCode::None,
            high_watermark: Offset::ZERO,
            log_start_offset: Offset::ZERO,
            log_end_offset: Some(leader.end()),
            diverging: None,
        };
        match check_follower_fetch(
            LeaderEpoch(leader_epoch),
            &fetch,
            fetch_offset,
            &leader.history,
            leader.end(),
        ) {
            FollowerFetchCheck::Refuse(code, why) => {
                panic!("refused at its own epoch: {code:?} {why}")
            }
            FollowerFetchCheck::Diverging { epoch, end_offset } => {
                answer.diverging = Some((epoch, end_offset));
            }
            // The leader's read: past its end is out of range.
            FollowerFetchCheck::Serve if fetch_offset > leader.end() => {
                answer.error = ErrorCode::OffsetOutOfRange;
            }
            FollowerFetchCheck::Serve => {}
        }
        match decide(&answer, follower.end(), &follower.history) {
            FollowerAction::Truncate(cut) => {
                assert!(cut <= follower.end(), "a cut never extends the log");
                follower.truncate(cut);
                shortest = shortest.min(follower.log.len());
            }
            FollowerAction::Append => {
                assert!(
                    fetch_offset <= leader.end(),
                    "a follower past the leader's end must have been found diverging"
                );
                for &(epoch, id) in &leader.log[fetch_offset.0 as usize..] {
                    follower.append(epoch, id);
                }
                return shortest;
            }
            other => panic!("unexpected follower action {other:?} at {fetch_offset}"),
        }
    }
}

#[derive(Clone, Debug)]
enum Step {
    Append(u8),
    Elect(u8),
    Sync(u8),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (1u8..6).prop_map(Step::Append),
        2 => (0u8..3).prop_map(Step::Elect),
        3 => (0u8..3).prop_map(Step::Sync),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn followers_converge_on_the_leader_log(steps in proptest::collection::vec(step(), 1..60)) {
        let mut replicas = vec![Replica::default(); 3];
        let mut leader = 0usize;
        let mut epoch = 0i32;
        let mut next_id = 0u64;
        replicas[0].history.assign(LeaderEpoch(epoch), Offset::ZERO);
        for step in steps {
            match step {
                Step::Append(count) => {
                    for _ in 0..count {
                        replicas[leader].append(epoch, next_id);
                        next_id += 1;
                    }
                }
                Step::Elect(r) => {
                    // Any replica, as an unclean election could pick: the
                    // protocol must still converge on the new leader's log.
                    leader = r as usize;
                    epoch += 1;
                    let end = replicas[leader].end();
                    replicas[leader].history.assign(LeaderEpoch(epoch), end);
                }
                Step::Sync(r) => {
                    let r = r as usize;
                    if r == leader {
                        continue;
                    }
                    let leader_copy = replicas[leader].clone();
                    // The true common prefix, which the cut must not go below.
                    let common = replicas[r]
                        .log
                        .iter()
                        .zip(&leader_copy.log)
                        .take_while(|(a, b)| a == b)
                        .count();
                    let shortest = sync(&mut replicas[r], &leader_copy, epoch);
                    prop_assert_eq!(&replicas[r].log, &leader_copy.log);
                    // Records both had were never cut and fetched again.
                    prop_assert!(shortest >= common, "cut to {} below the common prefix {}", shortest, common);
                }
            }
        }
    }
}
