//! The cluster state machine driven through commands: registration and fencing,
//! leader election from the ISR, offline and unclean election, the AlterIsr
//! compare-and-set, deltas, and a property test over random command sequences.
//! Every step checks the state's invariants (see `support::step`).

use std::collections::BTreeMap;

use controller::{
    BrokerEpoch, BrokerId, ClusterState, Command, CommandError, Delta, LeaderEpoch,
    MetadataVersion, Outcome, PartitionEpoch, PartitionIndex, PartitionRecord, StateLimits,
    TopicId,
};
use proptest::prelude::*;

use crate::support::{create_topic, join, step};

fn partition(state: &ClusterState, topic_id: TopicId, index: u32) -> PartitionRecord {
    state
        .partition(topic_id, PartitionIndex(index))
        .expect("partition exists")
        .clone()
}

fn fence_at(state: &mut ClusterState, now_ms: u64) -> Vec<BrokerId> {
    match step(state, &Command::FenceExpiredBrokers { now_ms }).result {
        Ok(Outcome::BrokersFenced { broker_ids }) => broker_ids,
        other => panic!("fence: {other:?}"),
    }
}

fn heartbeat(
    state: &mut ClusterState,
    id: u32,
    epoch: BrokerEpoch,
    now_ms: u64,
) -> Result<Outcome, CommandError> {
    step(
        state,
        &Command::BrokerHeartbeat {
            broker_id: BrokerId(id),
            broker_epoch: epoch,
            now_ms,
        },
    )
    .result
}

fn alter_isr(
    state: &mut ClusterState,
    topic_id: TopicId,
    p: &PartitionRecord,
    leader: u32,
    isr: &[u32],
) -> Result<Outcome, CommandError> {
    let command = Command::AlterIsr {
        topic_id,
        partition: PartitionIndex(0),
        leader_id: BrokerId(leader),
        leader_epoch: p.leader_epoch,
        partition_epoch: p.partition_epoch,
        new_isr: isr.iter().map(|&b| BrokerId(b)).collect(),
        new_isr_epochs: Vec::new(),
    };
    step(state, &command).result
}

// A registered broker starts fenced, is unfenced by its current epoch only, and
// heartbeats from an old incarnation are refused.
#[test]
fn registration_fencing_and_heartbeats() {
    let mut state = ClusterState::default();
    let register = Command::RegisterBroker {
        broker_id: BrokerId(1),
        endpoints: crate::support::endpoints(1, 2),
        now_ms: 0,
        session_timeout_ms: 1_000,
        incarnation_id: 0,
    };
    let Ok(Outcome::BrokerRegistered {
        broker_epoch: first,
    }) = step(&mut state, &register).result
    else {
        panic!("register");
    };
    assert!(state.broker(BrokerId(1)).expect("registered").fenced);
    assert_eq!(
        heartbeat(&mut state, 1, first, 500),
        Ok(Outcome::HeartbeatAccepted { fenced: true })
    );
    let unknown = Command::UnfenceBroker {
        broker_id: BrokerId(9),
        broker_epoch: first,
    };
    assert_eq!(
        step(&mut state, &unknown).result,
        Err(CommandError::UnknownBroker(BrokerId(9)))
    );

    let Ok(Outcome::BrokerRegistered {
        broker_epoch: second,
    }) = step(&mut state, &register).result
    else {
        panic!("re-register");
    };
    assert!(second > first);
    assert!(matches!(
        heartbeat(&mut state, 1, first, 600),
        Err(CommandError::StaleBrokerEpoch { .. })
    ));
    let unfence = Command::UnfenceBroker {
        broker_id: BrokerId(1),
        broker_epoch: second,
    };
    assert_eq!(
        step(&mut state, &unfence).result,
        Ok(Outcome::BrokerUnfenced)
    );
    assert!(!state.broker(BrokerId(1)).expect("registered").fenced);

    // Heartbeats hold the session; without them the broker is fenced at the deadline.
    assert_eq!(
        heartbeat(&mut state, 1, second, 900),
        Ok(Outcome::HeartbeatAccepted { fenced: false })
    );
    assert_eq!(fence_at(&mut state, 1_899), Vec::<BrokerId>::new());
    assert_eq!(fence_at(&mut state, 1_900), vec![BrokerId(1)]);
}

