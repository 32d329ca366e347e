//! A real shard, alone on one executor, following a leader that does not
//! exist: the metadata it applies makes it a follower of partition t-0, and
//! the test hands it its leader's answers directly. It shows that
//! - a new leader reporting a lower high watermark than the follower holds
//!   lowers the follower's (it used to abort the broker);
//! - a follower whose log ends below the leader's log start drops its log and
//!   starts over there (it used to retry forever);
//! - a follower that becomes leader while it cuts a diverged suffix keeps its
//!   log (the cut used to go ahead on the new leader's log);
//! - an older role arriving after a newer one is ignored;
//! - `desired_replicas`, the pure half of reconciling, places each replica
//!   on its broker and shard with the role the view gives it.

mod support;

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use broker::config::{BrokerConfig, FileConfig};
use broker::partition::PartitionKey;
use broker::shard::{MeshMessage, Replica, Shard};
use bytes::Bytes;
use protocol::control::messages::{BrokerView, ImageView, MetadataUpdate};
use protocol::control::records::{
    BrokerEndpoints, PartitionRecord, Replica as ReplicaRecord, TopicRecord,
};
use protocol::replica_fetch::FetchedPartition as Fetched;
use protocol::{
    BrokerEpoch, BrokerId, LeaderEpoch, MetadataVersion, PartitionEpoch, ShardIndex, TopicId,
};
use protocol::{ErrorCode, LeaderEpoch as BatchEpoch, Offset};

const ME: u32 = 1;
const LEADER: u32 = 2;
const MY_EPOCH: u64 = 7;

fn broker(id: u32, epoch: u64) -> BrokerView {
    BrokerView {
        id: BrokerId(id),
        epoch: BrokerEpoch(epoch),
        // Nothing listens there: the follower's own fetcher never gets an
        // answer, so only the test's answers reach the replica.
        endpoints: BrokerEndpoints {
            client: "127.0.0.1:9".into(),
            shards: vec!["127.0.0.1:9".into()],
        },
        fenced: false,
    }
}

/// The metadata at `version`: partition t-0 on brokers 1 and 2, led by
/// `leader` at `leader_epoch`.
fn image(version: u64, leader: u32, leader_epoch: i32, partition_epoch: i32) -> MetadataUpdate {
    let replica = |b: u32| ReplicaRecord {
        broker_id: BrokerId(b),
        shard: ShardIndex(0),
    };
    MetadataUpdate::Image(ImageView {
        metadata_version: MetadataVersion(version),
        brokers: vec![broker(ME, MY_EPOCH), broker(LEADER, 3)],
        topics: vec![TopicRecord {
            id: TopicId(1),
            name: "t".into(),
            replication_factor: 2,
            config: Default::default(),
            partitions: vec![PartitionRecord {
                replicas: vec![replica(LEADER), replica(ME)],
                isr: vec![BrokerId(ME), BrokerId(LEADER)],
                leader: Some(BrokerId(leader)),
                leader_epoch: LeaderEpoch(leader_epoch),
                partition_epoch: PartitionEpoch(partition_epoch),
            }],
        }],
    })
}

fn key() -> PartitionKey {
    PartitionKey {
        topic: "t".into(),
        partition: 0,
    }
}

/// `count` batches of 4 records each, stamped as the leader stored them from
/// `base` on at `epoch`.
fn leader_batches(first_tag: u64, count: u64, base: i64, epoch: i32) -> Bytes {
    let mut out = Vec::new();
    for i in 0..count {
        let mut batch = support::batch(first_tag + i, 4, 1_000, 100);
        let offset = base + 4 * i as i64;
        protocol::record_batch::stamp(&mut batch, Offset(offset), BatchEpoch(epoch));
        out.extend_from_slice(&batch);
    }
    Bytes::from(out)
}

fn answer(records: Bytes, high_watermark: i64) -> Fetched {
    Fetched {
        error: ErrorCode::None,
        high_watermark,
        log_start_offset: 0,
        log_end_offset: -1,
        diverging: None,
        records,
    }
}

