//! Transactional producers against a real broker process (two shards, so
//! coordinators and partitions live on different shards): a committed
//! transaction's records all appear to read_committed consumers and an
//! aborted one's never do; a second instance with the same transactional id
//! fences the first (its commit and later sends are refused) and aborts
//! what it left open; a transaction left open past its timeout is aborted
//! by the coordinator; `ringlog transaction list|describe` show the ids.
//! Everything is read back from disk after a kill -9 and a restart, and
//! `verify-log` passes on the files. With three brokers (RF 3), a
//! transaction survives the kill -9 of its coordinator while open and right
//! after the commit decision, and when the coordinator dies between the
//! markers of a transaction each partition still holds its marker once. The
//! consume-transform-produce example stays
//! exactly-once while killed with -9 at random points, while a paused
//! (SIGSTOP) instance is replaced and then resumed, and (RF 3) while a
//! partition leader is killed.

mod real_broker;
mod real_cluster;
mod real_quorum;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use client::{
    Admin, ClientConfig, ClientError, Consumer, ConsumerConfig, IsolationLevel, Producer,
    ProducerConfig, SeekTo,
};
use protocol::ErrorCode;
use real_broker::{free_port_block, verify_log, RealBroker};
use real_cluster::Brokers;
use real_quorum::Quorum;

const TOPIC: &str = "txn-out";
const PARTITIONS: i32 = 3;
const RF3_TOPIC: &str = "txn-rf3";
const RF3_PARTITIONS: i32 = 4;

fn client_config() -> ClientConfig {
    ClientConfig {
        request_timeout_ms: 10_000,
        ..ClientConfig::default()
    }
}

fn broker_config(dir: &Path) -> String {
    let path = dir.join("broker.toml");
    std::fs::write(&path, "[transactions]\nstate_topic_partitions = 4\n").unwrap();
    path.to_string_lossy().into_owned()
}

async fn transactional(bootstrap: &str, id: &str, timeout_ms: u32) -> Producer {
    let config = ProducerConfig {
        transactional_id: Some(id.to_owned()),
        transaction_timeout_ms: timeout_ms,
        linger_ms: 1,
        ..ProducerConfig::default()
    };
    Producer::connect(bootstrap, client_config(), config)
        .await
        .unwrap()
}

async fn send(producer: &Producer, values: &[&str]) -> Result<(), ClientError> {
    send_to(producer, TOPIC, values).await
}

async fn send_to(producer: &Producer, topic: &str, values: &[&str]) -> Result<(), ClientError> {
    let mut futures = Vec::new();
    for v in values {
        futures.push(
            producer
                .enqueue(client::ProducerRecord {
                    topic: topic.to_owned(),
                    key: Some(Bytes::from(v.to_string())),
                    value: Some(Bytes::from(v.to_string())),
                    ..Default::default()
                })
                .await?,
        );
    }
    for f in futures {
        f.await?;
    }
    Ok(())
}

/// Every value of the topic by partition, read from the start up to the
/// end offsets of `isolation`.
async fn read_all(bootstrap: &str, isolation: IsolationLevel) -> BTreeMap<i32, Vec<String>> {
    read_topic(bootstrap, TOPIC, PARTITIONS, isolation).await
}

