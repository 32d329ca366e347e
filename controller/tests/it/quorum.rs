//! Three real `ringlog-controller` processes on 127.0.0.1: election and topic
//! creation, failover after SIGKILL of the leader, fencing of a broker that
//! stops heartbeating (its partitions move to another ISR member), and ISR
//! changes by compare-and-set over the wire.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use controller::messages::{AlterIsr, ImageView, SessionState};
use controller::{BrokerEpoch, BrokerId, LeaderEpoch, PartitionIndex};
use protocol::ErrorCode;

use crate::harness::{self, Cluster, POLL_INTERVAL};

const SESSION_TIMEOUT_MS: u64 = 2_000;
const LEADER_WAIT: Duration = Duration::from_secs(15);

/// Creates a topic on the leader, retrying while leadership settles.
fn create_topic_eventually(endpoint: &str, name: &str, rf: u16, deadline: Instant) {
    loop {
        match harness::create_topic(endpoint, name, 3, rf) {
            Ok(outcome) if outcome.result.is_ok() => return,
            other => assert!(Instant::now() < deadline, "create {name}: {other:?}"),
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

// A fresh quorum elects one leader that every controller agrees on; it accepts
// a broker and a topic, and a follower refuses writes with NOT_CONTROLLER and
// the leader's endpoint.
#[test]
fn quorum_elects_a_leader_and_creates_a_topic() {
    let cluster = Cluster::start(3, SESSION_TIMEOUT_MS);
    let deadline = Instant::now() + LEADER_WAIT;
    let (slot, description) = cluster.wait_for_leader(deadline);
    let leader = &cluster.endpoints[slot];
    assert_eq!(description.controllers.len(), 3);
    assert!(description.raft_term >= 1);

    harness::join_broker(leader, 1, deadline);
    create_topic_eventually(leader, "orders", 1, deadline);
    let image = harness::image(leader);
    let topic = image
        .topics
        .iter()
        .find(|t| t.name == "orders")
        .expect("topic");
    assert_eq!(topic.partitions.len(), 3);
    assert!(topic
        .partitions
        .iter()
        .all(|p| p.leader == Some(BrokerId(1))));

    let follower = &cluster.endpoints[(slot + 1) % 3];
    let outcome = harness::create_topic(follower, "refused", 1, 1).expect("call");
    let failure = outcome.result.expect_err("a follower refuses");
    assert_eq!(failure.code, ErrorCode::NotController);
    assert_eq!(failure.leader_endpoint.as_deref(), Some(leader.as_str()));
    let registered = harness::register_broker(follower, 2).expect("call");
    assert_eq!(
        registered
            .expect_err("a follower refuses")
            .leader_endpoint
            .as_deref(),
        Some(leader.as_str())
    );
}

// A leader shrinks and expands its ISR over the wire; a request carrying an
// old partition epoch, or sent by a broker that does not lead, changes
// nothing; brokers see the change as a metadata delta.
#[test]
fn alter_isr_is_compare_and_set_over_the_wire() {
    // Long sessions: these brokers do not heartbeat, and a fence would move
    // the ISR under the test.
    let cluster = Cluster::start(1, 60_000);
    let deadline = Instant::now() + LEADER_WAIT;
    let (slot, _) = cluster.wait_for_leader(deadline);
    let endpoint = &cluster.endpoints[slot];
    for id in 1..=3 {
        harness::join_broker(endpoint, id, deadline);
    }
    create_topic_eventually(endpoint, "isr", 3, deadline);
    let image = harness::image(endpoint);
    let topic = image.topics.iter().find(|t| t.name == "isr").unwrap();
    let record = topic.partitions[0].clone();
    let leader = record.leader.expect("a leader");
    assert_eq!(record.isr.len(), 3);
    let follower = record.isr.iter().copied().find(|b| *b != leader).unwrap();
    let mut shrunk: Vec<BrokerId> = record
        .isr
        .iter()
        .copied()
        .filter(|b| *b != follower)
        .collect();
    shrunk.sort();
    let request = AlterIsr {
        leader_id: leader,
        topic_id: topic.id,
        partition: PartitionIndex(0),
        leader_epoch: record.leader_epoch,
        partition_epoch: record.partition_epoch,
        new_isr: shrunk.clone(),
        new_isr_epochs: Vec::new(),
    };
    let (_, after) = harness::alter_isr(endpoint, &request)
        .expect("call")
        .expect("applied");
    assert_eq!(after.isr, shrunk);
    assert_eq!(after.leader_epoch, record.leader_epoch, "same leadership");
    assert!(after.partition_epoch > record.partition_epoch);

    // The same request again carries a stale partition epoch.
    let stale = harness::alter_isr(endpoint, &request).expect("call");
    assert!(stale.is_err(), "{stale:?}");
    // A broker that does not lead cannot change the ISR.
    let not_leader = AlterIsr {
        leader_id: follower,
        partition_epoch: after.partition_epoch,
        ..request.clone()
    };
    let refused = harness::alter_isr(endpoint, &not_leader).expect("call");
    assert!(refused.is_err(), "{refused:?}");

    // Expanding back, from the current epoch, is applied and published.
    let expand = AlterIsr {
        partition_epoch: after.partition_epoch,
        new_isr: record.isr.clone(),
        ..request
    };
    let (_, expanded) = harness::alter_isr(endpoint, &expand)
        .expect("call")
        .expect("applied");
    assert_eq!(expanded.isr, record.isr);
    let seen = harness::image(endpoint);
    let published = &seen
        .topics
        .iter()
        .find(|t| t.name == "isr")
        .unwrap()
        .partitions[0];
    assert_eq!(published, &expanded);
}

// SIGKILL of the leader: the two survivors elect a new leader, which serves
// the metadata committed before and accepts a new topic within 10 s.
#[test]
fn killing_the_leader_fails_over_within_ten_seconds() {
    let mut cluster = Cluster::start(3, SESSION_TIMEOUT_MS);
    let (old_slot, old) = cluster.wait_for_leader(Instant::now() + LEADER_WAIT);
    let deadline = Instant::now() + LEADER_WAIT;
    harness::join_broker(&cluster.endpoints[old_slot], 1, deadline);
    create_topic_eventually(&cluster.endpoints[old_slot], "before", 1, deadline);

    let killed_at = Instant::now();
    cluster.kill(old_slot);
    let failover_deadline = killed_at + Duration::from_secs(10);
    let (new_slot, new) = cluster.wait_for_leader(failover_deadline);
    let elected_after = killed_at.elapsed();
    assert_ne!(new_slot, old_slot);
    assert!(new.raft_term > old.raft_term);
    let leader = cluster.endpoints[new_slot].clone();
    create_topic_eventually(&leader, "after", 1, failover_deadline);
    let writable_after = killed_at.elapsed();
    println!(
        "controller failover: new leader elected after {} ms, topic created after {} ms",
        elected_after.as_millis(),
        writable_after.as_millis()
    );
    assert!(writable_after < Duration::from_secs(10));
    let image = harness::image(&leader);
    let names: Vec<&str> = image.topics.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["before", "after"]);
}

/// A fake broker: registers, then heartbeats from a thread until paused.
struct FakeBroker {
    paused: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeBroker {
    fn start(endpoint: &str, id: u32, epoch: BrokerEpoch) -> FakeBroker {
        let paused = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let interval = Duration::from_millis(SESSION_TIMEOUT_MS / 6);
        let thread = {
            let (paused, stop, endpoint) = (paused.clone(), stop.clone(), endpoint.to_owned());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if !paused.load(Ordering::Relaxed) {
                        let _ = harness::heartbeat(&endpoint, id, epoch);
                    }
                    std::thread::sleep(interval);
                }
            })
        };
        FakeBroker {
            paused,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for FakeBroker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn leaders_of(
    image: &ImageView,
    topic: &str,
) -> Vec<(Option<BrokerId>, LeaderEpoch, Vec<BrokerId>)> {
    let topic = image
        .topics
        .iter()
        .find(|t| t.name == topic)
        .expect("topic");
    topic
        .partitions
        .iter()
        .map(|p| (p.leader, p.leader_epoch, p.isr.clone()))
        .collect()
}

// A broker that stops heartbeating is fenced within the session timeout plus a
// little, every partition it led gets a new leader from the ISR with a higher
// leader epoch; after registering again it is back, unfenced, with a new epoch.
#[test]
fn a_silent_broker_is_fenced_and_its_partitions_move() {
    let cluster = Cluster::start(3, SESSION_TIMEOUT_MS);
    let deadline = Instant::now() + LEADER_WAIT;
    let (slot, _) = cluster.wait_for_leader(deadline);
    let leader = cluster.endpoints[slot].clone();
    let mut brokers = Vec::new();
    for id in 1..=3 {
        let epoch = harness::join_broker(&leader, id, deadline);
        brokers.push(FakeBroker::start(&leader, id, epoch));
    }
    create_topic_eventually(&leader, "replicated", 3, deadline);
    let before = leaders_of(&harness::image(&leader), "replicated");
    let led_by_1: Vec<usize> = (0..before.len())
        .filter(|&i| before[i].0 == Some(BrokerId(1)))
        .collect();
    assert!(
        !led_by_1.is_empty(),
        "placement gave broker 1 no leadership: {before:?}"
    );

    let silent_at = Instant::now();
    brokers[0].paused.store(true, Ordering::Relaxed);
    let fence_deadline =
        silent_at + Duration::from_millis(SESSION_TIMEOUT_MS) + Duration::from_secs(5);
    let after = loop {
        let image = harness::image(&leader);
        let fenced = image
            .brokers
            .iter()
            .any(|b| b.id == BrokerId(1) && b.fenced);
        if fenced {
            break leaders_of(&image, "replicated");
        }
        assert!(
            Instant::now() < fence_deadline,
            "broker 1 not fenced in time"
        );
        std::thread::sleep(POLL_INTERVAL);
    };
    let moved_after = silent_at.elapsed();
    println!(
        "broker fencing: broker 1 fenced and its {} partitions moved {} ms after its last heartbeat (session timeout {} ms)",
        led_by_1.len(),
        moved_after.as_millis(),
        SESSION_TIMEOUT_MS
    );
    for &i in &led_by_1 {
        let (old_leader, old_epoch, old_isr) = &before[i];
        let (new_leader, new_epoch, new_isr) = &after[i];
        let new_leader = new_leader.expect("a new leader");
        assert_ne!(Some(new_leader), *old_leader);
        assert!(old_isr.contains(&new_leader), "new leader from the ISR");
        assert!(new_epoch > old_epoch, "leader epoch bumped");
        assert!(!new_isr.contains(&BrokerId(1)));
    }

    // Back: it registers again (a new incarnation, a new epoch), after which
    // the old epoch is refused and the new one heartbeats it alive.
    let old_epoch = harness::image(&leader).brokers[0].epoch;
    drop(brokers.remove(0));
    let new_epoch = harness::join_broker(&leader, 1, Instant::now() + LEADER_WAIT);
    assert!(new_epoch > old_epoch);
    assert_eq!(
        harness::heartbeat(&leader, 1, old_epoch).expect("call"),
        Ok(SessionState::Unregistered)
    );
    let description = harness::describe_cluster(&leader)
        .expect("call")
        .expect("ok");
    let broker = description
        .brokers
        .iter()
        .find(|b| b.broker.id == BrokerId(1))
        .expect("registered");
    assert!(!broker.broker.fenced);
    assert_eq!(broker.broker.epoch, new_epoch);
}
