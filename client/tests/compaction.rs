//! Compacted topics on real broker processes:
//! - a keyed topic written with many updates per key is compacted by the
//!   broker's cleaner; a consumer that starts afterwards, from the earliest
//!   offset, sees every key once with its final value (tombstones as null
//!   values), after a restart too, and `verify-log` passes on the directory;
//! - the same on an RF 3 topic whose leader is killed with kill -9 once
//!   every replica compacted: the new leader serves every final value once;
//! - kill -9 of the broker at each step of a segment swap: it restarts, the
//!   partition is valid and no key's final value is lost;
//! - a topic created with the delete policy and turned compacted later
//!   (AlterTopicConfigs through the controller) is compacted; invalid
//!   changes and unknown topics are refused; a removed key falls back to the
//!   broker default;
//! - a corrupt segment makes only its partition uncleanable (logged, exported
//!   as a metric), leaves its files untouched, and neither the shard nor
//!   another compacted partition stops.

mod real_broker;
mod real_cluster;
mod real_quorum;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use client::{
    Acks, Admin, ClientConfig, Cluster, Consumer, ConsumerConfig, Producer, ProducerConfig,
    ProducerRecord, SeekTo,
};
use real_broker::{free_port_block, RealBroker};
use real_cluster::Brokers;
use real_quorum::Quorum;

const KEYS: usize = 40;
const ROUNDS: usize = 30;
/// Keys written once after the updates, so the updates all lie in closed
/// segments (the active segment is never compacted).
const FILLER_KEYS: usize = 400;

/// A broker config file whose cleaner runs a round every `backoff_ms`.
fn cleaner_config(dir: &Path, backoff_ms: u64) -> String {
    let path = dir.join(format!("cleaner-{backoff_ms}.toml"));
    std::fs::write(
        &path,
        format!("[cleaner]\nbackoff_ms = {backoff_ms}\nio_bytes_per_sec_max = 0\n"),
    )
    .unwrap();
    path.to_string_lossy().into_owned()
}

