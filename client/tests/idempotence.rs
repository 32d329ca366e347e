//! Idempotent producers end to end, against real broker processes reached
//! through a proxy that cuts connections after the broker handled a request
//! and before the client read the answer (so the client retries batches the
//! broker already appended):
//! - with idempotence (the default) every record is in its partition exactly
//!   once and in send order, read back after a restart from disk; the same
//!   producer with idempotence off appends duplicates under the same cuts
//!   (the check can fail);
//! - with three brokers and RF 3, the same holds across a kill -9 of a
//!   partition leader in mid-stream: the new leader rebuilt the producer
//!   state from the batches it replicated.

mod consume;
mod cutting_proxy;
mod real_broker;
mod real_cluster;
mod real_quorum;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use client::{Admin, ClientConfig, Cluster, Producer, ProducerConfig, ProducerRecord};
use consume::consume_all;
use cutting_proxy::{CuttingProxy, PROXY_HOST};
use real_broker::{free_port_block, verify_log, RealBroker};
use real_cluster::Brokers;
use real_quorum::Quorum;

const PARTITIONS: i32 = 4;

fn client_config() -> ClientConfig {
    ClientConfig {
        request_timeout_ms: 5_000,
        ..ClientConfig::default()
    }
}

fn producer_config(idempotence: bool) -> ProducerConfig {
    ProducerConfig {
        linger_ms: 1,
        batch_bytes_max: 1 << 10,
        retries_max: 100,
        retry_backoff_ms: 10,
        retry_backoff_ms_max: 200,
        idempotence,
        ..ProducerConfig::default()
    }
}