// The same broker process registering again (its answer was lost, or it
// follows a newly elected controller) keeps its epoch and its leaderships:
// nothing is fenced and the metadata does not change. A new process (another
// incarnation) fences the old one first.
#[test]
fn the_same_incarnation_registering_again_changes_nothing() {
    let mut state = ClusterState::default();
    let register = |id: u32, incarnation_id: u64, now_ms: u64| Command::RegisterBroker {
        broker_id: BrokerId(id),
        endpoints: crate::support::endpoints(id, 1),
        now_ms,
        session_timeout_ms: 1_000,
        incarnation_id,
    };
    let mut epochs = BTreeMap::new();
    for id in 1..=3u32 {
        let Ok(Outcome::BrokerRegistered { broker_epoch }) =
            step(&mut state, &register(id, 100 + u64::from(id), 0)).result
        else {
            panic!("register {id}");
        };
        let unfence = Command::UnfenceBroker {
            broker_id: BrokerId(id),
            broker_epoch,
        };
        step(&mut state, &unfence).result.expect("unfenced");
        epochs.insert(id, broker_epoch);
    }
    let topic_id = create_topic(&mut state, "t", 6, 3, false);
    let before = state.clone();
    for id in 1..=3u32 {
        let again = step(&mut state, &register(id, 100 + u64::from(id), 900)).result;
        assert_eq!(
            again,
            Ok(Outcome::BrokerRegistered {
                broker_epoch: epochs[&id]
            })
        );
    }
    assert_eq!(state.metadata_version(), before.metadata_version());
    assert_eq!(
        state.topic(topic_id),
        before.topic(topic_id),
        "no leader moved"
    );
    assert!(state.brokers().all(|b| !b.fenced));
    // The registration refreshed the session: not expired at the old deadline.
    assert_eq!(fence_at(&mut state, 1_000), Vec::<BrokerId>::new());
    // A new process of broker 1 fences the old one and moves its leaderships.
    let Ok(Outcome::BrokerRegistered { broker_epoch }) =
        step(&mut state, &register(1, 999, 1_000)).result
    else {
        panic!("new incarnation");
    };
    assert!(broker_epoch > epochs[&1]);
    let topic = state.topic(topic_id).expect("topic");
    assert!(topic
        .partitions
        .iter()
        .all(|p| p.leader != Some(BrokerId(1))));
    assert!(topic
        .partitions
        .iter()
        .all(|p| !p.isr.contains(&BrokerId(1))));
}

// KIP-903: a leader's ISR expansion names the broker epoch it saw each member
// fetch with; a member that registered again since then is refused, so a
// restarted follower rejoins only on progress made after its restart.
#[test]
fn alter_isr_refuses_members_seen_at_an_older_broker_epoch() {
    let mut state = ClusterState::default();
    let mut epochs = BTreeMap::new();
    for id in 1..=3 {
        epochs.insert(id, join(&mut state, id, 1, 0));
    }
    let topic_id = create_topic(&mut state, "t", 1, 3, false);
    let p = partition(&state, topic_id, 0);
    let leader = p.leader.expect("led").0;
    let follower = (1..=3).find(|b| *b != leader).expect("a follower");
    let shrunk: Vec<u32> = (1..=3).filter(|b| *b != follower).collect();
    alter_isr(&mut state, topic_id, &p, leader, &shrunk).expect("shrink");
    // The follower restarts: a new registration and epoch, unfenced again.
    let new_epoch = join(&mut state, follower, 1, 10);
    assert!(new_epoch > epochs[&follower]);
    let p = partition(&state, topic_id, 0);
    let expand = |member_epoch: BrokerEpoch| Command::AlterIsr {
        topic_id,
        partition: PartitionIndex(0),
        leader_id: BrokerId(leader),
        leader_epoch: p.leader_epoch,
        partition_epoch: p.partition_epoch,
        new_isr: (1..=3).map(BrokerId).collect(),
        new_isr_epochs: (1..=3)
            .map(|b| {
                if b == follower {
                    member_epoch
                } else {
                    epochs[&b]
                }
            })
            .collect(),
    };
    assert!(matches!(
        step(&mut state, &expand(epochs[&follower])).result,
        Err(CommandError::IsrStaleBrokerEpoch { .. })
    ));
    assert_eq!(partition(&state, topic_id, 0).isr.len(), 2);
    step(&mut state, &expand(new_epoch))
        .result
        .expect("progress of the current incarnation counts");
    assert_eq!(partition(&state, topic_id, 0).isr.len(), 3);
}

