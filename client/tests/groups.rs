//! Consumer groups on real broker processes:
//! - three members of one group split a 12-partition topic 4/4/4; a fourth
//!   joins and only the partitions that move change owner, while the others
//!   keep reading through the rebalance; a member process killed with -9
//!   loses its partitions after its session timeout; a member that stopped
//!   polling past its session is fenced and cannot commit;
//! - commit after processing: a `ringlog consume --group` process killed
//!   with -9 again and again re-reads from its last commit, and over the
//!   whole history no record is skipped;
//! - two groups read the same topic independently; `reset --to @T` replays
//!   from T; a dry run changes nothing;
//! - the coordinator's broker is killed (three brokers, RF 3
//!   `__consumer_offsets`): a new coordinator loads the offsets and the
//!   group continues from its last commits, none lost.

mod real_broker;
mod real_cluster;
mod real_quorum;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use client::{
    Acks, Admin, ClientConfig, ClientError, GroupConfig, GroupConsumer, OffsetReset, Producer,
    ProducerConfig, ProducerRecord, ResetTo, TopicPartition,
};
use real_broker::{free_port_block, RealBroker};
use real_cluster::Brokers;
use real_quorum::Quorum;

fn groups_config(dir: &Path) -> String {
    let path = dir.join("groups.toml");
    std::fs::write(
        &path,
        "[groups]\noffsets_topic_partitions = 4\nlag_probe_interval_ms = 200\n",
    )
    .unwrap();
    path.to_string_lossy().into_owned()
}

/// One broker with two shards and a small `__consumer_offsets`.
fn start_broker(root: &Path) -> (RealBroker, String) {
    let config = groups_config(root);
    let port = free_port_block(2);
    let broker = RealBroker::start_node(&root.join("data"), port, 1, 2, &["--config", &config]);
    (broker, format!("127.0.0.1:{port}"))
}

fn group_config(group: &str, session_timeout_ms: u32) -> GroupConfig {
    let mut config = GroupConfig::new(group.to_string());
    config.session_timeout_ms = session_timeout_ms;
    config.auto_commit_interval_ms = 200;
    config.consumer.offset_reset = OffsetReset::Earliest;
    config
}

/// What one member received: (partition, offset, record timestamp).
type Received = Arc<Mutex<Vec<(i32, i64, i64)>>>;

/// A member polling in its own task until told to stop (then it closes:
/// commit and leave) or aborted (a crash: no leave).
struct Member {
    member_id: String,
    received: Received,
    assignment: Arc<Mutex<BTreeSet<i32>>>,
    stop: Arc<AtomicBool>,
    /// Set while the member must not poll (a frozen process).
    frozen: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<GroupConsumer>,
}

impl Member {
    async fn start(bootstrap: &str, topic: &str, config: GroupConfig) -> Member {
        let mut consumer = GroupConsumer::connect(bootstrap, ClientConfig::default(), config)
            .await
            .unwrap();
        consumer.subscribe(&[topic.to_string()]).unwrap();
        let member_id = consumer.member_id().to_string();
        let received: Received = Arc::default();
        let assignment: Arc<Mutex<BTreeSet<i32>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let frozen = Arc::new(AtomicBool::new(false));
        let task = {
            let (received, assignment, stop, frozen) = (
                received.clone(),
                assignment.clone(),
                stop.clone(),
                frozen.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    if frozen.load(Ordering::Relaxed) {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                    match consumer.poll(Duration::from_millis(100)).await {
                        Ok(records) => {
                            let mut r = received.lock().unwrap();
                            for record in records {
                                r.push((record.partition, record.offset, record.timestamp_ms));
                            }
                        }
                        Err(e) => eprintln!("poll: {e}"),
                    }
                    *assignment.lock().unwrap() = consumer
                        .assignment()
                        .iter()
                        .map(|tp| tp.partition)
                        .collect();
                }
                consumer
            })
        };
        Member {
            member_id,
            received,
            assignment,
            stop,
            frozen,
            task,
        }
    }

    fn assignment(&self) -> BTreeSet<i32> {
        self.assignment.lock().unwrap().clone()
    }
}

