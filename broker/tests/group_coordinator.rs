//! The group coordinator's state machine without a broker: scenarios of
//! incremental rebalancing, fencing, static membership and offsets, and a
//! property test that drives it with clients that join, heartbeat, revoke
//! late, crash, stall, commit and see coordinator failovers (a reload from
//! the records written, compacted or not).

use std::collections::{BTreeMap, BTreeSet};

use broker::group::coordinator::{
    CommitRequest, CoordinatorConfig, GroupCoordinator, GroupError, GroupState, HeartbeatRequest,
    Now,
};
use broker::group::records::GroupRecord;
use broker::group::{MemberEpoch, TopicPartition};
use proptest::prelude::*;

fn now(ms: u64) -> Now {
    Now {
        monotonic_ms: ms,
        wall_ms: 1_700_000_000_000 + ms as i64,
    }
}

fn hb(member: &str, epoch: i32, owned: &BTreeSet<TopicPartition>) -> HeartbeatRequest {
    HeartbeatRequest {
        group_id: "g".into(),
        member_id: member.into(),
        member_epoch: MemberEpoch(epoch),
        instance_id: None,
        client_id: "c".into(),
        client_host: "127.0.0.1".into(),
        session_timeout_ms: 3_000,
        rebalance_timeout_ms: 10_000,
        subscribed_topics: Some(vec!["t".into()]),
        assignor: None,
        owned: Some(owned.iter().cloned().collect()),
    }
}

fn topics(n: u32) -> BTreeMap<String, u32> {
    [("t".to_string(), n)].into()
}

/// A well-behaved client: takes what it is given, gives up what is revoked.
struct Client {
    id: String,
    epoch: i32,
    owned: BTreeSet<TopicPartition>,
}

impl Client {
    fn new(id: &str) -> Client {
        Client {
            id: id.into(),
            epoch: 0,
            owned: BTreeSet::new(),
        }
    }

    fn beat(
        &mut self,
        c: &mut GroupCoordinator,
        at: u64,
        log: &mut Vec<GroupRecord>,
    ) -> Result<(), GroupError> {
        let w = c.heartbeat(&hb(&self.id, self.epoch, &self.owned), now(at));
        log.extend(w.records);
        c.check_invariants();
        let r = w.response?;
        self.epoch = r.member_epoch.0;
        self.owned = r.assignment;
        Ok(())
    }
}

fn settle(c: &mut GroupCoordinator, clients: &mut [Client], at: u64, log: &mut Vec<GroupRecord>) {
    for _ in 0..4 {
        for client in clients.iter_mut() {
            client.beat(c, at, log).unwrap();
        }
    }
}

#[test]
fn three_members_split_twelve_partitions_and_a_fourth_moves_only_three() {
    let mut c = GroupCoordinator::new(CoordinatorConfig::default(), topics(12));
    let mut log = Vec::new();
    let mut clients: Vec<Client> = ["a", "b", "c"].iter().map(|id| Client::new(id)).collect();
    settle(&mut c, &mut clients, 0, &mut log);
    assert_eq!(
        clients.iter().map(|x| x.owned.len()).collect::<Vec<_>>(),
        vec![4, 4, 4]
    );
    assert_eq!(c.describe_group("g").unwrap().state, GroupState::Stable);

    let before: Vec<BTreeSet<TopicPartition>> = clients.iter().map(|x| x.owned.clone()).collect();
    clients.push(Client::new("d"));
    // The newcomer joins: it gets nothing the others still hold.
    clients[3].beat(&mut c, 10, &mut log).unwrap();
    assert!(clients[3].owned.is_empty());
    // Each old member is told to give up one partition and keeps the rest.
    for i in 0..3 {
        clients[i].beat(&mut c, 20, &mut log).unwrap();
        assert_eq!(clients[i].owned.len(), 3);
        assert!(clients[i].owned.is_subset(&before[i]));
    }
    settle(&mut c, &mut clients, 30, &mut log);
    assert_eq!(
        clients.iter().map(|x| x.owned.len()).collect::<Vec<_>>(),
        vec![3, 3, 3, 3]
    );
    for i in 0..3 {
        assert!(
            clients[i].owned.is_subset(&before[i]),
            "member {i} gained a partition"
        );
    }
    let d = c.describe_group("g").unwrap();
    assert_eq!(d.state, GroupState::Stable);
    assert!(d
        .members
        .iter()
        .all(|m| m.member_epoch.0 == d.group_epoch.0));
}