// A new topic is spread evenly, every replica starts in the ISR, and the first
// replica leads; bad requests are refused with typed errors.
#[test]
fn create_topic_places_evenly_and_validates() {
    let mut state = ClusterState::default();
    for id in 1..=3 {
        join(&mut state, id, 4, 0);
    }
    let topic_id = create_topic(&mut state, "orders", 6, 2, false);
    let topic = state.topic(topic_id).expect("created").clone();
    let mut leaders = BTreeMap::<BrokerId, usize>::new();
    for p in &topic.partitions {
        assert_eq!(p.leader, Some(p.replicas[0].broker_id));
        assert_eq!(p.isr.len(), 2);
        *leaders.entry(p.replicas[0].broker_id).or_default() += 1;
    }
    assert_eq!(leaders.values().copied().collect::<Vec<_>>(), vec![2, 2, 2]);

    let create = |name: &str, partition_count, replication_factor| Command::CreateTopic {
        name: name.into(),
        partition_count,
        replication_factor,
        config: BTreeMap::new(),
    };
    assert_eq!(
        step(&mut state, &create("orders", 1, 1)).result,
        Err(CommandError::TopicExists("orders".into()))
    );
    assert!(matches!(
        step(&mut state, &create("x", 1, 4)).result,
        Err(CommandError::InvalidReplicationFactor { .. })
    ));
    assert!(matches!(
        step(&mut state, &create("x", 0, 1)).result,
        Err(CommandError::InvalidPartitionCount { .. })
    ));
    assert!(matches!(
        step(&mut state, &create("a/b", 1, 1)).result,
        Err(CommandError::InvalidTopicName(_))
    ));
    let bad_config = Command::CreateTopic {
        name: "y".into(),
        partition_count: 1,
        replication_factor: 1,
        config: [(
            "unclean.leader.election.enable".to_owned(),
            "yes".to_owned(),
        )]
        .into(),
    };
    assert!(matches!(
        step(&mut state, &bad_config).result,
        Err(CommandError::InvalidConfig { .. })
    ));

    assert_eq!(
        step(
            &mut state,
            &Command::DeleteTopic {
                name: "orders".into()
            }
        )
        .result,
        Ok(Outcome::TopicDeleted { topic_id })
    );
    assert!(state.topic_by_name("orders").is_none());
    let again = create_topic(&mut state, "orders", 1, 1, false);
    assert!(again > topic_id, "topic ids are never reused");
}

// When a leader's session expires, leadership moves to a live ISR member with both
// epochs bumped, and the fenced broker leaves every ISR.
#[test]
fn expired_leader_fails_over_within_isr() {
    let mut state = ClusterState::default();
    let epochs: Vec<BrokerEpoch> = (1..=3).map(|id| join(&mut state, id, 1, 0)).collect();
    let topic_id = create_topic(&mut state, "t", 1, 3, false);
    let before = partition(&state, topic_id, 0);
    let old_leader = before.leader.expect("led");
    let version = state.metadata_version();

    for (i, epoch) in epochs.iter().enumerate() {
        let id = i as u32 + 1;
        if BrokerId(id) != old_leader {
            heartbeat(&mut state, id, *epoch, 5_000).expect("heartbeat");
        }
    }
    assert_eq!(fence_at(&mut state, 2_000), vec![old_leader]);
    let after = partition(&state, topic_id, 0);
    assert_ne!(after.leader, Some(old_leader));
    assert!(after.leader.is_some());
    assert_eq!(after.leader_epoch, LeaderEpoch(before.leader_epoch.0 + 1));
    assert_eq!(
        after.partition_epoch,
        PartitionEpoch(before.partition_epoch.0 + 1)
    );
    assert!(!after.isr.contains(&old_leader));

    let deltas = state.deltas_since(version).expect("retained");
    assert!(deltas.iter().all(|d| d.version == version.next()));
    assert_eq!(deltas[0].delta, Delta::BrokerFenced(old_leader));
    assert!(matches!(&deltas[1].delta, Delta::PartitionChanged { record, .. } if *record == after));
}