/// Sends `count` records round-robin over the partitions, in order, and
/// waits for every delivery; returns the values sent per partition.
async fn produce(
    bootstrap: &str,
    topic: &str,
    count: usize,
    idempotence: bool,
    during: impl FnOnce(usize) -> Option<tokio::task::JoinHandle<()>>,
) -> BTreeMap<i32, Vec<String>> {
    let producer = Producer::connect(bootstrap, client_config(), producer_config(idempotence))
        .await
        .expect("producer connects");
    let mut sent: BTreeMap<i32, Vec<String>> = BTreeMap::new();
    let mut deliveries = Vec::new();
    let mut fault = None;
    let mut during = Some(during);
    for i in 0..count {
        if i == count / 3 {
            fault = during.take().and_then(|f| f(i));
        }
        let partition = (i % PARTITIONS as usize) as i32;
        let value = format!("v{i:06}-{}", "x".repeat(90));
        sent.entry(partition).or_default().push(value.clone());
        let record = ProducerRecord {
            topic: topic.to_owned(),
            partition: Some(partition),
            key: None,
            value: Some(Bytes::from(value)),
            ..Default::default()
        };
        deliveries.push(producer.enqueue(record).await.expect("enqueued"));
        if i % 50 == 49 {
            // Keep a few batches per partition in flight, not all at once.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    for delivery in deliveries {
        delivery.await.expect("every record is delivered");
    }
    producer.close().await.unwrap();
    if let Some(fault) = fault {
        fault.await.unwrap();
    }
    sent
}

/// Per partition: values read back that were sent twice or more, and
/// whether the values read keep the send order.
fn duplicates_and_order(
    sent: &BTreeMap<i32, Vec<String>>,
    read: &BTreeMap<i32, Vec<(i64, String, String)>>,
) -> (usize, bool) {
    let mut duplicates = 0;
    let mut ordered = true;
    for (partition, values) in sent {
        let got: Vec<&str> = read
            .get(partition)
            .map(|r| r.iter().map(|(_, _, v)| v.as_str()).collect())
            .unwrap_or_default();
        let mut seen = std::collections::BTreeSet::new();
        let mut deduplicated = Vec::new();
        for v in &got {
            if !seen.insert(*v) {
                duplicates += 1;
            } else {
                deduplicated.push(*v);
            }
        }
        let expected: Vec<&str> = values.iter().map(String::as_str).collect();
        assert_eq!(
            seen.len(),
            expected.len(),
            "partition {partition}: every acknowledged record is there"
        );
        ordered &= deduplicated == expected;
    }
    (duplicates, ordered)
}

async fn create_topic(bootstrap: &str, topic: &str, replication_factor: i16) {
    let admin = Admin::connect(bootstrap, client_config()).await.unwrap();
    admin
        .create_topic(topic, PARTITIONS, replication_factor, &[])
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let cluster = Cluster::connect(bootstrap, client_config()).await.unwrap();
        let ready = cluster.metadata().topic(topic).is_some_and(|t| {
            t.partitions.len() == PARTITIONS as usize && t.partitions.iter().all(|p| p.leader >= 0)
        });
        if ready {
            return;
        }
        assert!(Instant::now() < deadline, "topic {topic} got leaders");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_after_cut_connections_append_each_record_once() {
    let dir = tempfile::tempdir().unwrap();
    let cores = 2u16;
    let port = free_port_block(cores);
    let data = dir.path().join("b1");
    let advertised = ["--advertised-host", PROXY_HOST];
    let mut broker = RealBroker::start_node(&data, port, 1, cores, &advertised);
    let ports: Vec<u16> = (port..=port + cores).collect();
    let proxy = CuttingProxy::start(&ports, 7).await;
    let bootstrap = format!("{PROXY_HOST}:{port}");
    create_topic(&bootstrap, "exactly", 1).await;
    create_topic(&bootstrap, "twice", 1).await;

    let count = 4_000;
    proxy.start_cutting();
    let sent = produce(&bootstrap, "exactly", count, true, |_| None).await;
    let cuts_idempotent = proxy.cuts();
    let sent_plain = produce(&bootstrap, "twice", count, false, |_| None).await;
    let cuts_plain = proxy.cuts() - cuts_idempotent;
    proxy.stop_cutting();
    assert!(
        cuts_idempotent > 10 && cuts_plain > 10,
        "the proxy cut connections ({cuts_idempotent}, {cuts_plain})"
    );

    // Judge from disk: restart, read everything back, verify the files.
    broker.stop();
    for topic in ["exactly", "twice"] {
        for partition in 0..PARTITIONS {
            verify_log(&data.join("topics").join(format!("{topic}-{partition}")));
        }
    }
    let _broker = RealBroker::start_node(&data, port, 1, cores, &advertised);
    let read = consume_all(&bootstrap, "exactly").await;
    let (duplicates, ordered) = duplicates_and_order(&sent, &read);
    assert_eq!(duplicates, 0, "idempotent retries appended nothing twice");
    assert!(ordered, "each partition keeps the send order");
    let read_plain = consume_all(&bootstrap, "twice").await;
    let (duplicates_plain, _) = duplicates_and_order(&sent_plain, &read_plain);
    assert!(
        duplicates_plain > 0,
        "without idempotence the same cuts append duplicates"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_after_kill_9_still_recognizes_retries() {
    let root = tempfile::tempdir().unwrap();
    let quorum = Quorum::start(&["--session-timeout-ms", "2000"]);
    let mut brokers = Brokers::start_with(
        root.path(),
        quorum.controller_list(),
        1,
        &["--advertised-host", PROXY_HOST],
    );
    let ports: Vec<u16> = (1..=3u32)
        .flat_map(|id| {
            let port: u16 = brokers
                .bootstrap(id)
                .rsplit_once(':')
                .unwrap()
                .1
                .parse()
                .unwrap();
            [port, port + 1]
        })
        .collect();
    let proxy = CuttingProxy::start(&ports, 9).await;
    let bootstrap = brokers.bootstrap_all().replace("127.0.0.1", PROXY_HOST);
    create_topic(&bootstrap, "failover", 3).await;
    proxy.start_cutting();
    let leader = {
        let cluster = Cluster::connect(&bootstrap, client_config()).await.unwrap();
        cluster.metadata().topic("failover").unwrap().partitions[0].leader as u32
    };
    let sent = produce(&bootstrap, "failover", 3_000, true, |_| {
        brokers.signal(leader, "-KILL");
        None
    })
    .await;
    proxy.stop_cutting();
    assert!(proxy.cuts() > 5, "the proxy cut connections");
    let new_leader = {
        let cluster = Cluster::connect(&bootstrap, client_config()).await.unwrap();
        cluster.metadata().topic("failover").unwrap().partitions[0].leader as u32
    };
    assert_ne!(new_leader, leader, "leadership moved off the killed broker");
    brokers.restart(leader);
    let read = consume_all(&bootstrap, "failover").await;
    let (duplicates, ordered) = duplicates_and_order(&sent, &read);
    assert_eq!(duplicates, 0, "no record twice across the failover");
    assert!(ordered, "each partition keeps the send order");
}