#[test]
fn a_partition_waits_until_its_old_owner_revokes_it() {
    let mut c = GroupCoordinator::new(CoordinatorConfig::default(), topics(2));
    let mut log = Vec::new();
    let mut a = Client::new("a");
    a.beat(&mut c, 0, &mut log).unwrap();
    assert_eq!(a.owned.len(), 2);
    let mut b = Client::new("b");
    b.beat(&mut c, 1, &mut log).unwrap();
    assert!(b.owned.is_empty(), "b must wait for a to revoke");
    // a keeps reporting both partitions: still pending, b still waits.
    let w = c.heartbeat(&hb("a", a.epoch, &a.owned), now(2));
    let kept = w.response.unwrap().assignment;
    assert_eq!(kept.len(), 1);
    b.beat(&mut c, 3, &mut log).unwrap();
    assert!(b.owned.is_empty());
    // a confirms (reports only what it kept): b gets the freed partition.
    a.owned = kept;
    a.beat(&mut c, 4, &mut log).unwrap();
    b.beat(&mut c, 5, &mut log).unwrap();
    assert_eq!(b.owned.len(), 1);
    assert!(a.owned.is_disjoint(&b.owned));
}

#[test]
fn expired_sessions_and_stalled_revocations_remove_the_member() {
    let mut c = GroupCoordinator::new(CoordinatorConfig::default(), topics(4));
    let mut log = Vec::new();
    let mut clients = vec![Client::new("a"), Client::new("b")];
    settle(&mut c, &mut clients, 0, &mut log);
    // b stops heartbeating; after its session (3 s) a gets everything.
    clients[0].beat(&mut c, 2_000, &mut log).unwrap();
    assert!(c.tick(now(2_999)).is_empty());
    log.extend(c.tick(now(3_000)));
    assert_eq!(c.describe_group("g").unwrap().members.len(), 1);
    c.check_invariants();
    clients.truncate(1);
    settle(&mut c, &mut clients, 3_001, &mut log);
    assert_eq!(clients[0].owned.len(), 4);
    // The stalled member comes back: fenced, it cannot commit either.
    let w = c.heartbeat(&hb("b", 1, &BTreeSet::new()), now(3_002));
    assert!(matches!(w.response, Err(GroupError::UnknownMemberId(_))));
    let commit = CommitRequest {
        group_id: "g".into(),
        member_id: "b".into(),
        member_epoch: MemberEpoch(2),
        offsets: vec![(TopicPartition::new("t", 0), 5, String::new())],
    };
    assert!(matches!(
        c.commit(&commit, now(3_003)).response,
        Err(GroupError::UnknownMemberId(_))
    ));

    // A member that never gives up a revoked partition is fenced after its
    // rebalance timeout (10 s); keep its session alive meanwhile.
    let mut b = Client::new("b2");
    b.beat(&mut c, 4_000, &mut log).unwrap();
    let stubborn = clients[0].owned.clone();
    let w = c.heartbeat(&hb("a", clients[0].epoch, &stubborn), now(4_001));
    assert_eq!(w.response.unwrap().assignment.len(), 2);
    let mut t = 4_001;
    while t < 14_001 {
        t += 1_000;
        c.heartbeat(&hb("a", clients[0].epoch, &stubborn), now(t))
            .response
            .unwrap();
        b.beat(&mut c, t, &mut log).unwrap();
        log.extend(c.tick(now(t)));
    }
    assert!(c
        .describe_group("g")
        .unwrap()
        .members
        .iter()
        .all(|m| m.member_id == "b2"));
    b.beat(&mut c, t + 1, &mut log).unwrap();
    assert_eq!(b.owned.len(), 4);
}