// Controlled shutdown: a broker that asks to be fenced loses its leadership
// to a live ISR member at once, without waiting for its session; a request
// from an older incarnation changes nothing.
#[test]
fn a_broker_fenced_on_request_hands_over_its_partitions() {
    let mut state = ClusterState::default();
    let epochs: Vec<BrokerEpoch> = (1..=3).map(|id| join(&mut state, id, 1, 0)).collect();
    let topic_id = create_topic(&mut state, "t", 1, 3, false);
    let before = partition(&state, topic_id, 0);
    let leader = before.leader.expect("led");
    let epoch = epochs[(leader.0 - 1) as usize];

    let stale = step(
        &mut state,
        &Command::FenceBroker {
            broker_id: leader,
            broker_epoch: BrokerEpoch(epoch.0 + 100),
        },
    );
    assert!(stale.result.is_err());
    assert_eq!(partition(&state, topic_id, 0), before);

    let reply = step(
        &mut state,
        &Command::FenceBroker {
            broker_id: leader,
            broker_epoch: epoch,
        },
    );
    assert!(
        matches!(reply.result, Ok(Outcome::BrokersFenced { ref broker_ids }) if broker_ids == &vec![leader])
    );
    let after = partition(&state, topic_id, 0);
    assert!(after.leader.is_some_and(|l| l != leader));
    assert_eq!(after.leader_epoch, LeaderEpoch(before.leader_epoch.0 + 1));
    assert!(!after.isr.contains(&leader));
    assert!(state.broker(leader).expect("known").fenced);
}

// With no live ISR member the partition goes offline, keeping its last ISR member
// so that member's return brings it back cleanly; an out-of-sync replica's return
// does not.
#[test]
fn partition_goes_offline_and_returns_with_last_isr_member() {
    let mut state = ClusterState::default();
    let epoch_1 = join(&mut state, 1, 1, 0);
    join(&mut state, 2, 1, 0);
    let topic_id = create_topic(&mut state, "t", 1, 2, false);
    let first_leader = partition(&state, topic_id, 0).leader.expect("led");
    let other = if first_leader == BrokerId(1) {
        BrokerId(2)
    } else {
        BrokerId(1)
    };

    // Fence the leader first, then the other: the other is the last ISR member.
    let register_again = |id: BrokerId| Command::RegisterBroker {
        broker_id: id,
        endpoints: crate::support::endpoints(id.0, 1),
        now_ms: 0,
        session_timeout_ms: 1_000,
        incarnation_id: 0,
    };
    step(&mut state, &register_again(first_leader))
        .result
        .expect("re-register fences the old incarnation");
    assert_eq!(partition(&state, topic_id, 0).leader, Some(other));
    step(&mut state, &register_again(other))
        .result
        .expect("re-register");
    let offline = partition(&state, topic_id, 0);
    assert_eq!((offline.leader, offline.isr.clone()), (None, vec![other]));

    // The out-of-sync broker returns: still offline (unclean election is off).
    let epoch = state.broker(first_leader).expect("known").epoch;
    step(
        &mut state,
        &Command::UnfenceBroker {
            broker_id: first_leader,
            broker_epoch: epoch,
        },
    )
    .result
    .expect("unfence");
    assert_eq!(partition(&state, topic_id, 0).leader, None);
    // The last ISR member returns: it leads again.
    let epoch = state.broker(other).expect("known").epoch;
    step(
        &mut state,
        &Command::UnfenceBroker {
            broker_id: other,
            broker_epoch: epoch,
        },
    )
    .result
    .expect("unfence");
    let online = partition(&state, topic_id, 0);
    assert_eq!((online.leader, online.isr), (Some(other), vec![other]));
    assert!(online.leader_epoch > offline.leader_epoch);
    let _ = epoch_1;
}

