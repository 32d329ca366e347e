//! Transaction markers and read_committed reads against a real broker
//! process: transactional batches of two producers, an abort and a commit
//! written through WriteTxnMarkers (as a transaction coordinator does). A
//! read_committed consumer stops at the last stable offset while a
//! transaction is open, never sees an aborted record or a marker, and sees
//! committed ones once the marker is in; a read_uncommitted consumer sees
//! every data record. The same holds read back from disk after a kill -9
//! and a restart, and `verify-log` passes on the files.

mod real_broker;

use std::time::{Duration, Instant};

use client::messages::{self, ProduceEntry, TxnMarkerEntry};
use client::{
    Admin, ClientConfig, Cluster, Consumer, ConsumerConfig, IsolationLevel, SeekTo, TopicPartition,
};
use protocol::record_batch::stamp_producer;
use protocol::{
    ApiKey, BatchBuilder, Compression, ErrorCode, ProducerEpoch, ProducerId, Record, Sequence,
};
use real_broker::{free_port_block, verify_log, RealBroker};

const TOPIC: &str = "txn";

fn client_config() -> ClientConfig {
    ClientConfig {
        request_timeout_ms: 10_000,
        ..ClientConfig::default()
    }
}

async fn create_topic(bootstrap: &str) {
    let admin = Admin::connect(bootstrap, client_config()).await.unwrap();
    admin.create_topic(TOPIC, 1, 1, &[]).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let cluster = Cluster::connect(bootstrap, client_config()).await.unwrap();
        let ready = cluster
            .metadata()
            .topic(TOPIC)
            .is_some_and(|t| t.partitions.iter().all(|p| p.leader >= 0));
        if ready {
            return;
        }
        assert!(Instant::now() < deadline, "topic got a leader");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A producer's batch of `values`, transactional or not.
fn batch(
    id: (ProducerId, ProducerEpoch),
    sequence: i32,
    transactional: bool,
    values: &[&str],
) -> Vec<u8> {
    let mut builder = BatchBuilder::new(Compression::Zstd).transactional(transactional);
    for v in values {
        builder.push(&Record {
            timestamp_ms: 1_000,
            key: None,
            value: Some(v.as_bytes()),
            headers: &[],
        });
    }
    let mut bytes = builder.build().unwrap();
    stamp_producer(&mut bytes, id.0, id.1, Sequence(sequence));
    bytes
}

async fn produce(cluster: &Cluster, bytes: &[u8]) -> Result<i64, ErrorCode> {
    let address = cluster.metadata().leader_address(TOPIC, 0).unwrap();
    let entry = ProduceEntry {
        topic: TOPIC,
        partition: 0,
        batch: bytes,
    };
    let body = messages::produce_request(-1, 10_000, &[entry]);
    let response = cluster
        .request_to(&address, ApiKey::Produce, &body, &[bytes])
        .await
        .unwrap();
    let outcome = messages::produce_response(response.body())
        .unwrap()
        .remove(0);
    if outcome.error.is_ok() {
        Ok(outcome.base_offset)
    } else {
        Err(outcome.error)
    }
}

async fn end_transaction(cluster: &Cluster, id: (ProducerId, ProducerEpoch), commit: bool) {
    let address = cluster.metadata().leader_address(TOPIC, 0).unwrap();
    let marker = TxnMarkerEntry {
        producer_id: id.0,
        producer_epoch: id.1,
        commit,
        coordinator_epoch: 0,
        partitions: vec![TopicPartition::new(TOPIC, 0)],
        transaction_number: 0,
    };
    let body = messages::write_txn_markers_request(&[marker], 10_000);
    let response = cluster
        .request_to(&address, ApiKey::WriteTxnMarkers, &body, &[])
        .await
        .unwrap();
    let results = messages::write_txn_markers_response(response.body()).unwrap();
    assert_eq!(results.len(), 1);
    assert!(results[0].2.is_ok(), "marker written: {:?}", results[0]);
}

async fn fetch_committed(cluster: &Cluster) -> messages::FetchedPartition {
    let address = cluster.metadata().leader_address(TOPIC, 0).unwrap();
    let entry = messages::FetchEntry {
        topic: TOPIC.to_owned(),
        partition: 0,
        fetch_offset: 0,
        max_bytes: 1 << 20,
    };
    let body = messages::fetch_request(0, 1, 1 << 20, IsolationLevel::ReadCommitted, &[entry]);
    let response = cluster
        .request_to(&address, ApiKey::Fetch, &body, &[])
        .await
        .unwrap();
    let payload = response.payload();
    messages::fetch_response(response.body(), &payload)
        .unwrap()
        .remove(0)
}

async fn end_offset(bootstrap: &str, isolation: IsolationLevel) -> i64 {
    let config = ConsumerConfig {
        isolation_level: isolation,
        ..ConsumerConfig::default()
    };
    let consumer = Consumer::connect(bootstrap, client_config(), config)
        .await
        .unwrap();
    consumer.end_offsets(TOPIC, &[0]).await.unwrap()[&0]
}

/// What `ringlog consume --until-end --isolation LEVEL` prints, one line
/// per record, joined by spaces.
fn cli_consume(bootstrap: &str, isolation: &str) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ringlog"))
        .args(["--bootstrap", bootstrap, "consume", TOPIC, "--until-end"])
        .args(["--isolation", isolation])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout)
        .unwrap()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Values read from the start until `offset` is reached or `quiet` passes