/// Waits until the members' assignments have these sizes and cover every
/// partition exactly once.
async fn wait_split(members: &[&Member], sizes: &[usize], partitions: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let sets: Vec<BTreeSet<i32>> = members.iter().map(|m| m.assignment()).collect();
        let mut got: Vec<usize> = sets.iter().map(BTreeSet::len).collect();
        got.sort_unstable();
        let union: BTreeSet<i32> = sets.iter().flatten().copied().collect();
        let total: usize = got.iter().sum();
        if got == sizes && union.len() == partitions && total == partitions {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: assignments stuck at {sets:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Produces one record per partition every `every`, until stopped; returns
/// how many were acknowledged per partition.
fn spawn_producer(
    bootstrap: String,
    topic: &str,
    partitions: i32,
    every: Duration,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<BTreeMap<i32, i64>> {
    let topic = topic.to_string();
    tokio::spawn(async move {
        let producer = Producer::connect(
            &bootstrap,
            ClientConfig::default(),
            ProducerConfig {
                acks: Acks::All,
                ..ProducerConfig::default()
            },
        )
        .await
        .unwrap();
        let mut acked: BTreeMap<i32, i64> = BTreeMap::new();
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let mut deliveries = Vec::new();
            for partition in 0..partitions {
                let record = ProducerRecord {
                    topic: topic.clone(),
                    partition: Some(partition),
                    value: Some(Bytes::from(format!("v-{n:08}"))),
                    ..ProducerRecord::default()
                };
                n += 1;
                deliveries.push(producer.enqueue(record).await.unwrap());
            }
            for d in deliveries {
                // A leader failover may fail a few; those are not counted.
                if let Ok(delivery) = d.await {
                    *acked.entry(delivery.0).or_default() += 1;
                }
            }
            tokio::time::sleep(every).await;
        }
        producer.close().await.unwrap();
        acked
    })
}

/// Offsets of one partition received by anyone, checked for holes.
fn assert_no_holes(all: &[(i32, i64, i64)], partition: i32, up_to: i64) {
    let offsets: BTreeSet<i64> = all
        .iter()
        .filter(|r| r.0 == partition)
        .map(|r| r.1)
        .collect();
    for offset in 0..up_to {
        assert!(
            offsets.contains(&offset),
            "partition {partition}: offset {offset} was never delivered"
        );
    }
}

#[test]
fn members_split_rebalance_incrementally_and_are_removed_or_fenced() {
    let root = tempfile::tempdir().unwrap();
    let (_broker, bootstrap) = start_broker(root.path());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let admin = Admin::connect(&bootstrap, ClientConfig::default()).await.unwrap();
        admin.create_topic("t", 12, 1, &[]).await.unwrap();
        let stop_producing = Arc::new(AtomicBool::new(false));
        let producer = spawn_producer(bootstrap.clone(), "t", 12, Duration::from_millis(20), stop_producing.clone());

        let a = Member::start(&bootstrap, "t", group_config("g", 6_000)).await;
        let b = Member::start(&bootstrap, "t", group_config("g", 6_000)).await;
        let c = Member::start(&bootstrap, "t", group_config("g", 6_000)).await;
        wait_split(&[&a, &b, &c], &[4, 4, 4], 12, "three members").await;
        let before: Vec<BTreeSet<i32>> = [&a, &b, &c].iter().map(|m| m.assignment()).collect();

        // A fourth member: exactly the partitions that must move move.
        let d = Member::start(&bootstrap, "t", group_config("g", 6_000)).await;
        let joined_ms = now_ms();
        wait_split(&[&a, &b, &c, &d], &[3, 3, 3, 3], 12, "four members").await;
        let settled_ms = now_ms();
        let after: Vec<BTreeSet<i32>> = [&a, &b, &c].iter().map(|m| m.assignment()).collect();
        for i in 0..3 {
            assert!(after[i].is_subset(&before[i]), "member {i} gained {:?} -> {:?}", before[i], after[i]);
        }
        // Members whose partitions stayed kept reading them through the
        // rebalance: records stamped inside it reached their old owner.
        tokio::time::sleep(Duration::from_millis(500)).await;
        for (i, m) in [&a, &b, &c].iter().enumerate() {
            let got = m.received.lock().unwrap();
            for p in &after[i] {
                assert!(
                    got.iter().any(|r| r.0 == *p && r.2 >= joined_ms && r.2 <= settled_ms),
                    "member {i} read nothing of partition {p} stamped during the rebalance ({joined_ms}..{settled_ms})"
                );
            }
        }

        // A member process killed with -9: its partitions move once its
        // session (4 s) ends.
        let killed_out = root.path().join("killed.txt");
        let mut cli = start_cli_member_of_g(&bootstrap, &killed_out);
        wait_cli_member_owns(&admin, &[&a, &b, &c, &d]).await;
        cli.kill().unwrap();
        cli.wait().unwrap();
        wait_split(&[&a, &b, &c, &d], &[3, 3, 3, 3], 12, "after kill -9 of a member").await;

        // A member process stopped with SIGSTOP past its session: its
        // partitions move on, and once it continues it cannot commit over
        // the new owners (their committed offsets never go back).
        let stopped_out = root.path().join("stopped.txt");
        let mut cli = start_cli_member_of_g(&bootstrap, &stopped_out);
        let (stopped_id, stopped_parts) = wait_cli_member_owns(&admin, &[&a, &b, &c, &d]).await;
        signal(&cli, "-STOP");
        wait_split(&[&a, &b, &c, &d], &[3, 3, 3, 3], 12, "after SIGSTOP of a member").await;
        let gone = admin.describe_group("g").await.unwrap();
        assert!(gone.members.iter().all(|m| m.member_id != stopped_id), "the stopped member is still in the group");
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        let committed_of = |all: BTreeMap<TopicPartition, client::CommittedOffset>| -> BTreeMap<i32, i64> {
            all.into_iter().filter(|(tp, _)| stopped_parts.contains(&tp.partition)).map(|(tp, c)| (tp.partition, c.offset)).collect()
        };
        let before = committed_of(admin.fetch_committed("g", None).await.unwrap());
        signal(&cli, "-CONT");
        let watch_until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < watch_until {
            let now = committed_of(admin.fetch_committed("g", None).await.unwrap());
            for (p, offset) in &before {
                assert!(now[p] >= *offset, "partition {p}: committed offset went back from {offset} to {} after the stopped member continued", now[p]);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        cli.kill().unwrap();
        cli.wait().unwrap();
        wait_split(&[&a, &b, &c, &d], &[3, 3, 3, 3], 12, "after the stopped member left").await;

        // A member that stops polling (a frozen process) past its session
        // is removed; when it wakes up it cannot commit.
        d.frozen.store(true, Ordering::Relaxed);
        wait_split(&[&a, &b, &c], &[4, 4, 4], 12, "after a member froze").await;
        d.stop.store(true, Ordering::Relaxed);
        d.frozen.store(false, Ordering::Relaxed);
        let mut zombie = d.task.await.unwrap();
        let mut offsets = BTreeMap::new();
        offsets.insert(TopicPartition { topic: "t".into(), partition: 0 }, 1);
        let refused = zombie.commit_offsets(&offsets).await;
        assert!(
            matches!(&refused, Err(e) if is_fenced(e)),
            "a fenced member committed: {refused:?}"
        );
        drop(zombie);

        stop_producing.store(true, Ordering::Relaxed);
        let acked = producer.await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut all = Vec::new();
        for m in [a, b, c] {
            m.stop.store(true, Ordering::Relaxed);
            let consumer = m.task.await.unwrap();
            consumer.close().await.unwrap();
            all.extend(m.received.lock().unwrap().iter().copied());
        }
        all.extend(d.received.lock().unwrap().iter().copied());
        // What the member processes printed before they were killed (the
        // members that took their partitions over started at their commits).
        all.extend(read_cli_output(&killed_out));
        all.extend(read_cli_output(&stopped_out));
        // Nothing was skipped: every acknowledged offset reached a member
        // (partitions moved with their committed positions).
        for (partition, count) in acked {
            assert_no_holes(&all, partition, count);
        }
    });
}

/// `GET /metrics` from the admin port of the broker at `bootstrap`.
fn scrape_metrics(bootstrap: &str) -> String {
    let port: u16 = bootstrap.rsplit(':').next().unwrap().parse().unwrap();
    real_broker::scrape_metrics(port)
}

/// The value of a group metric for topic t3, summed over shards.
fn metric(text: &str, name: &str, group: &str, partition: i32) -> Option<f64> {
    metric_of(text, name, group, "t3", partition)
}

fn metric_of(text: &str, name: &str, group: &str, topic: &str, partition: i32) -> Option<f64> {
    let labels = format!("group=\"{group}\",topic=\"{topic}\",partition=\"{partition}\"}}");
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(&labels))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .reduce(|a, b| a + b)
}

/// `ringlog consume t --group g` as a member process with a 4 s session,
/// committing every 100 ms, printing `partition offset timestamp` lines to
/// `out`.
fn start_cli_member_of_g(bootstrap: &str, out: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_ringlog"))
        .args([
            "--bootstrap",
            bootstrap,
            "consume",
            "t",
            "--group",
            "g",
            "--session-timeout-ms",
            "4000",
            "--commit-interval-ms",
            "100",
            "--format",
            "{partition} {offset} {timestamp}",
        ])
        .stdout(std::fs::File::create(out).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// What a CLI member printed, as (partition, offset, timestamp).
fn read_cli_output(out: &Path) -> Vec<(i32, i64, i64)> {
    std::fs::read_to_string(out)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((
                f.first()?.parse().ok()?,
                f.get(1)?.parse().ok()?,
                f.get(2)?.parse().ok()?,
            ))
        })
        .collect()
}

/// Waits until a fifth member (the CLI process) owns partitions taken from
/// the in-process members; returns its member id and partitions.
async fn wait_cli_member_owns(admin: &Admin, members: &[&Member]) -> (String, BTreeSet<i32>) {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let owned: usize = members.iter().map(|m| m.assignment().len()).sum();
        let ours: BTreeSet<String> = members.iter().map(|m| m.member_id.clone()).collect();
        let group = admin.describe_group("g").await.unwrap();
        let other = group.members.iter().find(|m| !ours.contains(&m.member_id));
        if let Some(other) =
            other.filter(|o| !o.assigned.is_empty() && owned + o.assigned.len() == 12)
        {
            let parts = other.assigned.iter().map(|tp| tp.partition).collect();
            return (other.member_id.clone(), parts);
        }
        assert!(
            Instant::now() < deadline,
            "the CLI member never got partitions"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

fn is_fenced(e: &ClientError) -> bool {
    let text = e.to_string();
    text.contains("UNKNOWN_MEMBER_ID") || text.contains("FENCED_MEMBER_EPOCH")
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn start_cli_member(bootstrap: &str, group: &str, out: &Path, until_end: bool) -> Child {
    let mut args = vec![
        "--bootstrap",
        bootstrap,
        "consume",
        "t2",
        "--group",
        group,
        "--session-timeout-ms",
        "2000",
        "--commit-interval-ms",
        "100",
    ];
    if until_end {
        args.push("--until-end");
    }
    Command::new(env!("CARGO_BIN_EXE_ringlog"))
        .args(&args)
        .stdout(std::fs::File::create(out).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn a_member_killed_between_processing_and_commit_rereads_and_skips_nothing() {
    let root = tempfile::tempdir().unwrap();
    let (_broker, bootstrap) = start_broker(root.path());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let admin = runtime
        .block_on(Admin::connect(&bootstrap, ClientConfig::default()))
        .unwrap();
    runtime
        .block_on(admin.create_topic("t2", 3, 1, &[]))
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let _entered = runtime.enter();
        spawn_producer(
            bootstrap.clone(),
            "t2",
            3,
            Duration::from_millis(2),
            stop.clone(),
        )
    };

    let mut outputs = Vec::new();
    let mut starts: Vec<Option<BTreeMap<TopicPartition, i64>>> = Vec::new();
    for round in 0..5 {
        let committed = runtime.block_on(admin.fetch_committed("kill9", None)).ok();
        starts.push(committed.map(|c| c.into_iter().map(|(tp, o)| (tp, o.offset)).collect()));
        let out = root.path().join(format!("out-{round}.txt"));
        let mut child = start_cli_member(&bootstrap, "kill9", &out, false);
        std::thread::sleep(Duration::from_millis(1_500 + 300 * round as u64));
        child.kill().unwrap(); // SIGKILL: between processing and commit, somewhere.
        child.wait().unwrap();
        outputs.push(out);
        // Its session must end before the next incarnation gets everything.
        std::thread::sleep(Duration::from_millis(2_500));
    }
    stop.store(true, Ordering::Relaxed);
    let acked = runtime.block_on(producer).unwrap();
    let out = root.path().join("out-final.txt");
    let mut last = start_cli_member(&bootstrap, "kill9", &out, true);
    let deadline = Instant::now() + Duration::from_secs(60);
    while last.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the last member never reached the end"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    outputs.push(out);

    let mut seen = BTreeSet::new();
    for path in &outputs {
        for line in std::fs::read_to_string(path).unwrap().lines() {
            seen.insert(line.to_string());
        }
    }
    let produced: u64 = acked.values().map(|n| *n as u64).sum();
    for n in 0..produced {
        assert!(
            seen.contains(&format!("v-{n:08}")),
            "record v-{n:08} was skipped"
        );
    }
    // Commits happened between kills: later incarnations did not start over.
    let progressed = starts
        .iter()
        .flatten()
        .filter(|s| s.values().any(|o| *o > 0))
        .count();
    assert!(
        progressed >= 2,
        "commits did not move between kills: {starts:?}"
    );
}

#[test]
fn groups_are_independent_and_reset_replays_from_a_time() {
    let root = tempfile::tempdir().unwrap();
    let (_broker, bootstrap) = start_broker(root.path());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let admin = Admin::connect(&bootstrap, ClientConfig::default())
            .await
            .unwrap();
        admin.create_topic("t3", 2, 1, &[]).await.unwrap();
        let producer = Producer::connect(
            &bootstrap,
            ClientConfig::default(),
            ProducerConfig::default(),
        )
        .await
        .unwrap();
        let base_ms = now_ms() - 60_000;
        // 100 records per partition, stamped one second apart.
        for i in 0..100i64 {
            for partition in 0..2 {
                let record = ProducerRecord {
                    topic: "t3".into(),
                    partition: Some(partition),
                    value: Some(Bytes::from(format!("{partition}-{i}"))),
                    timestamp_ms: Some(base_ms + i * 100),
                    ..ProducerRecord::default()
                };
                producer.enqueue(record).await.unwrap();
            }
        }
        producer.flush().await.unwrap();

        let read_all = |group: &'static str, expected: usize| {
            let bootstrap = bootstrap.clone();
            async move {
                let mut consumer = GroupConsumer::connect(
                    &bootstrap,
                    ClientConfig::default(),
                    group_config(group, 6_000),
                )
                .await
                .unwrap();
                consumer.subscribe(&["t3".to_string()]).unwrap();
                let mut got = Vec::new();
                let deadline = Instant::now() + Duration::from_secs(30);
                while got.len() < expected && Instant::now() < deadline {
                    got.extend(consumer.poll(Duration::from_millis(200)).await.unwrap());
                }
                consumer.commit().await.unwrap();
                consumer.close().await.unwrap();
                got
            }
        };
        assert_eq!(read_all("one", 200).await.len(), 200);
        assert_eq!(
            read_all("two", 200).await.len(),
            200,
            "another group reads everything again"
        );
        let committed = admin.fetch_committed("one", None).await.unwrap();
        assert!(committed.values().all(|c| c.offset == 100), "{committed:?}");

        // Reset "one" to the 60th record's time: a dry run changes nothing.
        let at = base_ms + 60 * 100;
        let planned = admin
            .reset_offsets("one", "t3", ResetTo::Timestamp(at), true)
            .await
            .unwrap();
        assert!(
            planned
                .iter()
                .all(|r| r.new_offset == 60 && r.old_offset == Some(100)),
            "{planned:?}"
        );
        let unchanged = admin.fetch_committed("one", None).await.unwrap();
        assert!(unchanged.values().all(|c| c.offset == 100));
        // The same through the CLI.
        let output = Command::new(env!("CARGO_BIN_EXE_ringlog"))
            .args([
                "--bootstrap",
                &bootstrap,
                "group",
                "reset",
                "one",
                "--topic",
                "t3",
                "--to",
                &format!("@{at}"),
                "--dry-run",
            ])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let printed = String::from_utf8_lossy(&output.stdout);
        assert!(
            printed
                .lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["0", "100", "60"]),
            "{printed}"
        );
        let unchanged = admin.fetch_committed("one", None).await.unwrap();
        assert!(
            unchanged.values().all(|c| c.offset == 100),
            "a dry run committed: {unchanged:?}"
        );
        admin
            .reset_offsets("one", "t3", ResetTo::Timestamp(at), false)
            .await
            .unwrap();
        // The coordinator's metrics show the lag: 40 records per partition,
        // the oldest unread one stamped about 54 s ago.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let metrics = scrape_metrics(&bootstrap);
            let records = metric(&metrics, "ringlog_group_lag_records", "one", 0);
            let seconds = metric(&metrics, "ringlog_group_lag_seconds", "one", 0);
            if records == Some(40.0) && seconds.is_some_and(|s| s >= 50.0) {
                assert_eq!(
                    metric(&metrics, "ringlog_group_lag_records", "two", 1),
                    Some(0.0)
                );
                assert_eq!(
                    metric(&metrics, "ringlog_group_lag_seconds", "two", 1),
                    Some(0.0)
                );
                assert_eq!(
                    metric(&metrics, "ringlog_group_committed_offset", "one", 1),
                    Some(60.0)
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no lag in the metrics:\n{metrics}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let replayed = read_all("one", 80).await;
        let mut values: Vec<String> = replayed
            .iter()
            .map(|r| String::from_utf8(r.value.clone().unwrap().to_vec()).unwrap())
            .collect();
        values.sort();
        let mut expected: Vec<String> = (60..100)
            .flat_map(|i| [format!("0-{i}"), format!("1-{i}")])
            .collect();
        expected.sort();
        assert_eq!(values, expected, "the group replays from the reset time");
        let two = admin.fetch_committed("two", None).await.unwrap();
        assert!(
            two.values().all(|c| c.offset == 100),
            "the other group is untouched"
        );
        // An empty group can be deleted.
        admin.delete_group("one").await.unwrap();
        assert!(admin.describe_group("one").await.is_err());
    });
}

#[test]
fn a_new_coordinator_loads_every_commit_after_the_old_one_is_killed() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("groups-rf3.toml");
    std::fs::write(
        &path,
        "[groups]\noffsets_topic_partitions = 2\noffsets_topic_replication_factor = 3\nlag_probe_interval_ms = 200\n",
    )
    .unwrap();
    let config = path.to_string_lossy().into_owned();
    let quorum = Quorum::start(&["--session-timeout-ms", "2000"]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(quorum.leader(Duration::from_secs(20)));
    let mut brokers = Brokers::start_with(
        root.path(),
        quorum.controller_list(),
        1,
        &["--config", &config],
    );
    let bootstrap = brokers.bootstrap_all();
    runtime.block_on(async {
        let admin = Admin::connect(&bootstrap, ClientConfig::default())
            .await
            .unwrap();
        admin.create_topic("t4", 4, 3, &[]).await.unwrap();
    });
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let _entered = runtime.enter();
        spawn_producer(
            bootstrap.clone(),
            "t4",
            4,
            Duration::from_millis(10),
            stop.clone(),
        )
    };
    let (member, coordinator) = runtime.block_on(async {
        let mut config = group_config("rf3", 10_000);
        config.consumer.offset_reset = OffsetReset::Earliest;
        let member = Member::start(&bootstrap, "t4", config).await;
        wait_split(&[&member], &[4], 4, "one member").await;
        let admin = Admin::connect(&bootstrap, ClientConfig::default())
            .await
            .unwrap();
        let coordinator = admin.find_coordinator("rf3").await.unwrap();
        // Let it read and commit for a while.
        tokio::time::sleep(Duration::from_secs(2)).await;
        (member, coordinator)
    });
    // The coordinator probes the lag of every partition, those led by the
    // other brokers too.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let metrics = scrape_metrics(&brokers.bootstrap(coordinator.node_id as u32));
        let probed = (0..4)
            .filter(|p| metric_of(&metrics, "ringlog_group_lag_records", "rf3", "t4", *p).is_some())
            .count();
        if probed == 4 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "lag not probed on every partition:\n{metrics}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Freeze the member so its commits stop, and note the last ones.
    member.frozen.store(true, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(300));
    let before = runtime.block_on(async {
        let admin = Admin::connect(&bootstrap, ClientConfig::default())
            .await
            .unwrap();
        admin.fetch_committed("rf3", None).await.unwrap()
    });
    assert_eq!(before.len(), 4, "every partition committed: {before:?}");
    assert!(before.values().all(|c| c.offset > 0));
    brokers.kill9(coordinator.node_id as u32);
    let survivors: String = (1..=3)
        .filter(|b| *b != coordinator.node_id as u32)
        .map(|b| brokers.bootstrap(b))
        .collect::<Vec<_>>()
        .join(",");
    runtime.block_on(async {
        let admin = Admin::connect(&survivors, ClientConfig::default())
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(40);
        let after = loop {
            match admin.fetch_committed("rf3", None).await {
                Ok(after) if !after.is_empty() => break after,
                other => {
                    assert!(Instant::now() < deadline, "no new coordinator: {other:?}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        };
        for (tp, c) in &before {
            assert!(
                after.get(tp).is_some_and(|a| a.offset >= c.offset),
                "{tp:?}: {c:?} lost, now {:?}",
                after.get(tp)
            );
        }
        let moved = admin.find_coordinator("rf3").await.unwrap();
        assert_ne!(moved.node_id, coordinator.node_id);
        // The group goes on: the member wakes up, finds the new coordinator
        // and its commits move past the old ones.
        member.frozen.store(false, Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            let now = admin.fetch_committed("rf3", None).await.unwrap_or_default();
            if before
                .iter()
                .all(|(tp, c)| now.get(tp).is_some_and(|n| n.offset > c.offset))
            {
                break;
            }
            assert!(Instant::now() < deadline, "commits did not resume: {now:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        stop.store(true, Ordering::Relaxed);
        member.stop.store(true, Ordering::Relaxed);
        let consumer = member.task.await.unwrap();
        consumer.close().await.unwrap();
        let _ = producer.await;
    });
}