// With unclean election enabled, a live replica outside the ISR takes over rather
// than leaving the partition offline.
#[test]
fn unclean_election_picks_a_live_replica() {
    let mut state = ClusterState::default();
    join(&mut state, 1, 1, 0);
    let epoch_2 = join(&mut state, 2, 1, 0);
    let topic_id = create_topic(&mut state, "t", 1, 2, true);
    let p = partition(&state, topic_id, 0);
    let leader = p.leader.expect("led");
    // Shrink the ISR to the leader alone, then let the leader expire.
    alter_isr(&mut state, topic_id, &p, leader.0, &[leader.0]).expect("shrink");
    for id in [1, 2] {
        if BrokerId(id) != leader {
            let epoch = state.broker(BrokerId(id)).expect("known").epoch;
            heartbeat(&mut state, id, epoch, 10_000).expect("heartbeat");
        }
    }
    assert_eq!(fence_at(&mut state, 2_000), vec![leader]);
    let after = partition(&state, topic_id, 0);
    let survivor = if leader == BrokerId(1) {
        BrokerId(2)
    } else {
        BrokerId(1)
    };
    assert_eq!((after.leader, after.isr), (Some(survivor), vec![survivor]));
    let _ = epoch_2;
}

// AlterIsr is a compare-and-set on (leader, leader epoch, partition epoch) and
// checks the new ISR; a refused request changes nothing.
#[test]
fn alter_isr_is_compare_and_set() {
    let mut state = ClusterState::default();
    for id in 1..=3 {
        join(&mut state, id, 1, 0);
    }
    join(&mut state, 4, 1, 0);
    let topic_id = create_topic(&mut state, "t", 1, 3, false);
    let p = partition(&state, topic_id, 0);
    let leader = p.leader.expect("led").0;
    let followers: Vec<u32> = p
        .replicas
        .iter()
        .map(|r| r.broker_id.0)
        .filter(|&b| b != leader)
        .collect();
    let outsider = (1..=4)
        .find(|b| !p.has_replica(BrokerId(*b)))
        .expect("a non-replica");

    assert_eq!(
        alter_isr(&mut state, topic_id, &p, followers[0], &[followers[0]]),
        Err(CommandError::NotLeader {
            current: Some(BrokerId(leader)),
            got: BrokerId(followers[0])
        })
    );
    assert_eq!(
        alter_isr(&mut state, topic_id, &p, leader, &[followers[0]]),
        Err(CommandError::IsrMissingLeader(BrokerId(leader)))
    );
    assert_eq!(
        alter_isr(&mut state, topic_id, &p, leader, &[leader, outsider]),
        Err(CommandError::IsrNotReplica(BrokerId(outsider)))
    );
    assert_eq!(
        alter_isr(&mut state, topic_id, &p, leader, &[leader, leader]),
        Err(CommandError::IsrDuplicate(BrokerId(leader)))
    );
    let mut stale = p.clone();
    stale.leader_epoch = LeaderEpoch(p.leader_epoch.0 + 1);
    assert!(matches!(
        alter_isr(&mut state, topic_id, &stale, leader, &[leader]),
        Err(CommandError::StaleLeaderEpoch { .. })
    ));

    let Ok(Outcome::IsrAltered { partition: shrunk }) =
        alter_isr(&mut state, topic_id, &p, leader, &[leader, followers[0]])
    else {
        panic!("shrink refused");
    };
    assert_eq!(shrunk.partition_epoch, p.partition_epoch.next());
    assert_eq!(shrunk.leader_epoch, p.leader_epoch);
    // The old partition epoch is now stale.
    assert!(matches!(
        alter_isr(&mut state, topic_id, &p, leader, &[leader]),
        Err(CommandError::StalePartitionEpoch { .. })
    ));
    // Re-sending the current ISR succeeds without a change.
    let version = state.metadata_version();
    let Ok(Outcome::IsrAltered { partition: same }) = alter_isr(
        &mut state,
        topic_id,
        &shrunk,
        leader,
        &[followers[0], leader],
    ) else {
        panic!("idempotent alter refused");
    };
    assert_eq!((same, state.metadata_version()), (shrunk.clone(), version));

    // A fenced broker cannot be added back.
    for id in 1..=4 {
        if id != followers[1] {
            let epoch = state.broker(BrokerId(id)).expect("known").epoch;
            heartbeat(&mut state, id, epoch, 5_000).expect("heartbeat");
        }
    }
    assert_eq!(fence_at(&mut state, 1_000), vec![BrokerId(followers[1])]);
    let current = partition(&state, topic_id, 0);
    assert_eq!(
        current, shrunk,
        "fencing a broker outside the ISR does not touch the partition"
    );
    assert_eq!(
        alter_isr(
            &mut state,
            topic_id,
            &current,
            leader,
            &[leader, followers[0], followers[1]]
        ),
        Err(CommandError::IsrIneligible(BrokerId(followers[1])))
    );
}