/// Runs `test` with a shard of broker 1 that follows t-0.
fn with_follower<F, Fut>(data_dir: &Path, test: F)
where
    F: Fn(Rc<Shard>, Rc<Replica>) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let file = FileConfig {
        node_id: Some(ME as i32),
        data_dir: Some(data_dir.to_path_buf()),
        cores: Some(1),
        ..FileConfig::default()
    };
    let config = Rc::new(BrokerConfig::from_file_config(file).expect("config"));
    let config = Arc::new(std::sync::Mutex::new(Some((*config).clone())));
    let outputs = broker::runtime::shards::run_shards::<MeshMessage, _, _, _>(
        &[0],
        broker::runtime::shards::ExecutorOptions {
            mesh_queue_max: 16,
            idle_spin: Duration::ZERO,
            io_memory_bytes: broker::runtime::IO_MEMORY_BYTES,
            blocking_threads: 1,
        },
        Arc::new(AtomicBool::new(false)),
        move |ctx| {
            let (test, config) = (test.clone(), config.clone());
            async move {
                let config = Rc::new(config.lock().unwrap().take().expect("one shard"));
                let clock = Rc::new(broker::clock::SystemClock);
                let shard = Rc::new(Shard::new(0, 1, config, clock, ctx.mesh));
                shard.set_broker_epoch(MY_EPOCH);
                shard
                    .clone()
                    .publish_metadata(image(1, LEADER, 1, 1))
                    .await
                    .expect("metadata applies");
                let replica = shard.replica_of(&key()).expect("replica");
                assert!(!replica.role().leader, "a follower");
                test(shard.clone(), replica).await;
                shard.stop();
                shard.close_all().await;
            }
        },
    )
    .expect("shard runs");
    assert_eq!(outputs.len(), 1);
}

#[test]
fn a_lower_high_watermark_from_a_new_leader_lowers_the_followers() {
    let dir = tempfile::tempdir().unwrap();
    with_follower(dir.path(), |shard, replica| async move {
        shard
            .apply_fetched(
                &key(),
                &replica,
                LeaderEpoch(1),
                answer(leader_batches(0, 5, 0, 1), 16),
            )
            .await
            .expect("applied");
        assert_eq!(replica.log.log_end_offset(), Offset(20));
        assert_eq!(replica.high_watermark.get(), 16);
        // A new leader that learned a lower watermark (it was behind as a
        // follower) answers with it.
        shard
            .apply_fetched(&key(), &replica, LeaderEpoch(1), answer(Bytes::new(), 8))
            .await
            .expect("applied");
        assert_eq!(replica.high_watermark.get(), 8);
    });
}

#[test]
fn a_follower_below_the_leaders_log_start_starts_over_there() {
    let dir = tempfile::tempdir().unwrap();
    with_follower(dir.path(), |shard, replica| async move {
        shard
            .apply_fetched(
                &key(),
                &replica,
                LeaderEpoch(1),
                answer(leader_batches(0, 2, 0, 1), 8),
            )
            .await
            .expect("applied");
        assert_eq!(replica.log.log_end_offset(), Offset(8));
        let gone = Fetched {
            error: ErrorCode::OffsetOutOfRange,
            log_start_offset: 1_000,
            log_end_offset: 1_200,
            ..answer(Bytes::new(), 1_100)
        };
        shard
            .apply_fetched(&key(), &replica, LeaderEpoch(1), gone)
            .await
            .expect("restarted");
        assert_eq!(replica.log.log_start_offset(), Offset(1_000));
        assert_eq!(replica.log.log_end_offset(), Offset(1_000));
        assert_eq!(replica.high_watermark.get(), 1_000);
        // It now follows from there.
        shard
            .apply_fetched(
                &key(),
                &replica,
                LeaderEpoch(1),
                answer(leader_batches(10, 2, 1_000, 1), 1_008),
            )
            .await
            .expect("applied");
        assert_eq!(replica.log.log_end_offset(), Offset(1_008));
        replica.log.check_invariants();
    });
    // The restart survives a reopen: the log starts at 1 000.
    let log_dir = dir.path().join("topics").join("t-0");
    support::run(async move {
        let clock = Rc::new(broker::clock::ManualClock::new(0));
        let log = support::open(&log_dir, broker::log::LogConfig::default(), &clock).await;
        assert_eq!(log.log_start_offset(), Offset(1_000));
        assert_eq!(log.log_end_offset(), Offset(1_008));
    });
}