fn compacted_topic_configs() -> Vec<(String, String)> {
    [
        ("cleanup.policy", "compact"),
        ("segment.bytes", "4096"),
        ("min.cleanable.dirty.ratio", "0.01"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Writes ROUNDS updates of KEYS keys (the last round deletes every fifth
/// key), then the filler keys; returns each key's final value (`None` for a
/// tombstone).
async fn write_updates(bootstrap: &str, topic: &str) -> BTreeMap<String, Option<String>> {
    let producer = Producer::connect(
        bootstrap,
        ClientConfig::default(),
        ProducerConfig {
            acks: Acks::All,
            ..ProducerConfig::default()
        },
    )
    .await
    .unwrap();
    let mut finals = BTreeMap::new();
    let mut deliveries = Vec::new();
    for round in 0..ROUNDS {
        for k in 0..KEYS {
            let key = format!("key-{k:03}");
            let tombstone = round == ROUNDS - 1 && k % 5 == 0;
            let value = (!tombstone).then(|| format!("{key}-round-{round:03}-{}", "x".repeat(40)));
            finals.insert(key.clone(), value.clone());
            deliveries.push(
                producer
                    .enqueue(ProducerRecord {
                        topic: topic.into(),
                        partition: Some(0),
                        key: Some(Bytes::from(key)),
                        value: value.map(Bytes::from),
                        ..ProducerRecord::default()
                    })
                    .await
                    .unwrap(),
            );
        }
        // One batch per round, so rounds spread over segments.
        producer.flush().await.unwrap();
    }
    for f in 0..FILLER_KEYS {
        let key = format!("filler-{f:04}");
        let value = format!("{key}-{}", "y".repeat(40));
        finals.insert(key.clone(), Some(value.clone()));
        deliveries.push(
            producer
                .enqueue(ProducerRecord {
                    topic: topic.into(),
                    partition: Some(0),
                    key: Some(Bytes::from(key)),
                    value: Some(Bytes::from(value)),
                    ..ProducerRecord::default()
                })
                .await
                .unwrap(),
        );
        if f % 20 == 19 {
            producer.flush().await.unwrap();
        }
    }
    for delivery in deliveries {
        delivery.await.expect("acknowledged");
    }
    finals
}

/// Every record of partition 0 from the earliest offset to the end offset:
/// (offset, key, value).
async fn read_back(bootstrap: &str, topic: &str) -> Vec<(i64, String, Option<String>)> {
    // A broker just restarted may still be opening its logs: retry the set-up.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut consumer, ends) = loop {
        let attempt = async {
            let mut consumer = Consumer::connect(
                bootstrap,
                ClientConfig::default(),
                ConsumerConfig::default(),
            )
            .await?;
            let partitions = consumer.assign(topic, Some(&[0])).await?;
            let ends = consumer.end_offsets(topic, &partitions).await?;
            consumer.seek(topic, 0, SeekTo::Earliest).await?;
            Ok::<_, client::ClientError>((consumer, ends))
        };
        match attempt.await {
            Ok(ready) => break ready,
            Err(e) => {
                assert!(Instant::now() < deadline, "consumer set-up: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while consumer.position(topic, 0).unwrap_or(0) < ends[&0] {
        assert!(Instant::now() < deadline, "read up to the end offset");
        for r in consumer.poll(Duration::from_millis(200)).await.unwrap() {
            out.push((
                r.offset,
                String::from_utf8(r.key.expect("keyed").to_vec()).unwrap(),
                r.value.map(|v| String::from_utf8(v.to_vec()).unwrap()),
            ));
        }
    }
    out
}

/// Every key's final value is there exactly once (a tombstone as a null
/// value, within its delete retention), in increasing offsets.
fn assert_final_values_once(
    read: &[(i64, String, Option<String>)],
    finals: &BTreeMap<String, Option<String>>,
) {
    let mut seen: BTreeMap<&str, &Option<String>> = BTreeMap::new();
    let mut previous = -1;
    for (offset, key, value) in read {
        assert!(
            *offset > previous,
            "offsets increase: {offset} after {previous}"
        );
        previous = *offset;
        assert!(seen.insert(key, value).is_none(), "key {key} read twice");
    }
    assert_eq!(seen.len(), finals.len(), "every key once");
    for (key, value) in finals {
        assert_eq!(seen.get(key.as_str()), Some(&value), "final value of {key}");
    }
}

fn metric(admin_port: u16, name: &str, topic: &str) -> Option<f64> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", admin_port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    // The endpoint keeps the connection open: read the head, then
    // Content-Length bytes.
    let mut raw = Vec::new();
    let mut chunk = [0u8; 8192];
    let body = loop {
        let n = stream.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        raw.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&raw).into_owned();
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            continue;
        };
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .and_then(|v| v.trim().parse().ok())?;
        if body.len() >= length {
            break body.to_string();
        }
    };
    let label = format!("topic=\"{topic}\"");
    body.lines()
        .find(|l| l.starts_with(name) && (l.contains(&label) || !l.contains("topic=")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Waits until the broker at `port` compacted `topic` all the way: records
/// were removed and nothing cleanable is dirty.
fn wait_compacted(port: u16, topic: &str, log: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let removed =
            metric(port + 64, "ringlog_cleaner_removed_records_total", topic).unwrap_or(0.0);
        let dirty = metric(port + 64, "ringlog_cleaner_dirty_ratio", topic).unwrap_or(1.0);
        if removed > 0.0 && dirty == 0.0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no compaction (removed {removed}, dirty {dirty}):\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn partition_dir(data_dir: &Path, topic: &str) -> std::path::PathBuf {
    data_dir.join("topics").join(format!("{topic}-0"))
}

async fn create(bootstrap: &str, topic: &str, replication_factor: i16) {
    let admin = Admin::connect(bootstrap, ClientConfig::default())
        .await
        .unwrap();
    admin
        .create_topic(topic, 1, replication_factor, &compacted_topic_configs())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let cluster = Cluster::connect(bootstrap, ClientConfig::default())
            .await
            .unwrap();
        let led = cluster
            .metadata()
            .topic(topic)
            .and_then(|t| t.partition(0).map(|p| p.leader))
            .is_some_and(|l| l > 0);
        if led {
            return;
        }
        assert!(Instant::now() < deadline, "{topic} got no leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn a_consumer_after_compaction_sees_each_keys_final_value_once() {
    let root = tempfile::tempdir().unwrap();
    let config = cleaner_config(root.path(), 200);
    let data = root.path().join("data");
    let port = free_port_block(1);
    let mut broker = RealBroker::start_node(&data, port, 1, 1, &["--config", &config]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let bootstrap = broker.bootstrap();
    runtime.block_on(create(&bootstrap, "kv", 1));
    // A record without a key is refused with a reason.
    let refused = runtime.block_on(async {
        let producer = Producer::connect(
            &bootstrap,
            ClientConfig::default(),
            ProducerConfig::default(),
        )
        .await
        .unwrap();
        let delivery = producer
            .enqueue(ProducerRecord {
                topic: "kv".into(),
                partition: Some(0),
                value: Some(Bytes::from_static(b"no key")),
                ..ProducerRecord::default()
            })
            .await
            .unwrap();
        producer.flush().await.unwrap();
        delivery.await
    });
    let error = refused
        .expect_err("a keyless record is refused")
        .to_string();
    assert!(
        error.contains("INVALID_RECORD") && error.contains("key"),
        "{error}"
    );
    let finals = runtime.block_on(write_updates(&bootstrap, "kv"));
    wait_compacted(port, "kv", || broker.log());
    let read = runtime.block_on(read_back(&bootstrap, "kv"));
    assert_final_values_once(&read, &finals);
    broker.stop();
    real_broker::verify_log(&partition_dir(&data, "kv"));
    let broker = RealBroker::start_node(&data, port, 1, 1, &["--config", &config]);
    let read = runtime.block_on(read_back(&broker.bootstrap(), "kv"));
    assert_final_values_once(&read, &finals);
}

#[test]
fn compacted_replicas_serve_each_final_value_after_the_leader_is_killed() {
    let root = tempfile::tempdir().unwrap();
    let config = cleaner_config(root.path(), 200);
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
    runtime.block_on(create(&bootstrap, "kv3", 3));
    let finals = runtime.block_on(write_updates(&bootstrap, "kv3"));
    for id in 1..=3u32 {
        let port = brokers.brokers[(id - 1) as usize].as_ref().unwrap().port;
        wait_compacted(port, "kv3", || brokers.logs());
    }
    let leader = runtime.block_on(async {
        let cluster = Cluster::connect(&bootstrap, ClientConfig::default())
            .await
            .unwrap();
        cluster
            .metadata()
            .topic("kv3")
            .unwrap()
            .partition(0)
            .unwrap()
            .leader as u32
    });
    brokers.kill9(leader);
    let survivors: Vec<String> = (1..=3)
        .filter(|b| *b != leader)
        .map(|b| brokers.bootstrap(b))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let led = runtime.block_on(async {
            let cluster = Cluster::connect(&survivors.join(","), ClientConfig::default())
                .await
                .ok()?;
            let l = cluster.metadata().topic("kv3")?.partition(0)?.leader;
            Some(l > 0 && l as u32 != leader)
        });
        if led == Some(true) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no new leader:\n{}",
            brokers.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let read = runtime.block_on(read_back(&survivors.join(","), "kv3"));
    assert_final_values_once(&read, &finals);
    // The killed broker recovers (its torn tail cut) and catches up; then
    // every replica directory is a valid log.
    brokers.restart(leader);
    let port = brokers.brokers[(leader - 1) as usize]
        .as_ref()
        .unwrap()
        .port;
    let end = read.last().map_or(0, |r| r.0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(port + 64, "ringlog_log_end_offset", "kv3").unwrap_or(0.0) < (end + 1) as f64 {
        assert!(
            Instant::now() < deadline,
            "the restarted broker caught up:\n{}",
            brokers.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for id in 1..=3u32 {
        brokers.stop(id);
    }
    for id in 1..=3u32 {
        real_broker::verify_log(&partition_dir(brokers.data_dir(id), "kv3"));
    }
}

#[test]
fn kill9_at_every_swap_step_loses_no_final_value() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    for step in [
        "written",
        "indexes-staged",
        "committed",
        "old-partly-removed",
        "old-removed",
        "done",
    ] {
        let root = tempfile::tempdir().unwrap();
        let config = cleaner_config(root.path(), 200);
        let data = root.path().join("data");
        let port = free_port_block(1);
        // Written with the cleaner idle, then restarted with a cleaner that
        // stops its first swap at `step` and waits to be killed.
        let idle = cleaner_config(root.path(), 3_600_000);
        let mut writer = RealBroker::start_node(&data, port, 1, 1, &["--config", &idle]);
        let bootstrap = writer.bootstrap();
        runtime.block_on(create(&bootstrap, "kv", 1));
        let finals = runtime.block_on(write_updates(&bootstrap, "kv"));
        writer.stop();
        let mut broker = RealBroker::start_node_with_env(
            &data,
            port,
            1,
            1,
            &["--config", &config],
            &[("RINGLOG_TEST_CLEANER_PAUSE_AFTER", step)],
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        while !broker
            .log()
            .contains("compaction swap paused for a crash test")
        {
            assert!(
                Instant::now() < deadline,
                "{step}: the swap never paused:\n{}",
                broker.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        broker.kill9();
        let mut broker = RealBroker::start_node(&data, port, 1, 1, &["--config", &config]);
        let read = runtime.block_on(read_back(&broker.bootstrap(), "kv"));
        // Records may or may not be compacted yet; none of the final values is lost.
        let mut latest: BTreeMap<&str, &Option<String>> = BTreeMap::new();
        for (_, key, value) in &read {
            latest.insert(key, value);
        }
        for (key, value) in &finals {
            assert_eq!(
                latest.get(key.as_str()),
                Some(&value),
                "{step}: final value of {key}"
            );
        }
        wait_compacted(port, "kv", || broker.log());
        let read = runtime.block_on(read_back(&broker.bootstrap(), "kv"));
        assert_final_values_once(&read, &finals);
        broker.stop();
        real_broker::verify_log(&partition_dir(&data, "kv"));
    }
}

#[test]
fn a_topic_turned_compacted_after_creation_is_compacted() {
    let root = tempfile::tempdir().unwrap();
    let config = cleaner_config(root.path(), 200);
    let data = root.path().join("data");
    let port = free_port_block(1);
    let broker = RealBroker::start_node(&data, port, 1, 1, &["--config", &config]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let bootstrap = broker.bootstrap();
    let admin = runtime
        .block_on(Admin::connect(&bootstrap, ClientConfig::default()))
        .unwrap();
    let plain: Vec<(String, String)> = vec![("segment.bytes".into(), "4096".into())];
    runtime
        .block_on(admin.create_topic("later", 1, 1, &plain))
        .unwrap();
    let finals = runtime.block_on(write_updates(&bootstrap, "later"));
    // Refused changes name their reason and change nothing.
    let bad = runtime
        .block_on(admin.alter_topic_config(
            "later",
            &[("cleanup.policy".into(), "shred".into())],
            &[],
        ))
        .expect_err("an invalid policy is refused")
        .to_string();
    assert!(
        bad.contains("INVALID_CONFIG") && bad.contains("cleanup.policy"),
        "{bad}"
    );
    let unknown = runtime
        .block_on(admin.alter_topic_config(
            "missing",
            &[("cleanup.policy".into(), "compact".into())],
            &[],
        ))
        .expect_err("an unknown topic is refused")
        .to_string();
    assert!(unknown.contains("UNKNOWN_TOPIC"), "{unknown}");
    let described = runtime.block_on(admin.describe_topic("later")).unwrap();
    assert_eq!(config_of(&described, "cleanup.policy"), None);
    // Turned compacted: the cleaner takes it from there.
    let set: Vec<(String, String)> = vec![
        ("cleanup.policy".into(), "compact".into()),
        ("min.cleanable.dirty.ratio".into(), "0.01".into()),
    ];
    runtime
        .block_on(admin.alter_topic_config("later", &set, &[]))
        .unwrap();
    let described = runtime.block_on(admin.describe_topic("later")).unwrap();
    assert_eq!(config_of(&described, "cleanup.policy"), Some("compact"));
    wait_compacted(port, "later", || broker.log());
    let read = runtime.block_on(read_back(&bootstrap, "later"));
    assert_final_values_once(&read, &finals);
    // A removed key falls back to the broker default.
    runtime
        .block_on(admin.alter_topic_config("later", &[], &["min.cleanable.dirty.ratio".into()]))
        .unwrap();
    let described = runtime.block_on(admin.describe_topic("later")).unwrap();
    assert_eq!(config_of(&described, "min.cleanable.dirty.ratio"), None);
    assert_eq!(config_of(&described, "cleanup.policy"), Some("compact"));
}

fn config_of<'a>(description: &'a client::TopicDescription, key: &str) -> Option<&'a str> {
    description
        .configs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

#[test]
fn a_corrupt_segment_makes_only_its_partition_uncleanable() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let port = free_port_block(1);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // Both topics written with the cleaner idle, then one damaged on disk.
    let idle = cleaner_config(root.path(), 3_600_000);
    let mut writer = RealBroker::start_node(&data, port, 1, 1, &["--config", &idle]);
    let finals: Vec<_> = ["damaged", "healthy"]
        .into_iter()
        .map(|topic| {
            runtime.block_on(create(&writer.bootstrap(), topic, 1));
            runtime.block_on(write_updates(&writer.bootstrap(), topic))
        })
        .collect();
    writer.stop();
    let first = partition_dir(&data, "damaged").join(format!("{:020}.log", 0));
    let mut bytes = std::fs::read(&first).unwrap();
    bytes[200] ^= 0xff;
    std::fs::write(&first, &bytes).unwrap();
    let config = cleaner_config(root.path(), 200);
    let broker = RealBroker::start_node(&data, port, 1, 1, &["--config", &config]);
    wait_compacted(port, "healthy", || broker.log());
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(port + 64, "ringlog_cleaner_uncleanable", "damaged") != Some(1.0) {
        assert!(
            Instant::now() < deadline,
            "the damaged partition is marked uncleanable:\n{}",
            broker.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(metric(port + 64, "ringlog_cleaner_errors_total", "damaged").unwrap_or(0.0) >= 1.0);
    assert_eq!(
        metric(port + 64, "ringlog_cleaner_uncleanable", "healthy"),
        Some(0.0)
    );
    assert!(broker
        .log()
        .contains("compaction failed; the partition is uncleanable"));
    // Nothing of the damaged partition was replaced or staged.
    assert_eq!(std::fs::read(&first).unwrap(), bytes);
    let staged = std::fs::read_dir(partition_dir(&data, "damaged"))
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.ends_with(".cleaned") || name.ends_with(".swap")
        });
    assert!(!staged, "no staged compaction files left");
    // The healthy topic serves its final values; the shard still takes writes.
    let read = runtime.block_on(read_back(&broker.bootstrap(), "healthy"));
    assert_final_values_once(&read, &finals[1]);
    runtime.block_on(write_updates(&broker.bootstrap(), "damaged"));
}