// Deltas are retained up to the bound; older versions must load the image.
#[test]
fn deltas_since_is_bounded() {
    let limits = StateLimits {
        deltas_retained_max: 4,
        ..StateLimits::default()
    };
    let mut state = ClusterState::new(limits);
    assert_eq!(state.deltas_since(MetadataVersion(0)), Ok(vec![]));
    for id in 1..=4 {
        join(&mut state, id, 1, 0);
    }
    let current = state.metadata_version();
    assert_eq!(current, MetadataVersion(8));
    assert_eq!(state.deltas_since(current), Ok(vec![]));
    assert_eq!(
        state
            .deltas_since(MetadataVersion(6))
            .expect("retained")
            .len(),
        2
    );
    assert!(state.deltas_since(MetadataVersion(2)).is_err());
    assert!(state.deltas_since(current.next()).is_err());
    assert_eq!(state.image().brokers.len(), 4);
}

#[derive(Clone, Debug)]
enum Op {
    Register {
        id: u32,
        shard_count: u16,
        /// 0: a new process every time; else the same process may repeat.
        incarnation: u8,
    },
    Unfence {
        id: u32,
    },
    Heartbeat {
        id: u32,
    },
    Advance {
        ms: u64,
    },
    FenceExpired,
    Shutdown {
        id: u32,
    },
    Create {
        partition_count: u32,
        rf: u16,
        unclean: bool,
    },
    Delete {
        pick: usize,
    },
    AlterIsr {
        pick: usize,
        mask: u8,
        stale: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u32..6, 1u16..4, 0u8..3).prop_map(|(id, shard_count, incarnation)| Op::Register {
            id,
            shard_count,
            incarnation
        }),
        (1u32..6).prop_map(|id| Op::Unfence { id }),
        (1u32..6).prop_map(|id| Op::Heartbeat { id }),
        (1u64..1_500).prop_map(|ms| Op::Advance { ms }),
        Just(Op::FenceExpired),
        (1u32..6).prop_map(|id| Op::Shutdown { id }),
        (1u32..6, 1u16..4, any::<bool>()).prop_map(|(partition_count, rf, unclean)| Op::Create {
            partition_count,
            rf,
            unclean
        }),
        any::<usize>().prop_map(|pick| Op::Delete { pick }),
        (any::<usize>(), any::<u8>(), any::<bool>()).prop_map(|(pick, mask, stale)| Op::AlterIsr {
            pick,
            mask,
            stale
        }),
    ]
}

