//! Acknowledged records survive the broker process, read back from disk after
//! a restart (never from what a cache served during the run):
//! - acks=1 records survive kill -9 sent the instant the last acknowledgement
//!   arrived, under every flush policy (an acknowledgement waits until the
//!   records reached the file, not only the process's memory);
//! - a roll-heavy run (small segments, no fsync, several producers appending
//!   to one partition at once, so segments roll while writes are in flight)
//!   leaves a log that `verify-log` passes after a clean stop and that serves
//!   every acknowledged record after the restart.

mod consume;
mod real_broker;
mod real_cluster;

use std::collections::BTreeSet;

use bytes::Bytes;
use client::{Acks, Admin, ClientConfig, Producer, ProducerConfig};
use consume::consume_all;
use real_broker::{free_port_block, RealBroker};
use real_cluster::produce_with_cli;

/// Produces `count` records to partition 0 of `topic` from `producers`
/// concurrent producers with acks=1; returns the acknowledged values.
async fn produce_acked(
    bootstrap: &str,
    topic: &str,
    producers: usize,
    count: usize,
    value_bytes: usize,
) -> BTreeSet<String> {
    let mut workers = Vec::new();
    for worker in 0..producers {
        let (bootstrap, topic) = (bootstrap.to_owned(), topic.to_owned());
        workers.push(tokio::spawn(async move {
            let config = ProducerConfig {
                acks: Acks::Leader,
                linger_ms: 1,
                ..ProducerConfig::default()
            };
            let producer = Producer::connect(&bootstrap, ClientConfig::default(), config)
                .await
                .expect("producer connects");
            let mut deliveries = Vec::new();
            for i in (worker..count).step_by(producers) {
                let mut value = format!("v{i:08}-");
                value.extend(std::iter::repeat_n(
                    'x',
                    value_bytes.saturating_sub(value.len()),
                ));
                let record = client::ProducerRecord {
                    topic: topic.clone(),
                    partition: Some(0),
                    key: None,
                    value: Some(Bytes::from(value.clone())),
                    ..Default::default()
                };
                deliveries.push((value, producer.enqueue(record).await.expect("enqueued")));
            }
            let mut acked = Vec::new();
            for (value, delivery) in deliveries {
                delivery.await.expect("acknowledged");
                acked.push(value);
            }
            acked
        }));
    }
    let mut acked = BTreeSet::new();
    for worker in workers {
        acked.extend(worker.await.unwrap());
    }
    acked
}

fn create_topic(bootstrap: &str, topic: &str, configs: &[(&str, &str)]) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let admin = Admin::connect(bootstrap, ClientConfig::default())
            .await
            .unwrap();
        let configs: Vec<(String, String)> = configs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        admin.create_topic(topic, 1, 1, &configs).await.unwrap();
    });
}

fn read_back(bootstrap: &str, topic: &str) -> Vec<(i64, String)> {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        consume_all(bootstrap, topic)
            .await
            .remove(&0)
            .unwrap_or_default()
            .into_iter()
            .map(|(offset, _, value)| (offset, value))
            .collect()
    })
}

/// Checks that offsets are dense from 0 and every acknowledged value is there.
fn check_read_back(read: &[(i64, String)], acked: &BTreeSet<String>, what: &str) {
    let offsets: Vec<i64> = read.iter().map(|r| r.0).collect();
    assert_eq!(
        offsets,
        (0..read.len() as i64).collect::<Vec<_>>(),
        "{what}: dense offsets"
    );
    let values: BTreeSet<&String> = read.iter().map(|r| &r.1).collect();
    let missing = acked.iter().filter(|v| !values.contains(v)).count();
    assert_eq!(
        missing,
        0,
        "{what}: {missing} of {} acknowledged records lost ({} read back)",
        acked.len(),
        read.len()
    );
}

#[test]
fn acks1_records_survive_kill9_right_after_the_acknowledgement() {
    const RECORDS: usize = 50_000;
    for policy in ["always", "none", "interval_ms:60000"] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let port = free_port_block(1);
        let mut broker = RealBroker::start_node(&data, port, 1, 1, &[]);
        let topic = "acks1";
        create_topic(&broker.bootstrap(), topic, &[("flush.policy", policy)]);
        let acked = produce_with_cli(&broker.bootstrap(), topic, "1", RECORDS);
        // No pause: the kill follows the last acknowledgement at once.
        broker.kill9();
        let broker = RealBroker::start_node(&data, port, 1, 1, &[]);
        let read = read_back(&broker.bootstrap(), topic);
        eprintln!(
            "flush.policy={policy}: {} acknowledged, {} read back",
            acked.len(),
            read.len()
        );
        check_read_back(&read, &acked, &format!("flush.policy={policy}"));
    }
}

#[test]
fn segments_rolling_under_concurrent_appends_leave_a_valid_log() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = free_port_block(1);
    let mut broker = RealBroker::start_node(&data, port, 1, 1, &[]);
    let topic = "rolls";
    create_topic(
        &broker.bootstrap(),
        topic,
        &[("segment.bytes", "262144"), ("flush.policy", "none")],
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let acked = runtime.block_on(produce_acked(&broker.bootstrap(), topic, 4, 60_000, 1024));
    broker.stop();
    let partition_dir = data.join("topics").join(format!("{topic}-0"));
    let segments = std::fs::read_dir(&partition_dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".log")
        })
        .count();
    assert!(segments > 100, "the run rolled often: {segments} segments");
    real_broker::verify_log(&partition_dir);
    let broker = RealBroker::start_node(&data, port, 1, 1, &[]);
    let read = read_back(&broker.bootstrap(), topic);
    check_read_back(&read, &acked, "after a clean stop");
}