#[test]
fn stale_epochs_are_fenced_and_commits_checked() {
    let mut c = GroupCoordinator::new(CoordinatorConfig::default(), topics(2));
    let mut log = Vec::new();
    let mut a = Client::new("a");
    a.beat(&mut c, 0, &mut log).unwrap();
    let w = c.heartbeat(&hb("a", a.epoch + 5, &a.owned), now(1));
    assert!(matches!(
        w.response,
        Err(GroupError::FencedMemberEpoch { .. })
    ));
    let mut commit = CommitRequest {
        group_id: "g".into(),
        member_id: "a".into(),
        member_epoch: MemberEpoch(a.epoch),
        offsets: vec![(TopicPartition::new("t", 1), 7, "m".into())],
    };
    assert!(c.commit(&commit, now(2)).response.is_ok());
    let fetched = c.fetch_offsets("g", None).unwrap();
    assert_eq!(fetched[0].1.as_ref().unwrap().offset, 7);
    // Unknown partitions and tool commits on a group with members are refused.
    commit.offsets[0].0 = TopicPartition::new("t", 9);
    assert!(matches!(
        c.commit(&commit, now(3)).response,
        Err(GroupError::UnknownTopicOrPartition(_))
    ));
    let tool = CommitRequest {
        group_id: "g".into(),
        member_id: String::new(),
        member_epoch: MemberEpoch::LEAVE,
        offsets: vec![(TopicPartition::new("t", 0), 0, String::new())],
    };
    assert!(matches!(
        c.commit(&tool, now(4)).response,
        Err(GroupError::NonEmptyGroup(_))
    ));
    assert!(matches!(
        c.delete_group("g", now(5)).response,
        Err(GroupError::NonEmptyGroup(_))
    ));
    // Once empty, tools may reset offsets and delete the group.
    log.extend(c.heartbeat(&hb("a", a.epoch, &a.owned), now(6)).records);
    let leave = c.heartbeat(&hb("a", -1, &BTreeSet::new()), now(7));
    assert_eq!(leave.response.unwrap().member_epoch, MemberEpoch::LEAVE);
    assert_eq!(c.describe_group("g").unwrap().state, GroupState::Empty);
    assert!(c.commit(&tool, now(8)).response.is_ok());
    assert!(c.delete_group("g", now(9)).response.is_ok());
    assert!(matches!(
        c.describe_group("g"),
        Err(GroupError::GroupIdNotFound(_))
    ));
}

#[test]
fn a_static_member_that_restarts_gets_its_partitions_back_without_a_rebalance_and_a_live_one_keeps_them(
) {
    let mut c = GroupCoordinator::new(CoordinatorConfig::default(), topics(4));
    let mut log = Vec::new();
    let static_hb = |member: &str, epoch: i32, owned: &BTreeSet<TopicPartition>| {
        let mut r = hb(member, epoch, owned);
        r.instance_id = Some("host-1".into());
        r
    };
    let mut b = Client::new("b");
    let first = c
        .heartbeat(&static_hb("a1", 0, &BTreeSet::new()), now(0))
        .response
        .unwrap();
    b.beat(&mut c, 1, &mut log).unwrap();
    let mut a_owned = first.assignment;
    let mut a_epoch = first.member_epoch.0;
    for t in 2..6 {
        let r = c
            .heartbeat(&static_hb("a1", a_epoch, &a_owned), now(t))
            .response
            .unwrap();
        a_owned = r.assignment;
        a_epoch = r.member_epoch.0;
        b.beat(&mut c, t, &mut log).unwrap();
    }
    assert_eq!(a_owned.len(), 2);
    let epoch_before = c.describe_group("g").unwrap().group_epoch;
    // A temporary leave (-2) keeps the partitions; the restarted instance
    // (new member id, same instance id) takes them over at once.
    c.heartbeat(&static_hb("a1", -2, &a_owned), now(10))
        .response
        .unwrap();
    let back = c
        .heartbeat(&static_hb("a2", 0, &BTreeSet::new()), now(11))
        .response
        .unwrap();
    assert_eq!(back.assignment, a_owned);
    assert_eq!(c.describe_group("g").unwrap().group_epoch, epoch_before);
    // A live member keeps its instance id: a second process claiming it is
    // refused until the first leaves or its session ends.
    let refused = c.heartbeat(&static_hb("a3", 0, &BTreeSet::new()), now(12));
    assert!(matches!(
        refused.response,
        Err(GroupError::UnreleasedInstanceId(_))
    ));
    // Its session ends (3 s): the newcomer joins as a new member.
    let mut t = 12;
    while c
        .describe_group("g")
        .unwrap()
        .members
        .iter()
        .any(|m| m.member_id == "a2")
    {
        t += 500;
        b.beat(&mut c, t, &mut log).unwrap();
        log.extend(c.tick(now(t)));
    }
    c.heartbeat(&static_hb("a3", 0, &BTreeSet::new()), now(t + 1))
        .response
        .unwrap();
    c.check_invariants();
}