/// Turns a random op into a command that makes sense against the current state.
fn command_for(
    state: &ClusterState,
    op: &Op,
    now_ms: &mut u64,
    topic_seq: &mut u32,
) -> Option<Command> {
    let epoch = |id: u32| {
        state
            .broker(BrokerId(id))
            .map(|b| b.epoch)
            .unwrap_or(BrokerEpoch(0))
    };
    Some(match *op {
        Op::Register {
            id,
            shard_count,
            incarnation,
        } => Command::RegisterBroker {
            broker_id: BrokerId(id),
            endpoints: crate::support::endpoints(id, shard_count),
            now_ms: *now_ms,
            session_timeout_ms: 1_000,
            incarnation_id: u64::from(incarnation),
        },
        Op::Unfence { id } => Command::UnfenceBroker {
            broker_id: BrokerId(id),
            broker_epoch: epoch(id),
        },
        Op::Heartbeat { id } => Command::BrokerHeartbeat {
            broker_id: BrokerId(id),
            broker_epoch: epoch(id),
            now_ms: *now_ms,
        },
        Op::Advance { ms } => {
            *now_ms += ms;
            return None;
        }
        Op::FenceExpired => Command::FenceExpiredBrokers { now_ms: *now_ms },
        Op::Shutdown { id } => Command::FenceBroker {
            broker_id: BrokerId(id),
            broker_epoch: epoch(id),
        },
        Op::Create {
            partition_count,
            rf,
            unclean,
        } => {
            *topic_seq += 1;
            let mut config = BTreeMap::new();
            config.insert(
                "unclean.leader.election.enable".to_owned(),
                unclean.to_string(),
            );
            Command::CreateTopic {
                name: format!("t{topic_seq}"),
                partition_count,
                replication_factor: rf,
                config,
            }
        }
        Op::Delete { pick } => {
            let topics: Vec<_> = state.topics().collect();
            let topic = topics.get(pick % topics.len().max(1))?;
            Command::DeleteTopic {
                name: topic.name.clone(),
            }
        }
        Op::AlterIsr { pick, mask, stale } => {
            let partitions: Vec<_> = state
                .topics()
                .flat_map(|t| {
                    t.partitions
                        .iter()
                        .enumerate()
                        .map(move |(i, p)| (t.id, i, p))
                })
                .collect();
            let &(topic_id, index, p) = partitions.get(pick % partitions.len().max(1))?;
            let leader = p.leader?;
            let mut new_isr: Vec<BrokerId> = p
                .replicas
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, r)| r.broker_id)
                .collect();
            if !new_isr.contains(&leader) && mask & 0x80 == 0 {
                new_isr.push(leader);
            }
            Command::AlterIsr {
                topic_id,
                partition: PartitionIndex(index as u32),
                leader_id: leader,
                leader_epoch: p.leader_epoch,
                partition_epoch: if stale {
                    PartitionEpoch(p.partition_epoch.0 - 1)
                } else {
                    p.partition_epoch
                },
                new_isr_epochs: new_isr.iter().map(|b| epoch(b.0)).collect(),
                new_isr,
            }
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    // Any command sequence keeps every invariant (checked after each step by
    // `step`), two replicas applying it agree exactly, the state survives a serde
    // round trip, and the deltas replayed from version 0 name every live topic.
    #[test]
    fn random_commands_keep_invariants_and_determinism(ops in proptest::collection::vec(op(), 1..80)) {
        let mut a = ClusterState::default();
        let mut b = ClusterState::default();
        let (mut now_ms, mut topic_seq) = (0, 0);
        for op in &ops {
            let Some(command) = command_for(&a, op, &mut now_ms, &mut topic_seq) else { continue };
            let reply_a = step(&mut a, &command);
            let reply_b = b.apply(&command);
            prop_assert_eq!(reply_a, reply_b);
        }
        prop_assert_eq!(&a, &b);
        let json = serde_json::to_vec(&a).expect("encode");
        let decoded: ClusterState = serde_json::from_slice(&json).expect("decode");
        prop_assert_eq!(&decoded, &a);

        let deltas = a.deltas_since(MetadataVersion(0)).expect("all retained");
        let mut live = BTreeMap::new();
        for d in deltas {
            match d.delta {
                Delta::TopicCreated(t) => { live.insert(t.id, t.name); }
                Delta::TopicDeleted { topic_id, .. } => { live.remove(&topic_id); }
                _ => {}
            }
        }
        let names: BTreeMap<TopicId, String> = a.topics().map(|t| (t.id, t.name.clone())).collect();
        prop_assert_eq!(live, names);
    }
}

// A topic's config changes as a whole: keys set and removed, the result
// validated as at creation, one delta with the whole config, nothing when
// nothing changes, and an unknown topic or invalid result refused.
#[test]
fn alter_topic_config_sets_removes_and_validates() {
    let mut state = ClusterState::default();
    join(&mut state, 1, 1, 0);
    let topic_id = create_topic(&mut state, "t", 1, 1, false);
    let alter = |set: &[(&str, &str)], remove: &[&str]| Command::AlterTopicConfig {
        name: "t".into(),
        set: set
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        remove: remove.iter().map(|k| k.to_string()).collect(),
    };
    let before = state.metadata_version();
    let reply = step(
        &mut state,
        &alter(
            &[("cleanup.policy", "compact"), ("delete.retention.ms", "5")],
            &[],
        ),
    );
    assert_eq!(reply.result, Ok(Outcome::TopicConfigAltered { topic_id }));
    assert_eq!(state.metadata_version(), before.next());
    let deltas = state.deltas_since(before).unwrap();
    assert_eq!(deltas.len(), 1);
    let expected: BTreeMap<String, String> =
        [("cleanup.policy", "compact"), ("delete.retention.ms", "5")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    assert_eq!(
        deltas[0].delta,
        Delta::TopicConfigChanged {
            topic_id,
            config: expected.clone()
        }
    );
    assert_eq!(state.topic_by_name("t").unwrap().config, expected);

    let unchanged = state.metadata_version();
    step(&mut state, &alter(&[("cleanup.policy", "compact")], &[]));
    assert_eq!(state.metadata_version(), unchanged, "no change, no delta");

    step(&mut state, &alter(&[], &["delete.retention.ms"]));
    assert_eq!(
        state
            .topic_by_name("t")
            .unwrap()
            .config
            .get("delete.retention.ms"),
        None
    );
    assert!(matches!(
        step(
            &mut state,
            &alter(&[("unclean.leader.election.enable", "maybe")], &[])
        )
        .result,
        Err(CommandError::InvalidConfig { .. })
    ));
    let unknown = Command::AlterTopicConfig {
        name: "missing".into(),
        set: BTreeMap::new(),
        remove: Vec::new(),
    };
    assert!(matches!(
        step(&mut state, &unknown).result,
        Err(CommandError::UnknownTopic(_))
    ));
}

#[test]
fn producer_id_blocks_never_overlap_and_survive_a_snapshot() {
    // Proves every block a broker gets is new, a stale registration gets
    // none, and a state restored from its serialized form (what a new
    // controller leader loads) goes on after the last block given.
    let mut state = ClusterState::default();
    let one = join(&mut state, 1, 1, 0);
    let two = join(&mut state, 2, 1, 0);
    let allocate = |broker: u32, epoch: BrokerEpoch| Command::AllocateProducerIds {
        broker_id: BrokerId(broker),
        broker_epoch: epoch,
    };
    let mut blocks = Vec::new();
    for (broker, epoch) in [(1, one), (2, two), (1, one)] {
        let version = state.metadata_version();
        let Ok(Outcome::ProducerIdsAllocated { first, count }) =
            step(&mut state, &allocate(broker, epoch)).result
        else {
            panic!("allocation refused");
        };
        assert_eq!(state.metadata_version(), version, "brokers see no change");
        blocks.push((first, first + i64::from(count)));
    }
    for (i, a) in blocks.iter().enumerate() {
        for b in &blocks[i + 1..] {
            assert!(a.1 <= b.0 || b.1 <= a.0, "blocks {a:?} and {b:?} overlap");
        }
    }
    let refused = step(&mut state, &allocate(1, BrokerEpoch(one.0 + 100))).result;
    assert!(matches!(
        refused,
        Err(CommandError::StaleBrokerEpoch { .. })
    ));
    let restored: ClusterState =
        serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
    let mut restored = restored;
    let Ok(Outcome::ProducerIdsAllocated { first, .. }) =
        step(&mut restored, &allocate(2, two)).result
    else {
        panic!("allocation refused");
    };
    assert!(blocks.iter().all(|b| first >= b.1));
}