#[test]
fn a_follower_that_becomes_leader_while_cutting_keeps_its_log() {
    let dir = tempfile::tempdir().unwrap();
    with_follower(dir.path(), |shard, replica| async move {
        shard
            .apply_fetched(
                &key(),
                &replica,
                LeaderEpoch(1),
                answer(leader_batches(0, 10, 0, 1), 40),
            )
            .await
            .expect("applied");
        assert_eq!(replica.log.log_end_offset(), Offset(40));
        let cut = Rc::new(RefCell::new(None));
        let task = {
            let (shard, replica, cut) = (shard.clone(), replica.clone(), cut.clone());
            broker::runtime::spawn(async move {
                let diverging = Fetched {
                    diverging: Some((0, 12)),
                    ..answer(Bytes::new(), 40)
                };
                *cut.borrow_mut() = Some(
                    shard
                        .apply_fetched(&key(), &replica, LeaderEpoch(1), diverging)
                        .await,
                );
            })
        };
        // The cut has started (it reads the segment to find the batch
        // boundary); meanwhile this broker is made leader at epoch 2.
        futures_lite::future::yield_now().await;
        shard
            .clone()
            .publish_metadata(image(2, ME, 2, 2))
            .await
            .expect("metadata applies");
        assert!(replica.role().leader, "leads now");
        task.await;
        assert!(cut.borrow().as_ref().is_some_and(|r| r.is_ok()));
        assert_eq!(
            replica.log.log_end_offset(),
            Offset(40),
            "a leader's log is never cut by its follower past"
        );
    });
}

#[test]
fn an_older_role_arriving_late_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    with_follower(dir.path(), |shard, replica| async move {
        shard
            .clone()
            .publish_metadata(image(2, ME, 2, 5))
            .await
            .expect("applies");
        assert_eq!(replica.role().partition_epoch, PartitionEpoch(5));
        // The same leadership's older record (say a delta that crossed this
        // leader's own ISR change) must not undo it.
        shard
            .clone()
            .publish_metadata(image(3, ME, 2, 4))
            .await
            .expect("applies");
        let role = replica.role();
        assert!(role.leader);
        assert_eq!(role.partition_epoch, PartitionEpoch(5));
    });
}

#[test]
fn desired_replicas_follow_the_view_for_each_broker_and_shard() {
    use broker::cluster_view::ClusterView;
    use broker::log::LogConfig;
    use broker::shard::desired_replicas;
    let mut view = ClusterView::default();
    view.apply(image(1, LEADER, 4, 6)).expect("image applies");
    let defaults = LogConfig::default();

    let (mine, unusable) = desired_replicas(&view, &defaults, BrokerId(ME), 0);
    assert!(unusable.is_empty());
    let follower = &mine[&key()];
    assert!(!follower.role.leader);
    assert_eq!(follower.role.leader_epoch, LeaderEpoch(4));
    assert_eq!(follower.role.partition_epoch, PartitionEpoch(6));
    assert_eq!(
        follower.role.leader_endpoint.as_deref(),
        Some("127.0.0.1:9")
    );
    assert_eq!(follower.role.replicas, vec![BrokerId(LEADER), BrokerId(ME)]);
    assert_eq!(follower.topic_id, 1);

    let (theirs, _) = desired_replicas(&view, &defaults, BrokerId(LEADER), 0);
    let leader = &theirs[&key()];
    assert!(leader.role.leader);
    assert_eq!(leader.role.leader_endpoint, None);

    // Another shard of the broker, and a broker holding no replica.
    assert!(desired_replicas(&view, &defaults, BrokerId(ME), 1)
        .0
        .is_empty());
    assert!(desired_replicas(&view, &defaults, BrokerId(9), 0)
        .0
        .is_empty());
}