#[test]
fn deleted_topics_take_their_offsets_and_grown_topics_rebalance() {
    let mut c = GroupCoordinator::new(CoordinatorConfig::default(), topics(2));
    let mut log = Vec::new();
    let mut a = Client::new("a");
    settle(&mut c, std::slice::from_mut(&mut a), 0, &mut log);
    let commit = CommitRequest {
        group_id: "g".into(),
        member_id: "a".into(),
        member_epoch: MemberEpoch(a.epoch),
        offsets: vec![(TopicPartition::new("t", 0), 3, String::new())],
    };
    c.commit(&commit, now(1)).response.unwrap();
    c.set_topics(topics(3), now(2));
    a.beat(&mut c, 3, &mut log).unwrap();
    assert_eq!(a.owned.len(), 3);
    c.set_topics(BTreeMap::new(), now(4));
    assert!(c.fetch_offsets("g", None).unwrap().is_empty());
}

#[test]
fn offsets_of_empty_groups_expire() {
    let config = CoordinatorConfig {
        offsets_retention_ms: 1_000,
    };
    let mut c = GroupCoordinator::new(config, topics(1));
    let tool = CommitRequest {
        group_id: "g".into(),
        member_id: String::new(),
        member_epoch: MemberEpoch::LEAVE,
        offsets: vec![(TopicPartition::new("t", 0), 4, String::new())],
    };
    c.commit(&tool, now(0)).response.unwrap();
    assert!(c.tick(now(999)).is_empty());
    assert!(!c.tick(now(1_000)).is_empty());
    assert_eq!(c.group_count(), 0);
}