/// with nothing new; and the position reached.
async fn read(bootstrap: &str, isolation: IsolationLevel, until: i64) -> (Vec<String>, i64) {
    let config = ConsumerConfig {
        isolation_level: isolation,
        fetch_wait_ms_max: 100,
        ..ConsumerConfig::default()
    };
    let mut consumer = Consumer::connect(bootstrap, client_config(), config)
        .await
        .unwrap();
    consumer.assign(TOPIC, Some(&[0])).await.unwrap();
    consumer.seek(TOPIC, 0, SeekTo::Earliest).await.unwrap();
    let mut values = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline && consumer.position(TOPIC, 0).unwrap_or(0) < until {
        for r in consumer.poll(Duration::from_millis(100)).await.unwrap() {
            values.push(String::from_utf8(r.value.unwrap().to_vec()).unwrap());
        }
    }
    (values, consumer.position(TOPIC, 0).unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_committed_skips_aborted_and_waits_for_open_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port_block(1);
    let data = dir.path().join("b1");
    let mut broker = RealBroker::start_node(&data, port, 1, 1, &[]);
    let bootstrap = broker.bootstrap();
    create_topic(&bootstrap).await;
    let cluster = Cluster::connect(&bootstrap, client_config()).await.unwrap();
    cluster.refresh_metadata().await.unwrap();
    let a = cluster.init_producer_id().await.unwrap();
    let b = cluster.init_producer_id().await.unwrap();
    let plain = cluster.init_producer_id().await.unwrap();

    assert_eq!(
        produce(&cluster, &batch(a, 0, true, &["a0", "a1"])).await,
        Ok(0)
    );
    assert_eq!(produce(&cluster, &batch(b, 0, true, &["b0"])).await, Ok(2));
    assert_eq!(produce(&cluster, &batch(a, 2, true, &["a2"])).await, Ok(3));
    // A plain batch from a producer with an open transaction is refused.
    assert_eq!(
        produce(&cluster, &batch(a, 3, false, &["no"])).await,
        Err(ErrorCode::InvalidTxnState)
    );
    assert_eq!(
        produce(&cluster, &batch(plain, 0, false, &["p0"])).await,
        Ok(4)
    );
    end_transaction(&cluster, a, false).await; // offset 5
    assert_eq!(
        produce(&cluster, &batch(plain, 1, false, &["p1"])).await,
        Ok(6)
    );

    // b's transaction is open from offset 2: read_committed stops there,
    // and learns of a's aborted transaction.
    let fetched = fetch_committed(&cluster).await;
    assert_eq!(fetched.last_stable_offset, 2);
    assert_eq!(fetched.high_watermark, 7);
    assert_eq!(
        fetched.aborted,
        [messages::AbortedTransaction {
            producer_id: a.0 .0,
            first_offset: 0
        }]
    );
    let (values, position) = read(&bootstrap, IsolationLevel::ReadCommitted, 7).await;
    assert!(values.is_empty(), "nothing stable to show yet: {values:?}");
    assert_eq!(position, 2, "stopped at the last stable offset");
    let (values, _) = read(&bootstrap, IsolationLevel::ReadUncommitted, 7).await;
    assert_eq!(values, ["a0", "a1", "b0", "a2", "p0", "p1"]);
    assert_eq!(
        end_offset(&bootstrap, IsolationLevel::ReadCommitted).await,
        2
    );
    assert_eq!(
        end_offset(&bootstrap, IsolationLevel::ReadUncommitted).await,
        7
    );
    assert_eq!(
        cli_consume(&bootstrap, "read-uncommitted"),
        "a0 a1 b0 a2 p0 p1"
    );

    end_transaction(&cluster, b, true).await; // offset 7
    let expected_committed = ["b0", "p0", "p1"];
    let (values, position) = read(&bootstrap, IsolationLevel::ReadCommitted, 8).await;
    assert_eq!(values, expected_committed);
    assert_eq!(position, 8, "past both markers");
    assert_eq!(
        end_offset(&bootstrap, IsolationLevel::ReadCommitted).await,
        8
    );
    assert_eq!(cli_consume(&bootstrap, "read-committed"), "b0 p0 p1");

    // Judge from disk: kill -9, restart, read again; verify the files.
    broker.kill9();
    let mut broker = RealBroker::start_node(&data, port, 1, 1, &[]);
    let (values, _) = read(&bootstrap, IsolationLevel::ReadCommitted, 8).await;
    assert_eq!(values, expected_committed, "after a restart, from disk");
    let (values, _) = read(&bootstrap, IsolationLevel::ReadUncommitted, 8).await;
    assert_eq!(values, ["a0", "a1", "b0", "a2", "p0", "p1"]);
    broker.stop();
    verify_log(&data.join("topics").join(format!("{TOPIC}-0")));
}
