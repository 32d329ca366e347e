//! End to end against the real broker: a topic with several partitions, keyed
//! records produced with the `ringlog` CLI and with the client library,
//! everything consumed back in per-partition order with the same keys in the
//! same partitions, then again after a clean restart and after kill -9.

mod consume;
mod real_broker;

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use bytes::Bytes;
use client::partitioner::partition_for_key;
use client::{Acks, Admin, ClientConfig, Producer, ProducerConfig};
use consume::consume_all;
use protocol::Compression;
use real_broker::{free_port_block, RealBroker};

const PARTITIONS: i32 = 4;
const TOPIC: &str = "events";

fn check(read: &BTreeMap<i32, Vec<(i64, String, String)>>, expected: &[(String, String)]) {
    let mut total = 0;
    for (partition, records) in read {
        let offsets: Vec<i64> = records.iter().map(|r| r.0).collect();
        assert_eq!(
            offsets,
            (0..records.len() as i64).collect::<Vec<_>>(),
            "dense offsets in partition {partition}"
        );
        for (_, key, value) in records {
            assert_eq!(
                partition_for_key(key.as_bytes(), PARTITIONS as usize),
                *partition,
                "key {key} in its partition"
            );
            let _ = value;
        }
        total += records.len();
    }
    assert_eq!(total, expected.len(), "every record read once");
    // Per key, values come back in the order they were produced.
    let mut per_key_read: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for records in read.values() {
        for (_, k, v) in records {
            per_key_read.entry(k).or_default().push(v);
        }
    }
    let mut per_key_sent: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (k, v) in expected {
        per_key_sent.entry(k).or_default().push(v);
    }
    assert_eq!(per_key_read, per_key_sent);
}

#[test]
fn cli_and_client_produce_consume_restart_and_crash() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = free_port_block(2);
    let mut broker = RealBroker::start(&data, port);
    let bootstrap = broker.bootstrap();
    let cli = env!("CARGO_BIN_EXE_ringlog");

    let created = Command::new(cli)
        .args([
            "--bootstrap",
            &bootstrap,
            "topic",
            "create",
            TOPIC,
            "--partitions",
            &PARTITIONS.to_string(),
        ])
        .output()
        .unwrap();
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );

    // A reader that went away (`ringlog topic describe | head`) ends the
    // command quietly: no panic, success, as for any Unix tool.
    let mut describe = Command::new(cli)
        .args(["--bootstrap", &bootstrap, "topic", "describe", TOPIC])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(describe.stdout.take());
    let described = describe.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&described.stderr);
    assert!(
        described.status.success() && stderr.is_empty(),
        "{:?}: {stderr}",
        described.status
    );

    // 200 keyed lines through the CLI.
    let mut expected: Vec<(String, String)> = (0..200)
        .map(|i| (format!("user-{}", i % 17), format!("cli-{i}")))
        .collect();
    let mut produce = Command::new(cli)
        .args([
            "--bootstrap",
            &bootstrap,
            "produce",
            TOPIC,
            "--key-separator",
            "|",
            "--acks",
            "all",
            "--compression",
            "zstd",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let input: String = expected.iter().map(|(k, v)| format!("{k}|{v}\n")).collect();
    produce
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let produced = produce.wait_with_output().unwrap();
    assert!(
        produced.status.success(),
        "{}",
        String::from_utf8_lossy(&produced.stderr)
    );

    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let config = ProducerConfig {
            acks: Acks::All,
            compression: Compression::Zstd,
            ..ProducerConfig::default()
        };
        let producer = Producer::connect(&bootstrap, ClientConfig::default(), config)
            .await
            .unwrap();
        let mut deliveries = Vec::new();
        for i in 0..300 {
            let key = format!("user-{}", i % 23);
            let value = format!("lib-{i}");
            expected.push((key.clone(), value.clone()));
            let record = client::ProducerRecord {
                topic: TOPIC.into(),
                key: Some(Bytes::from(key.clone())),
                value: Some(Bytes::from(value)),
                ..Default::default()
            };
            deliveries.push((key, producer.enqueue(record).await.unwrap()));
        }
        for (key, delivery) in deliveries {
            let (partition, offset) = delivery.await.unwrap();
            assert_eq!(
                partition,
                partition_for_key(key.as_bytes(), PARTITIONS as usize)
            );
            assert!(offset >= 0);
        }
        producer.close().await.unwrap();
        check(&consume_all(&bootstrap, TOPIC).await, &expected);
    });

    // The CLI reads the same records of one partition, in order.
    let consumed = Command::new(cli)
        .args([
            "--bootstrap",
            &bootstrap,
            "consume",
            TOPIC,
            "--partition",
            "0",
            "--from",
            "earliest",
            "--until-end",
            "--format",
            "{offset} {key} {value}",
        ])
        .output()
        .unwrap();
    assert!(
        consumed.status.success(),
        "{}",
        String::from_utf8_lossy(&consumed.stderr)
    );
    let lines: Vec<String> = String::from_utf8(consumed.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let from_client = runtime.block_on(consume_all(&bootstrap, TOPIC));
    let partition0: Vec<String> = from_client
        .get(&0)
        .map(|r| r.iter().map(|(o, k, v)| format!("{o} {k} {v}")).collect())
        .unwrap_or_default();
    assert_eq!(lines, partition0);

    broker.stop();
    let mut broker = RealBroker::start(&data, port);
    runtime.block_on(async { check(&consume_all(&bootstrap, TOPIC).await, &expected) });
    assert!(
        !broker.log().contains("truncating"),
        "clean restart needs no recovery"
    );

    broker.kill9();
    let _broker = RealBroker::start(&data, port);
    runtime.block_on(async {
        check(&consume_all(&bootstrap, TOPIC).await, &expected);
        let admin = Admin::connect(&bootstrap, ClientConfig::default())
            .await
            .unwrap();
        // Each restart re-registers the broker with its embedded controller,
        // which moves leadership away and back: a higher leader epoch.
        let description = admin.describe_topic(TOPIC).await.unwrap();
        for p in &description.partitions {
            assert_eq!(p.leader, 1, "{p:?}");
            assert!(p.leader_epoch >= 2, "{p:?}");
        }

        // A deleted topic's data is gone; one re-created under the same name
        // starts empty.
        admin.delete_topic(TOPIC).await.unwrap();
        let names: Vec<String> = admin
            .list_topics()
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert!(!names.contains(&TOPIC.to_owned()), "{names:?}");
        for p in 0..PARTITIONS {
            assert!(!data.join("topics").join(format!("{TOPIC}-{p}")).exists());
        }
        admin.create_topic(TOPIC, 1, 1, &[]).await.unwrap();
        let again = admin.describe_topic(TOPIC).await.unwrap();
        assert_eq!(again.partitions.len(), 1);
        assert_eq!(again.partitions[0].log_end_offset, 0);
    });
}