#[test]
fn transactional_offsets_apply_at_the_commit_marker_only() {
    // Proves offsets committed inside a transaction are invisible until the
    // commit marker, vanish at an abort marker, are checked as a plain
    // commit is, and that a coordinator replaying the same records and
    // markers (a reload) ends in the same state.
    let config = CoordinatorConfig {
        offsets_retention_ms: 3_600_000,
    };
    let mut c = GroupCoordinator::new(config.clone(), topics(2));
    let offsets = |offset: i64| CommitRequest {
        group_id: "g".into(),
        member_id: String::new(),
        member_epoch: MemberEpoch::LEAVE,
        offsets: vec![(TopicPartition::new("t", 0), offset, String::new())],
    };
    let committed = |c: &GroupCoordinator| {
        c.fetch_offsets("g", None)
            .map(|o| {
                o.into_iter()
                    .map(|(_, v)| v.map(|v| v.offset))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    enum Logged {
        Record(i64, GroupRecord),
        Marker(i64, bool),
    }
    let mut log = Vec::new();
    let first = c.txn_commit(&offsets(10), 7, now(0));
    first.response.unwrap();
    log.extend(first.records.into_iter().map(|r| Logged::Record(7, r)));
    assert!(
        committed(&c).iter().all(Option::is_none),
        "pending until the marker"
    );
    // A member starting the partition waits for the decision.
    let tp0 = [TopicPartition::new("t", 0)];
    assert!(matches!(
        c.fetch_offsets("g", Some(&tp0)),
        Err(GroupError::UnstableOffsetCommit(_))
    ));
    c.complete_txn(7, true, now(1));
    assert!(
        c.fetch_offsets("g", Some(&tp0)).is_ok(),
        "stable once decided"
    );
    log.push(Logged::Marker(7, true));
    assert_eq!(committed(&c), [Some(10)]);
    let second = c.txn_commit(&offsets(20), 7, now(2));
    log.extend(second.records.into_iter().map(|r| Logged::Record(7, r)));
    c.complete_txn(7, false, now(3));
    log.push(Logged::Marker(7, false));
    assert_eq!(
        committed(&c),
        [Some(10)],
        "an aborted transaction's offsets vanish"
    );
    c.complete_txn(7, true, now(4));
    assert_eq!(
        committed(&c),
        [Some(10)],
        "a repeated marker changes nothing"
    );
    assert_eq!(c.pending_txn_offsets(), 0);
    // Checked as plain commits: an unknown partition is refused.
    let mut bad = offsets(1);
    bad.offsets[0].0 = TopicPartition::new("t", 9);
    assert!(c.txn_commit(&bad, 8, now(5)).response.is_err());
    // A reload replays the same log.
    let mut reloaded = GroupCoordinator::new(config, topics(2));
    for entry in &log {
        match entry {
            Logged::Record(p, r) => reloaded.replay_txn(*p, r),
            Logged::Marker(p, commit) => reloaded.complete_txn(*p, *commit, now(6)),
        }
    }
    assert_eq!(committed(&reloaded), [Some(10)]);
    assert!(reloaded.same_state(&c));
}

// ---- Property test against a client model ----

#[derive(Clone, Debug)]
enum Op {
    Join(usize),
    Beat {
        client: usize,
        confirm: bool,
    },
    Leave(usize),
    /// kill -9: the process is gone; a new incarnation may join later.
    Crash(usize),
    /// SIGSTOP: no heartbeats; Resume continues with the stale state.
    Stop(usize),
    Resume(usize),
    Commit {
        client: usize,
        offset: i64,
    },
    Advance(u64),
    Grow,
    Failover {
        compacted: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let c = 0..4usize;
    prop_oneof![
        3 => c.clone().prop_map(Op::Join),
        10 => (c.clone(), any::<bool>()).prop_map(|(client, confirm)| Op::Beat { client, confirm }),
        1 => c.clone().prop_map(Op::Leave),
        1 => c.clone().prop_map(Op::Crash),
        1 => c.clone().prop_map(Op::Stop),
        1 => c.clone().prop_map(Op::Resume),
        4 => (c, 0..1000i64).prop_map(|(client, offset)| Op::Commit { client, offset }),
        2 => (1u64..4_000).prop_map(Op::Advance),
        1 => Just(Op::Grow),
        1 => any::<bool>().prop_map(|compacted| Op::Failover { compacted }),
    ]
}

#[derive(Default, Clone, Debug)]
struct Model {
    incarnation: u32,
    joined: bool,
    stopped: bool,
    epoch: i32,
    owned: BTreeSet<TopicPartition>,
    /// Given up at the coordinator's request but not yet confirmed.
    to_revoke: BTreeSet<TopicPartition>,
}

fn compact(log: &[GroupRecord]) -> Vec<GroupRecord> {
    let mut latest: BTreeMap<Vec<u8>, usize> = BTreeMap::new();
    for (i, r) in log.iter().enumerate() {
        latest.insert(r.encode_key().to_vec(), i);
    }
    let keep: BTreeSet<usize> = latest.into_values().collect();
    log.iter()
        .enumerate()
        .filter(|(i, _)| keep.contains(i))
        .map(|(_, r)| r.clone())
        .collect()
}

fn member_id(i: usize, m: &Model) -> String {
    format!("m{i}-{}", m.incarnation)
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut partitions = 6u32;
    let mut c = GroupCoordinator::new(CoordinatorConfig::default(), topics(partitions));
    let mut log: Vec<GroupRecord> = Vec::new();
    let mut clients = vec![Model::default(); 4];
    let mut committed: BTreeMap<TopicPartition, i64> = BTreeMap::new();
    let mut t = 0u64;

    let beat = |c: &mut GroupCoordinator,
                log: &mut Vec<GroupRecord>,
                i: usize,
                m: &mut Model,
                confirm: bool,
                t: u64| {
        if confirm {
            for tp in std::mem::take(&mut m.to_revoke) {
                m.owned.remove(&tp);
            }
        }
        let w = c.heartbeat(&hb(&member_id(i, m), m.epoch, &m.owned), now(t));
        log.extend(w.records);
        match w.response {
            Ok(r) => {
                m.epoch = r.member_epoch.0;
                m.to_revoke = m.owned.difference(&r.assignment).cloned().collect();
                m.owned.extend(r.assignment);
            }
            Err(GroupError::FencedMemberEpoch { .. } | GroupError::UnknownMemberId(_)) => {
                // Fenced: give up everything and join again later.
                *m = Model {
                    incarnation: m.incarnation + 1,
                    ..Model::default()
                };
            }
            Err(e) => panic!("unexpected heartbeat error {e}"),
        }
    };

    for op in ops {
        match op {
            Op::Join(i) => {
                let m = &mut clients[i];
                if !m.joined && !m.stopped {
                    m.joined = true;
                    m.epoch = 0;
                    beat(&mut c, &mut log, i, m, false, t);
                }
            }
            Op::Beat { client, confirm } => {
                let m = &mut clients[client];
                if m.joined && !m.stopped {
                    beat(&mut c, &mut log, client, m, confirm, t);
                }
            }
            Op::Leave(i) => {
                let m = &mut clients[i];
                if m.joined && !m.stopped {
                    let w = c.heartbeat(&hb(&member_id(i, m), -1, &BTreeSet::new()), now(t));
                    log.extend(w.records);
                    w.response.unwrap();
                    *m = Model {
                        incarnation: m.incarnation + 1,
                        ..Model::default()
                    };
                }
            }
            Op::Crash(i) => {
                let m = &mut clients[i];
                *m = Model {
                    incarnation: m.incarnation + 1,
                    ..Model::default()
                };
            }
            Op::Stop(i) => clients[i].stopped = true,
            Op::Resume(i) => clients[i].stopped = false,
            Op::Commit { client, offset } => {
                let m = &clients[client];
                if m.joined && !m.stopped {
                    if let Some(tp) = m.owned.iter().next().cloned() {
                        let req = CommitRequest {
                            group_id: "g".into(),
                            member_id: member_id(client, m),
                            member_epoch: MemberEpoch(m.epoch),
                            offsets: vec![(tp.clone(), offset, String::new())],
                        };
                        let w = c.commit(&req, now(t));
                        log.extend(w.records);
                        if w.response.is_ok() {
                            // The partition was this member's and nobody else's.
                            let d = c.describe_group("g").unwrap();
                            let me = d
                                .members
                                .iter()
                                .find(|x| x.member_id == member_id(client, m))
                                .unwrap();
                            prop_assert!(
                                me.assigned.contains(&tp) || me.pending_revocation.contains(&tp)
                            );
                            committed.insert(tp, offset);
                        }
                    }
                }
            }
            Op::Advance(ms) => {
                t += ms;
                log.extend(c.tick(now(t)));
            }
            Op::Grow => {
                partitions += 1;
                log.extend(c.set_topics(topics(partitions), now(t)));
            }
            Op::Failover { compacted } => {
                let records = if compacted {
                    compact(&log)
                } else {
                    log.clone()
                };
                let mut loaded =
                    GroupCoordinator::new(CoordinatorConfig::default(), topics(partitions));
                for r in &records {
                    loaded.replay(r, now(t));
                }
                loaded.restart_timers(now(t));
                prop_assert!(loaded.same_state(&c), "state after reload differs");
                c = loaded;
            }
        }
        c.check_invariants();
        // Every committed offset is there, the latest one wins.
        let fetched: BTreeMap<TopicPartition, i64> = c
            .fetch_offsets("g", None)
            .unwrap()
            .into_iter()
            .map(|(tp, v)| (tp, v.unwrap().offset))
            .collect();
        prop_assert_eq!(&fetched, &committed);
        // A live client that is still a member holds only what the
        // coordinator lets it hold, so no two such clients share a partition.
        if let Ok(d) = c.describe_group("g") {
            let mut holder: BTreeMap<&TopicPartition, usize> = BTreeMap::new();
            for (i, m) in clients.iter().enumerate() {
                if let Some(me) = d.members.iter().find(|x| x.member_id == member_id(i, m)) {
                    for tp in &m.owned {
                        if let Some(other) = holder.insert(tp, i) {
                            prop_assert!(false, "clients {other} and {i} both hold {tp}");
                        }
                    }
                    if m.joined && me.member_epoch.0 == m.epoch {
                        for tp in &m.owned {
                            prop_assert!(
                                me.assigned.contains(tp) || me.pending_revocation.contains(tp),
                                "client {i} owns {tp} beyond its assignment"
                            );
                        }
                    }
                }
            }
        }
    }

    // Liveness: crashed members' sessions run out, everyone resumes and
    // behaves, and the group settles on its target.
    t += 10_000;
    log.extend(c.tick(now(t)));
    c.check_invariants();
    for m in &mut clients {
        m.stopped = false;
    }
    for _ in 0..8 {
        for (i, m) in clients.iter_mut().enumerate() {
            if !m.joined {
                m.joined = true;
                m.epoch = 0;
            }
            beat(&mut c, &mut log, i, m, true, t);
        }
    }
    let d = c.describe_group("g").unwrap();
    prop_assert_eq!(d.state, GroupState::Stable);
    let all: BTreeSet<TopicPartition> = d
        .members
        .iter()
        .flat_map(|m| m.assigned.iter().cloned())
        .collect();
    prop_assert_eq!(all.len(), partitions as usize);
    for m in &d.members {
        prop_assert_eq!(&m.assigned, &m.target);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn groups_never_share_a_partition_nor_lose_a_commit(ops in proptest::collection::vec(op(), 1..120)) {
        run(ops)?;
    }
}

#[test]
fn offsets_expire_counted_from_when_the_group_emptied_and_bare_groups_go_at_once() {
    let config = CoordinatorConfig {
        offsets_retention_ms: 1_000,
    };
    let mut c = GroupCoordinator::new(config, topics(1));
    let mut log = Vec::new();
    let mut a = Client::new("a");
    a.beat(&mut c, 0, &mut log).unwrap();
    let commit = CommitRequest {
        group_id: "g".into(),
        member_id: "a".into(),
        member_epoch: MemberEpoch(a.epoch),
        offsets: vec![(TopicPartition::new("t", 0), 4, String::new())],
    };
    c.commit(&commit, now(0)).response.unwrap();
    // The last commit is long past retention when the member leaves; the
    // offsets still stay for the retention from that moment.
    for t in (1_000..5_000).step_by(1_000) {
        a.beat(&mut c, t, &mut log).unwrap();
    }
    let leave = c.heartbeat(&hb("a", -1, &BTreeSet::new()), now(5_000));
    leave.response.unwrap();
    assert!(c.tick(now(5_999)).is_empty());
    assert_eq!(c.fetch_offsets("g", None).unwrap().len(), 1);
    assert!(!c.tick(now(6_000)).is_empty());
    assert_eq!(c.group_count(), 0);

    // A group that never committed is dropped at the next tick once empty.
    let mut b = Client::new("b");
    b.beat(&mut c, 7_000, &mut log).unwrap();
    c.heartbeat(&hb("b", -1, &BTreeSet::new()), now(7_001))
        .response
        .unwrap();
    assert_eq!(c.group_count(), 1);
    c.tick(now(7_002));
    assert_eq!(c.group_count(), 0);
}

#[test]
fn a_coordinator_loaded_without_topics_retargets_groups_and_drops_offsets_of_gone_topics() {
    let mut c = GroupCoordinator::new(CoordinatorConfig::default(), topics(2));
    let mut log = Vec::new();
    let mut a = Client::new("a");
    settle(&mut c, std::slice::from_mut(&mut a), 0, &mut log);
    let commit = CommitRequest {
        group_id: "g".into(),
        member_id: "a".into(),
        member_epoch: MemberEpoch(a.epoch),
        offsets: vec![(TopicPartition::new("t", 1), 9, String::new())],
    };
    log.extend(c.commit(&commit, now(1)).records);
    // While no coordinator is loaded, `t` grows to 3 partitions; the next
    // coordinator replays the log and is then given the topics.
    let mut loaded = GroupCoordinator::new(CoordinatorConfig::default(), BTreeMap::new());
    for r in &log {
        loaded.replay(r, now(2));
    }
    loaded.restart_timers(now(2));
    assert!(!loaded.set_topics(topics(3), now(3)).is_empty());
    a.beat(&mut loaded, 4, &mut log).unwrap();
    a.beat(&mut loaded, 5, &mut log).unwrap();
    assert_eq!(
        a.owned.len(),
        3,
        "the member gets the partition added meanwhile"
    );
    // And a topic deleted meanwhile takes its offsets.
    let mut again = GroupCoordinator::new(CoordinatorConfig::default(), BTreeMap::new());
    for r in &log {
        again.replay(r, now(6));
    }
    again.set_topics([("other".to_string(), 1)].into(), now(7));
    assert!(again.fetch_offsets("g", None).unwrap().is_empty());
}