async fn read_topic(
    bootstrap: &str,
    topic: &str,
    count: i32,
    isolation: IsolationLevel,
) -> BTreeMap<i32, Vec<String>> {
    // A broker just restarted may not serve every partition yet.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match read_topic_once(bootstrap, topic, count, isolation).await {
            Ok(read) => return read,
            Err(e) => assert!(Instant::now() < deadline, "reading {topic}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One read of the whole topic; an error when a broker the read needs is
/// down (callers that kill brokers retry).
async fn read_topic_once(
    bootstrap: &str,
    topic: &str,
    count: i32,
    isolation: IsolationLevel,
) -> Result<BTreeMap<i32, Vec<String>>, ClientError> {
    let config = ConsumerConfig {
        isolation_level: isolation,
        fetch_wait_ms_max: 100,
        ..ConsumerConfig::default()
    };
    let mut consumer = Consumer::connect(bootstrap, client_config(), config).await?;
    let partitions: Vec<i32> = (0..count).collect();
    consumer.assign(topic, Some(&partitions)).await?;
    for p in &partitions {
        consumer.seek(topic, *p, SeekTo::Earliest).await?;
    }
    let ends = consumer.end_offsets(topic, &partitions).await?;
    let mut out: BTreeMap<i32, Vec<String>> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while partitions
        .iter()
        .any(|p| consumer.position(topic, *p).unwrap_or(0) < ends[p])
    {
        assert!(Instant::now() < deadline, "read up to {ends:?}");
        for r in consumer.poll(Duration::from_millis(100)).await? {
            out.entry(r.partition)
                .or_default()
                .push(String::from_utf8(r.value.unwrap().to_vec()).unwrap());
        }
    }
    Ok(out)
}

fn values(read: &BTreeMap<i32, Vec<String>>) -> Vec<String> {
    let mut all: Vec<String> = read.values().flatten().cloned().collect();
    all.sort();
    all
}

/// Waits until read_committed readers see exactly `expected` (markers
/// reach partitions after the commit returns).
async fn await_committed(bootstrap: &str, expected: &[String]) -> BTreeMap<i32, Vec<String>> {
    await_committed_in(bootstrap, TOPIC, PARTITIONS, expected).await
}

async fn await_committed_in(
    bootstrap: &str,
    topic: &str,
    count: i32,
    expected: &[String],
) -> BTreeMap<i32, Vec<String>> {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let read =
            match read_topic_once(bootstrap, topic, count, IsolationLevel::ReadCommitted).await {
                Ok(read) => read,
                Err(e) => {
                    assert!(Instant::now() < deadline, "reading: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
        if values(&read) == expected || Instant::now() > deadline {
            assert_eq!(values(&read), expected, "read_committed sees the commits");
            return read;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn cli(bootstrap: &str, args: &[&str]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ringlog"))
        .args(["--bootstrap", bootstrap])
        .args(args)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).unwrap()
}

/// Runs the CLI until its output contains `needle` (within 20 s).
async fn await_cli(bootstrap: &str, args: &[&str], needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = cli(bootstrap, args);
        if out.contains(needle) {
            return out;
        }
        assert!(
            Instant::now() < deadline,
            "{args:?} never showed {needle:?}: {out}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn strings(values: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = values.iter().map(|s| s.to_string()).collect();
    out.sort();
    out
}

fn is_fenced(error: &ClientError) -> bool {
    matches!(
        error,
        ClientError::Broker {
            code: ErrorCode::ProducerFenced | ErrorCode::InvalidProducerEpoch,
            ..
        }
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_commit_abort_fence_and_time_out() {
    let dir = tempfile::tempdir().unwrap();
    let config = broker_config(dir.path());
    let port = free_port_block(2);
    let data = dir.path().join("b1");
    let mut broker = RealBroker::start_node(&data, port, 1, 2, &["--config", &config]);
    let bootstrap = broker.bootstrap();
    let admin = Admin::connect(&bootstrap, client_config()).await.unwrap();
    admin.create_topic(TOPIC, PARTITIONS, 1, &[]).await.unwrap();

    // Records are sent only inside a transaction.
    let first = transactional(&bootstrap, "tx-a", 60_000).await;
    assert!(matches!(
        send(&first, &["early"]).await,
        Err(ClientError::InvalidTransactionState(_))
    ));
    first.init_transactions().await.unwrap();
    assert!(matches!(
        send(&first, &["outside"]).await,
        Err(ClientError::InvalidTransactionState(_))
    ));

    // A committed transaction over every partition.
    let committed: Vec<String> = (0..30).map(|i| format!("c{i:02}")).collect();
    first.begin_transaction().unwrap();
    let refs: Vec<&str> = committed.iter().map(String::as_str).collect();
    send(&first, &refs).await.unwrap();
    // Open: read_committed readers see nothing yet.
    assert!(values(&read_all(&bootstrap, IsolationLevel::ReadCommitted).await).is_empty());
    first.commit_transaction().await.unwrap();
    await_committed(&bootstrap, &committed).await;

    // An aborted one: never shown to read_committed readers.
    first.begin_transaction().unwrap();
    send(&first, &["a1", "a2", "a3"]).await.unwrap();
    first.abort_transaction().await.unwrap();
    let mut expected = committed.clone();
    expected.extend(["d1".to_string()]);
    expected.sort();
    first.begin_transaction().unwrap();
    send(&first, &["d1"]).await.unwrap();
    first.commit_transaction().await.unwrap();
    await_committed(&bootstrap, &expected).await;
    let uncommitted = values(&read_all(&bootstrap, IsolationLevel::ReadUncommitted).await);
    assert!(uncommitted.contains(&"a2".to_string()), "{uncommitted:?}");

    // A second instance fences the first and aborts its open transaction.
    first.begin_transaction().unwrap();
    send(&first, &["zombie"]).await.unwrap();
    let second = transactional(&bootstrap, "tx-a", 60_000).await;
    second.init_transactions().await.unwrap();
    let refused = first.commit_transaction().await.unwrap_err();
    assert!(
        is_fenced(&refused),
        "the zombie's commit is refused: {refused}"
    );
    second.begin_transaction().unwrap();
    send(&second, &["s1", "s2"]).await.unwrap();
    second.commit_transaction().await.unwrap();
    expected.extend(strings(&["s1", "s2"]));
    expected.sort();
    await_committed(&bootstrap, &expected).await;
    // Complete is written once every marker is in, just after readers see
    // them.
    await_cli(
        &bootstrap,
        &["transaction", "list"],
        "tx-a\tstate=CompleteCommit",
    )
    .await;

    // A transaction left open past its timeout is aborted by the
    // coordinator, which releases read_committed readers.
    let stalled = transactional(&bootstrap, "tx-stalled", 5_000).await;
    stalled.init_transactions().await.unwrap();
    stalled.begin_transaction().unwrap();
    send(&stalled, &["t1", "t2"]).await.unwrap();
    let describe = cli(&bootstrap, &["transaction", "describe", "tx-stalled"]);
    assert!(describe.contains("state\tOngoing"), "{describe}");
    assert!(describe.contains(&format!("{TOPIC}\t")), "{describe}");
    let describe = await_cli(
        &bootstrap,
        &["transaction", "describe", "tx-stalled"],
        "state\tCompleteAbort",
    )
    .await;
    assert!(describe.contains("producer_epoch\t1"), "bumped: {describe}");
    let late = stalled.commit_transaction().await.unwrap_err();
    assert!(
        is_fenced(&late),
        "a timed-out transaction cannot commit: {late}"
    );
    let after_timeout = await_committed(&bootstrap, &expected).await;

    // Judge from disk: kill -9, restart, read again; verify the files.
    broker.kill9();
    let broker = RealBroker::start_node(&data, port, 1, 2, &["--config", &config]);
    let bootstrap = broker.bootstrap();
    let reread = await_committed(&bootstrap, &expected).await;
    assert_eq!(
        reread, after_timeout,
        "same records, same order, after restart"
    );
    await_cli(
        &bootstrap,
        &["transaction", "describe", "tx-a"],
        "state\tCompleteCommit",
    )
    .await;
    drop(broker);
    for p in 0..PARTITIONS {
        verify_log(&data.join("topics").join(format!("{TOPIC}-{p}")));
    }
}

/// A controller quorum (2 s broker sessions) and three brokers of one
/// shard whose `__transaction_state` and `__consumer_offsets` have 3
/// replicas; the runtime drives the clients.
fn rf3_cluster(root: &Path) -> (Quorum, tokio::runtime::Runtime, Brokers) {
    let path = root.join("rf3.toml");
    std::fs::write(
        &path,
        "[transactions]\nstate_topic_partitions = 2\nstate_topic_replication_factor = 3\n\
         [groups]\noffsets_topic_partitions = 2\noffsets_topic_replication_factor = 3\n",
    )
    .unwrap();
    let config = path.to_string_lossy().into_owned();
    let quorum = Quorum::start(&["--session-timeout-ms", "2000"]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(quorum.leader(Duration::from_secs(20)));
    let brokers = Brokers::start_with(root, quorum.controller_list(), 1, &["--config", &config]);
    (quorum, runtime, brokers)
}

/// Stops every broker cleanly and runs `verify-log` on each replica of
/// `topic`.
fn stop_and_verify(brokers: &mut Brokers, topic: &str, partitions: i32) {
    for id in 1..=3 {
        brokers.stop(id);
    }
    for id in 1..=3 {
        for p in 0..partitions {
            verify_log(
                &brokers
                    .data_dir(id)
                    .join("topics")
                    .join(format!("{topic}-{p}")),
            );
        }
    }
}

/// Waits (30 s at most) until `id`'s transaction is CompleteCommit.
fn await_complete_commit(runtime: &tokio::runtime::Runtime, admin: &Admin, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let described = runtime.block_on(admin.describe_transaction(id));
        if described
            .as_ref()
            .is_ok_and(|d| d.state == "CompleteCommit")
        {
            return;
        }
        assert!(Instant::now() < deadline, "{described:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn numbered(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}{i:02}")).collect()
}

/// Creates the RF 3 topic (min.insync.replicas 2); returns the admin.
async fn rf3_topic(bootstrap: &str) -> Admin {
    let admin = Admin::connect(bootstrap, client_config()).await.unwrap();
    let configs = [("min.insync.replicas".to_string(), "2".to_string())];
    admin
        .create_topic(RF3_TOPIC, RF3_PARTITIONS, 3, &configs)
        .await
        .unwrap();
    admin
}

async fn send_all(producer: &Producer, values: &[String]) {
    let refs: Vec<&str> = values.iter().map(String::as_str).collect();
    send_to(producer, RF3_TOPIC, &refs).await.unwrap();
}

#[test]
fn transactions_survive_the_kill_of_their_coordinator() {
    let root = tempfile::tempdir().unwrap();
    let (_quorum, runtime, mut brokers) = rf3_cluster(root.path());
    let bootstrap = brokers.bootstrap_all();
    let admin = runtime.block_on(rf3_topic(&bootstrap));
    let producer = runtime.block_on(async {
        let producer = transactional(&bootstrap, "rf3-tx", 60_000).await;
        producer.init_transactions().await.unwrap();
        producer
    });
    let mut expected = Vec::new();

    // One committed and one aborted transaction, before any failure.
    runtime.block_on(async {
        producer.begin_transaction().unwrap();
        send_all(&producer, &numbered("c1-", 20)).await;
        producer.commit_transaction().await.unwrap();
        producer.begin_transaction().unwrap();
        send_all(&producer, &numbered("a2-", 20)).await;
        producer.abort_transaction().await.unwrap();
    });
    expected.extend(numbered("c1-", 20));

    // The coordinator dies while the transaction is open: the new one
    // loaded it and commits it.
    let coordinator = |admin: &Admin| {
        runtime
            .block_on(admin.find_transaction_coordinator("rf3-tx"))
            .unwrap()
            .node_id as u32
    };
    let first = coordinator(&admin);
    runtime.block_on(async {
        producer.begin_transaction().unwrap();
        send_all(&producer, &numbered("o3-", 20)).await;
    });
    brokers.kill9(first);
    runtime.block_on(producer.commit_transaction()).unwrap();
    expected.extend(numbered("o3-", 20));
    brokers.restart(first);

    // The coordinator dies right after the commit decision is replicated,
    // before (or while) the markers are written: the new one finishes it.
    runtime.block_on(async {
        producer.begin_transaction().unwrap();
        send_all(&producer, &numbered("p4-", 20)).await;
        producer.commit_transaction().await.unwrap();
    });
    let second = coordinator(&admin);
    brokers.kill9(second);
    expected.extend(numbered("p4-", 20));
    expected.sort();
    let read = runtime.block_on(await_committed_in(
        &bootstrap,
        RF3_TOPIC,
        RF3_PARTITIONS,
        &expected,
    ));
    // Complete is written once every marker is in, just after readers see
    // them.
    await_complete_commit(&runtime, &admin, "rf3-tx");
    brokers.restart(second);

    // Judge from disk: kill -9 every broker, restart, read again; verify
    // every replica's files.
    for id in 1..=3 {
        brokers.kill9(id);
    }
    for id in 1..=3 {
        brokers.restart(id);
    }
    let reread = runtime.block_on(await_committed_in(
        &bootstrap,
        RF3_TOPIC,
        RF3_PARTITIONS,
        &expected,
    ));
    assert_eq!(reread, read, "same records, same order, after restarts");
    stop_and_verify(&mut brokers, RF3_TOPIC, RF3_PARTITIONS);
}

/// Control batches in one replica's segment files: how many markers, and
/// whether any transactional data batch is there.
fn markers_on_disk(dir: &Path) -> (usize, bool) {
    let mut markers = 0;
    let mut data = false;
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    files.sort();
    for file in files {
        let bytes = std::fs::read(&file).unwrap();
        let mut at = 0;
        while at < bytes.len() {
            let Ok((batch, used)) = protocol::RecordBatch::parse_prefix(&bytes[at..], 1 << 24)
            else {
                break;
            };
            let header = batch.header();
            if header.is_control() {
                protocol::record_batch::marker::parse_marker(&batch).unwrap();
                markers += 1;
            } else if header.is_transactional() {
                data = true;
            }
            at += used;
        }
    }
    (markers, data)
}

/// The coordinator dies between a transaction's markers: the partition of
/// an RF 1 topic whose only broker is paused (SIGSTOP) cannot take its
/// marker while the RF 3 partitions took theirs (read_committed readers
/// see them), the coordinator is killed (-9) in PrepareCommit, and its
/// successor resends every marker once the broker resumes. The transaction
/// completes and every partition holds its marker exactly once, on every
/// replica's disk.
#[test]
fn markers_land_once_when_the_coordinator_fails_over_between_them() {
    const RF1_TOPIC: &str = "txn-rf1";
    let root = tempfile::tempdir().unwrap();
    let (_quorum, runtime, mut brokers) = rf3_cluster(root.path());
    let bootstrap = brokers.bootstrap_all();
    let admin = runtime.block_on(async {
        let admin = rf3_topic(&bootstrap).await;
        admin.create_topic(RF1_TOPIC, 3, 1, &[]).await.unwrap();
        admin
    });
    let producer = runtime.block_on(async {
        let producer = transactional(&bootstrap, "once-tx", 60_000).await;
        producer.init_transactions().await.unwrap();
        producer
    });
    let coordinator = runtime
        .block_on(admin.find_transaction_coordinator("once-tx"))
        .unwrap()
        .node_id as u32;
    // An RF 1 partition led elsewhere; its broker is paused below.
    let described = runtime.block_on(admin.describe_topic(RF1_TOPIC)).unwrap();
    let (partition, paused) = described
        .partitions
        .iter()
        .find(|p| p.leader > 0 && p.leader as u32 != coordinator)
        .map(|p| (p.partition, p.leader as u32))
        .expect("the RF 1 topic's partitions are spread over the brokers");
    let reader = (1..=3)
        .find(|id| *id != coordinator && *id != paused)
        .unwrap();
    let reader_bootstrap = brokers.bootstrap(reader);
    let committed = numbered("m-", 20);
    let pinned = numbered("x-", 5);
    runtime.block_on(async {
        producer.begin_transaction().unwrap();
        send_all(&producer, &committed).await;
        let mut futures = Vec::new();
        for v in &pinned {
            let record = client::ProducerRecord {
                topic: RF1_TOPIC.to_owned(),
                partition: Some(partition),
                value: Some(Bytes::from(v.clone())),
                ..Default::default()
            };
            futures.push(producer.enqueue(record).await.unwrap());
        }
        for f in futures {
            f.await.unwrap();
        }
    });
    brokers.signal(paused, "-STOP");
    let producer = std::sync::Arc::new(producer);
    let committing = {
        let producer = producer.clone();
        runtime.spawn(async move { producer.commit_transaction().await })
    };
    // The RF 3 partitions' markers land (leadership leaves the paused
    // broker); the RF 1 partition's cannot, so the transaction stays
    // prepared.
    let mut expected = committed.clone();
    expected.sort();
    runtime.block_on(await_committed_in(
        &reader_bootstrap,
        RF3_TOPIC,
        RF3_PARTITIONS,
        &expected,
    ));
    let state = runtime
        .block_on(Admin::connect(&reader_bootstrap, client_config()))
        .unwrap();
    let described = runtime.block_on(state.describe_transaction("once-tx"));
    assert_eq!(
        described.as_ref().map(|d| d.state.as_str()).ok(),
        Some("PrepareCommit"),
        "{described:?}"
    );
    brokers.kill9(coordinator);
    brokers.signal(paused, "-CONT");
    runtime.block_on(committing).unwrap().unwrap();
    // The killed broker holds an RF 1 partition too.
    brokers.restart(coordinator);
    let mut expected_pinned = pinned.clone();
    expected_pinned.sort();
    runtime.block_on(await_committed_in(
        &reader_bootstrap,
        RF1_TOPIC,
        3,
        &expected_pinned,
    ));
    await_complete_commit(&runtime, &state, "once-tx");
    // Judged from disk after a clean stop: every replica of every partition
    // the transaction wrote holds its marker once.
    for id in 1..=3 {
        brokers.stop(id);
    }
    let mut replicas_with_data = 0;
    for id in 1..=3 {
        let topics = brokers.data_dir(id).join("topics");
        for (topic, count) in [(RF3_TOPIC, RF3_PARTITIONS), (RF1_TOPIC, 3)] {
            for p in 0..count {
                let dir = topics.join(format!("{topic}-{p}"));
                if !dir.exists() {
                    continue;
                }
                verify_log(&dir);
                let (markers, data) = markers_on_disk(&dir);
                assert_eq!(
                    markers,
                    usize::from(data),
                    "{}: markers of the one transaction",
                    dir.display()
                );
                replicas_with_data += usize::from(data);
            }
        }
    }
    assert!(
        replicas_with_data >= 4,
        "the transaction reached the RF 1 partition and the 3 replicas of an RF 3 one"
    );
}

fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

/// Signals once the example's piped stdout reports its first committed
/// transaction, and keeps draining it (a closed pipe would end the
/// process at its next line).
fn first_progress(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<()> {
    use std::io::BufRead;
    let stdout = child.stdout.take().expect("stdout piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut told = false;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if !told && line.starts_with("processed") {
                let _ = tx.send(());
                told = true;
            }
        }
    });
    rx
}

/// The consume-transform-produce example, built like the broker binary.
fn transform_example() -> std::path::PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = std::process::Command::new(cargo)
        .args(["build", "-p", "client", "--example", "transform"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building the transform example failed");
    // target/debug/deps/transactions-xxxx -> target/debug/examples/transform
    std::env::current_exe()
        .unwrap()
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("examples")
        .join("transform")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consume_transform_produce_pipeline_is_exactly_once_across_kill_9() {
    const INPUT: &str = "etl-in";
    const OUTPUT: &str = "etl-out";
    const RECORDS: usize = 3_000;
    let example = transform_example();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broker.toml");
    std::fs::write(
        &path,
        "[transactions]\nstate_topic_partitions = 4\n[groups]\noffsets_topic_partitions = 4\n",
    )
    .unwrap();
    let config = path.to_string_lossy().into_owned();
    let port = free_port_block(2);
    let data = dir.path().join("b1");
    let mut broker = RealBroker::start_node(&data, port, 1, 2, &["--config", &config]);
    let bootstrap = broker.bootstrap();
    let admin = Admin::connect(&bootstrap, client_config()).await.unwrap();
    admin.create_topic(INPUT, PARTITIONS, 1, &[]).await.unwrap();
    admin
        .create_topic(OUTPUT, PARTITIONS, 1, &[])
        .await
        .unwrap();
    fill_input(&bootstrap, INPUT, RECORDS).await;

    // The pipeline, killed with -9 at random points, restarted each time;
    // the last run drains the input and exits.
    let run = |idle_exit_ms: &str| {
        std::process::Command::new(&example)
            .args([
                &bootstrap,
                INPUT,
                OUTPUT,
                "etl",
                "etl-tx",
                "2000",
                idle_exit_ms,
                "10",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut seed = 0x9e37_79b9_u64;
    for _ in 0..4 {
        let mut child = run("60000");
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        tokio::time::sleep(Duration::from_millis(300 + (seed >> 33) % 1200)).await;
        child.kill().unwrap();
        child.wait().unwrap();
    }
    // A zombie: an instance paused (SIGSTOP) mid-stream while the next one
    // takes the transactional id over and finishes the input; resumed, it
    // cannot append or commit anything (checked by the output below).
    let mut zombie = std::process::Command::new(&example)
        .args([
            &bootstrap, INPUT, OUTPUT, "etl", "etl-tx", "2000", "60000", "10",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Paused once it has committed a transaction of its own.
    let progressed = first_progress(&mut zombie);
    assert!(
        progressed.recv_timeout(Duration::from_secs(30)).is_ok(),
        "the instance to pause processed nothing"
    );
    signal(zombie.id(), "-STOP");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let status = run("3000").wait().unwrap();
        if status.success() {
            break;
        }
        // A transaction failed (a rebalance fenced the member): restart.
        assert!(Instant::now() < deadline, "the pipeline never finished");
    }
    signal(zombie.id(), "-CONT");
    tokio::time::sleep(Duration::from_secs(3)).await;
    zombie.kill().unwrap();
    zombie.wait().unwrap();

    let expected = check_pipeline(&bootstrap, &admin, INPUT, OUTPUT, RECORDS).await;

    // Judge from disk: kill -9, restart, read the output again.
    broker.kill9();
    let broker = RealBroker::start_node(&data, port, 1, 2, &["--config", &config]);
    let bootstrap = broker.bootstrap();
    let reread = read_topic(
        &bootstrap,
        OUTPUT,
        PARTITIONS,
        IsolationLevel::ReadCommitted,
    )
    .await;
    assert_eq!(reread, expected, "the same after a restart");
    drop(broker);
    for p in 0..PARTITIONS {
        verify_log(&data.join("topics").join(format!("{OUTPUT}-{p}")));
    }
}

/// `count` records with 50 keys into `topic`.
async fn fill_input(bootstrap: &str, topic: &str, count: usize) {
    let producer = Producer::connect(bootstrap, client_config(), ProducerConfig::default())
        .await
        .unwrap();
    let mut deliveries = Vec::new();
    for i in 0..count {
        let record = client::ProducerRecord {
            topic: topic.to_owned(),
            key: Some(Bytes::from(format!("k{}", i % 50))),
            value: Some(Bytes::from(format!("v{i:05}"))),
            ..Default::default()
        };
        deliveries.push(producer.enqueue(record).await.unwrap());
    }
    for d in deliveries {
        d.await.unwrap();
    }
}

/// Every input record appears once in the output, in its partition's
/// order, and group `etl`'s committed offsets are the input's ends.
/// Returns the output.
async fn check_pipeline(
    bootstrap: &str,
    admin: &Admin,
    input_topic: &str,
    output_topic: &str,
    records: usize,
) -> BTreeMap<i32, Vec<String>> {
    let input = read_topic(
        bootstrap,
        input_topic,
        PARTITIONS,
        IsolationLevel::ReadCommitted,
    )
    .await;
    let expected: BTreeMap<i32, Vec<String>> = input
        .iter()
        .map(|(p, values)| (*p, values.iter().map(|v| format!("T:{v}")).collect()))
        .collect();
    assert_eq!(
        input.values().map(Vec::len).sum::<usize>(),
        records,
        "input complete"
    );
    let output = read_topic(
        bootstrap,
        output_topic,
        PARTITIONS,
        IsolationLevel::ReadCommitted,
    )
    .await;
    assert_eq!(output, expected, "exactly once, in order");
    let committed = admin.fetch_committed("etl", None).await.unwrap();
    for (p, values) in &input {
        let tp = client::TopicPartition::new(input_topic, *p);
        assert_eq!(
            committed.get(&tp).map(|c| c.offset),
            Some(values.len() as i64),
            "committed offset of {tp:?}"
        );
    }
    expected
}

/// Whether group `etl` committed every record of `topic`.
async fn pipeline_done(admin: &Admin, topic: &str, records: usize) -> bool {
    match admin.fetch_committed("etl", None).await {
        Ok(committed) => {
            committed
                .iter()
                .filter(|(tp, _)| tp.topic == topic)
                .map(|(_, c)| c.offset)
                .sum::<i64>()
                == records as i64
        }
        Err(_) => false,
    }
}

#[test]
fn a_pipeline_stays_exactly_once_while_a_partition_leader_is_killed() {
    const INPUT: &str = "rf3-in";
    const OUTPUT: &str = "rf3-out";
    const RECORDS: usize = 2_000;
    let example = transform_example();
    let root = tempfile::tempdir().unwrap();
    let (_quorum, runtime, mut brokers) = rf3_cluster(root.path());
    let bootstrap = brokers.bootstrap_all();
    let admin = runtime.block_on(async {
        let admin = Admin::connect(&bootstrap, client_config()).await.unwrap();
        let configs = [("min.insync.replicas".to_string(), "2".to_string())];
        for topic in [INPUT, OUTPUT] {
            admin
                .create_topic(topic, PARTITIONS, 3, &configs)
                .await
                .unwrap();
        }
        fill_input(&bootstrap, INPUT, RECORDS).await;
        admin
    });
    let run = || {
        std::process::Command::new(&example)
            .args([
                &bootstrap, INPUT, OUTPUT, "etl", "etl-rf3", "3000", "4000", "10",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    // Once the pipeline has committed work, the leader of input partition
    // 0 is killed with -9 and restarted a second later.
    let mut child = run();
    let progressed = first_progress(&mut child);
    assert!(
        progressed.recv_timeout(Duration::from_secs(60)).is_ok(),
        "the pipeline processed nothing"
    );
    let leader = runtime.block_on(async {
        let cluster = client::Cluster::connect(&bootstrap, client_config())
            .await
            .unwrap();
        cluster.refresh_metadata().await.unwrap();
        cluster.metadata().topic(INPUT).unwrap().partitions[0].leader
    });
    brokers.kill9(u32::try_from(leader).unwrap());
    std::thread::sleep(Duration::from_secs(1));
    brokers.restart(u32::try_from(leader).unwrap());
    // Runs until the group committed the whole input; an instance that
    // stops (a failed transaction, or idle while leaders moved) is
    // restarted.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let status = child.wait().unwrap();
        if runtime.block_on(pipeline_done(&admin, INPUT, RECORDS)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the pipeline never finished (last exit {status})"
        );
        child = run();
    }
    let expected = runtime.block_on(check_pipeline(&bootstrap, &admin, INPUT, OUTPUT, RECORDS));

    // Judge from disk: kill -9 every broker, restart, read the output
    // again; then every replica's files are verified.
    for id in 1..=3 {
        brokers.kill9(id);
    }
    for id in 1..=3 {
        brokers.restart(id);
    }
    let reread = runtime.block_on(read_topic(
        &bootstrap,
        OUTPUT,
        PARTITIONS,
        IsolationLevel::ReadCommitted,
    ));
    assert_eq!(reread, expected, "the same after restarts");
    stop_and_verify(&mut brokers, OUTPUT, PARTITIONS);
}
