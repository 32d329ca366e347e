//! acks=all under faults, with three controllers and three brokers as real
//! processes:
//! - with both followers of a partition frozen (SIGSTOP), an acks=all write
//!   to its leader is never acknowledged: once the controller fenced them the
//!   ISR is the leader alone, below `min.insync.replicas`, and the answer is
//!   NOT_ENOUGH_REPLICAS_AFTER_APPEND (it used to be success);
//! - kill -9 of every broker at once, the instant the last acks=all
//!   acknowledgement arrived, loses none of them (followers used to report,
//!   and the leader to count, records still in process memory).

mod consume;
mod real_broker;
mod real_cluster;
mod real_quorum;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use bytes::Bytes;
use client::{Acks, Admin, ClientConfig, ClientError, Cluster, Producer, ProducerConfig};
use protocol::ErrorCode;
use real_cluster::{produce_with_cli, Brokers};
use real_quorum::Quorum;

const SESSION_TIMEOUT_MS: u64 = 2_000;

/// Creates a one-partition RF 3 topic with `configs` and returns its leader
/// once every broker knows it.
async fn create_topic(bootstrap: &str, topic: &str, configs: &[(&str, &str)]) -> u32 {
    let admin = Admin::connect(bootstrap, ClientConfig::default())
        .await
        .unwrap();
    let configs: Vec<(String, String)> = configs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    admin.create_topic(topic, 1, 3, &configs).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let cluster = Cluster::connect(bootstrap, ClientConfig::default())
            .await
            .unwrap();
        let leader = cluster
            .metadata()
            .topic(topic)
            .and_then(|t| t.partition(0).map(|p| p.leader));
        if let Some(leader) = leader.filter(|l| *l > 0) {
            return leader as u32;
        }
        assert!(Instant::now() < deadline, "{topic} got no leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn producer_config(acks: Acks) -> ProducerConfig {
    ProducerConfig {
        acks,
        retries_max: 0,
        produce_timeout_ms: 20_000,
        ..ProducerConfig::default()
    }
}

#[test]
fn acks_all_is_refused_once_the_isr_shrank_below_min_insync() {
    let root = tempfile::tempdir().unwrap();
    let session = SESSION_TIMEOUT_MS.to_string();
    let quorum = Quorum::start(&["--session-timeout-ms", &session]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(quorum.leader(Duration::from_secs(20)));
    let brokers = Brokers::start(root.path(), quorum.controller_list(), 1);
    let bootstrap = brokers.bootstrap_all();
    let leader = runtime.block_on(create_topic(
        &bootstrap,
        "guarded",
        &[("min.insync.replicas", "2")],
    ));
    let followers: Vec<u32> = (1..=3).filter(|b| *b != leader).collect();
    let record = |value: &str| client::ProducerRecord {
        topic: "guarded".into(),
        partition: Some(0),
        key: None,
        value: Some(Bytes::from(value.to_owned())),
        ..Default::default()
    };
    // Connected to the leader alone before anything freezes, so the write
    // goes out at once, while the followers are still in the ISR.
    let leader_bootstrap = brokers.bootstrap(leader);
    let producer = runtime.block_on(async {
        let producer = Producer::connect(
            &leader_bootstrap,
            ClientConfig::default(),
            producer_config(Acks::All),
        )
        .await
        .unwrap();
        let delivery = producer.enqueue(record("before")).await.unwrap();
        delivery.await.expect("acknowledged while the ISR is whole");
        producer
    });
    for follower in &followers {
        brokers.signal(*follower, "-STOP");
    }
    let answer = runtime.block_on(async {
        let delivery = producer.enqueue(record("frozen")).await.unwrap();
        delivery.await
    });
    for follower in &followers {
        brokers.signal(*follower, "-CONT");
    }
    match answer {
        Err(ClientError::Broker { code, .. }) => assert!(
            matches!(
                code,
                ErrorCode::NotEnoughReplicasAfterAppend | ErrorCode::RequestTimedOut
            ),
            "refused with {code}"
        ),
        other => panic!("acks=all with both followers frozen answered {other:?}"),
    }
}

#[test]
fn kill9_of_every_broker_keeps_every_acks_all_record() {
    let root = tempfile::tempdir().unwrap();
    let session = SESSION_TIMEOUT_MS.to_string();
    let quorum = Quorum::start(&["--session-timeout-ms", &session]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(quorum.leader(Duration::from_secs(20)));
    let mut brokers = Brokers::start(root.path(), quorum.controller_list(), 1);
    let bootstrap = brokers.bootstrap_all();
    // No fsync: what survives a process crash is what reached the kernel.
    runtime.block_on(create_topic(
        &bootstrap,
        "crash",
        &[("min.insync.replicas", "2"), ("flush.policy", "none")],
    ));
    let acked = produce_with_cli(&bootstrap, "crash", "all", 30_000);
    for broker in &mut brokers.brokers {
        if let Some(mut broker) = broker.take() {
            broker.kill9();
        }
    }
    for id in 1..=3 {
        brokers.restart(id);
    }
    let read = runtime.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let read = consume::consume_all(&bootstrap, "crash").await;
            let values: BTreeSet<String> = read
                .into_values()
                .flatten()
                .map(|(_, _, value)| value)
                .collect();
            // The high watermark is learned again after a restart: read until
            // it reached everything acknowledged, or the deadline.
            if acked.iter().all(|v| values.contains(v)) || Instant::now() >= deadline {
                return values;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let lost = acked.iter().filter(|v| !read.contains(*v)).count();
    assert_eq!(
        lost,
        0,
        "{lost} of {} acks=all records lost to kill -9 of every broker",
        acked.len()
    );
}
