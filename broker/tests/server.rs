//! Multi-process tests of the real `ringlog-broker` on 127.0.0.1: topic admin,
//! produce and fetch through the main port and the shard ports, long-poll,
//! offsets by time, clean restart and kill -9 recovery.

mod support;

use std::time::{Duration, Instant};

use protocol::{ErrorCode, RecordBatch};
use support::cluster::{Broker, Client};
use support::{batch, decode};

const PARTITIONS: i32 = 4;

/// Every batch of a partition, read from `from` to the end through `client`.
fn read_all(client: &mut Client, topic: &str, partition: i32) -> Vec<(i64, Vec<Vec<u8>>)> {
    let mut out = Vec::new();
    let mut next = 0;
    loop {
        let (code, hw, _, records) = client.fetch(topic, partition, next, 1 << 20, 0);
        assert_eq!(code, ErrorCode::None);
        if records.is_empty() {
            assert_eq!(next, hw, "read up to the high watermark");
            return out;
        }
        for (base, values) in decode(&records) {
            next = base + values.len() as i64;
            out.push((base, values));
        }
    }
}

fn produce_all(broker: &Broker, client: &mut Client, topic: &str, rounds: u64) -> Vec<Vec<u64>> {
    let shards = client.partition_shards(topic);
    assert_eq!(shards.len(), PARTITIONS as usize);
    let mut shard_clients: Vec<Client> = (0..broker.cores as u16)
        .map(|s| Client::connect(broker.shard_addr(s)).unwrap())
        .collect();
    let mut tags = vec![Vec::new(); PARTITIONS as usize];
    for round in 0..rounds {
        for &(partition, shard) in &shards {
            let tag = round * 100 + partition as u64;
            // Alternate between the main port (routed) and the owning shard's port.
            let client = if round % 2 == 0 {
                &mut *client
            } else {
                &mut shard_clients[shard as usize]
            };
            let (code, base) = client.produce(
                topic,
                partition,
                &batch(tag, 3, 1_000 + round as i64, 40),
                -1,
            );
            assert_eq!(code, ErrorCode::None);
            assert_eq!(base, round as i64 * 3);
            tags[partition as usize].push(tag);
        }
    }
    tags
}

fn check(client: &mut Client, topic: &str, tags: &[Vec<u64>]) {
    for partition in 0..PARTITIONS {
        let batches = read_all(client, topic, partition);
        let got: Vec<u64> = batches
            .iter()
            .map(|(_, values)| {
                String::from_utf8_lossy(&values[0])
                    .split(':')
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap()
            })
            .collect();
        assert_eq!(
            got, tags[partition as usize],
            "partition {partition} in order"
        );
    }
}

/// Records produced through both ports come back in per-partition order, and
/// survive a clean restart and a kill -9.
#[test]
fn produce_fetch_restart_and_crash() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut broker = Broker::start(&data, 2);
    let mut client = Client::connect(broker.addr()).unwrap();
    assert_eq!(
        client.create_topic("orders", PARTITIONS, &[]),
        ErrorCode::None
    );
    assert_eq!(
        client.create_topic("orders", PARTITIONS, &[]),
        ErrorCode::TopicAlreadyExists
    );
    let shards: Vec<u16> = client
        .partition_shards("orders")
        .iter()
        .map(|(_, s)| *s)
        .collect();
    assert!(
        shards.contains(&0) && shards.contains(&1),
        "partitions spread over both shards: {shards:?}"
    );
    let tags = produce_all(&broker, &mut client, "orders", 10);
    check(&mut client, "orders", &tags);
    assert_eq!(client.list_offset("orders", 0, -2), (ErrorCode::None, 0));
    assert_eq!(client.list_offset("orders", 0, -1), (ErrorCode::None, 30));
    // Round r holds timestamps r+1000..r+1003: the first at or after 1005 is round 3's last record.
    assert_eq!(
        client.list_offset("orders", 0, 1_005),
        (ErrorCode::None, 11)
    );

    assert_eq!(broker.stop(), Some(0), "clean exit on SIGTERM");
    assert!(broker.log().contains("broker stopped cleanly"));
    let mut broker = Broker::start(&data, 2);
    let mut client = Client::connect(broker.addr()).unwrap();
    check(&mut client, "orders", &tags);
    // No recovery scan after a clean shutdown.
    assert!(!broker.log().contains("truncating"), "{}", broker.log());

    broker.kill9();
    let broker = Broker::start(&data, 2);
    let mut client = Client::connect(broker.addr()).unwrap();
    check(&mut client, "orders", &tags);
}

/// A fetch at the log end waits for new data and returns as soon as it lands.
#[test]
fn fetch_long_poll_wakes_on_append() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&dir.path().join("data"), 2);
    let mut client = Client::connect(broker.addr()).unwrap();
    assert_eq!(client.create_topic("tail", 1, &[]), ErrorCode::None);
    let addr = broker.addr();
    let waiter = std::thread::spawn(move || {
        let mut consumer = Client::connect(addr).unwrap();
        let started = Instant::now();
        let (code, _, _, records) = consumer.fetch("tail", 0, 0, 1 << 20, 10_000);
        (code, records, started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        client.produce("tail", 0, &batch(1, 2, 5, 10), 1).0,
        ErrorCode::None
    );
    let (code, records, waited) = waiter.join().unwrap();
    assert_eq!(code, ErrorCode::None);
    assert_eq!(decode(&records).len(), 1);
    assert!(
        waited < Duration::from_secs(5),
        "woke on append, not on timeout: {waited:?}"
    );
    // An empty wait returns after max_wait_ms with nothing.
    let (code, _, _, records) = client.fetch("tail", 0, 2, 1 << 20, 100);
    assert_eq!((code, records.len()), (ErrorCode::None, 0));
    // Stored batches are served exactly as stored: stamped, CRC intact.
    let (_, _, _, records) = client.fetch("tail", 0, 0, 1 << 20, 0);
    let stored = RecordBatch::parse(&records, 1 << 20).unwrap();
    assert_eq!(stored.header().base_offset.0, 0);
}

/// The admin port serves Prometheus metrics from every shard: request counts
/// and latency histograms per API, log end offsets, connections.
#[test]
fn metrics_endpoint_reports_every_shard() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&dir.path().join("data"), 2);
    let mut client = Client::connect(broker.addr()).unwrap();
    assert_eq!(client.create_topic("m", 2, &[]), ErrorCode::None);
    for partition in 0..2 {
        assert_eq!(
            client.produce("m", partition, &batch(1, 5, 1, 10), 1).0,
            ErrorCode::None
        );
    }
    let mut http = std::net::TcpStream::connect(("127.0.0.1", broker.port + 64)).unwrap();
    http.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    http.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.0 200 OK"), "{text}");
    for shard in 0..2 {
        assert!(
            text.contains(&format!("ringlog_connections_open{{shard=\"{shard}\"}}")),
            "{text}"
        );
    }
    assert!(
        text.contains("ringlog_requests_total{shard=\"0\",api=\"produce\"}")
            || text.contains("ringlog_requests_total{shard=\"1\",api=\"produce\"}")
    );
    assert!(text.contains("ringlog_request_latency_seconds_bucket"));
    assert!(
        text.contains("ringlog_log_end_offset{shard=\"0\",topic=\"m\",partition=\"1\"} 5")
            || text.contains("ringlog_log_end_offset{shard=\"1\",topic=\"m\",partition=\"1\"} 5"),
        "{text}"
    );
    // Every direct write and every commit is timed: an acknowledgement
    // (acks=1 under the default `always`) waited for both. With the
    // default shard journal, a commit is a journal round, not a file sync.
    let sum = |name: &str| -> u64 {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    let writes = sum("ringlog_log_chunk_writes_total");
    let journaled = sum("ringlog_log_journal_commits_total");
    let commits = sum("ringlog_log_data_syncs_total") + journaled;
    assert!(
        writes >= 2 && journaled >= 2,
        "{writes} writes, {journaled} journal commits"
    );
    assert!(sum("ringlog_journal_rounds_total") >= 1, "{text}");
    assert_eq!(sum("ringlog_log_journal_fallbacks_total"), 0, "{text}");
    assert_eq!(sum("ringlog_log_write_seconds_count"), writes, "{text}");
    assert_eq!(sum("ringlog_log_sync_seconds_count"), commits, "{text}");
    assert!(text.contains("ringlog_log_write_seconds_bucket{shard=\"0\",le=\"+Inf\"}"));
    assert!(text.contains("ringlog_log_sync_seconds_sum{shard=\"1\"}"));
}

/// The sum of one metric over every shard, from the admin port.
fn metric_sum(broker: &Broker, name: &str) -> i64 {
    use std::io::{Read, Write};
    let mut http = std::net::TcpStream::connect(("127.0.0.1", broker.port + 64)).unwrap();
    http.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    http.read_to_string(&mut text).unwrap();
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<i64>().ok())
        .sum()
}

/// A fetch long poll over several partitions, on both shards, stops waiting
/// on every one of them as soon as its response goes: no wait outlives the
/// response (they used to linger until the request's 30 s max wait, one
/// detached waiter per partition).
#[test]
fn a_long_poll_leaves_no_waits_behind() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&dir.path().join("data"), 2);
    let mut client = Client::connect(broker.addr()).unwrap();
    assert_eq!(client.create_topic("w", 4, &[]), ErrorCode::None);
    let shards: Vec<u16> = client
        .partition_shards("w")
        .iter()
        .map(|(_, s)| *s)
        .collect();
    assert!(
        shards.contains(&0) && shards.contains(&1),
        "both shards: {shards:?}"
    );
    for partition in 0..4 {
        assert_eq!(
            client.produce("w", partition, &batch(1, 5, 1, 10), 1).0,
            ErrorCode::None
        );
    }
    // Tailing all four at their end: nothing to read, so the poll waits.
    let mut poller = Client::connect(broker.addr()).unwrap();
    let id = poller.send_fetch_many("w", &[(0, 5), (1, 5), (2, 5), (3, 5)], 30_000, 64 << 20);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while metric_sum(&broker, "ringlog_fetch_waiters") < 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "the poll never waited"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        client.produce("w", 0, &batch(2, 5, 1, 10), 1).0,
        ErrorCode::None
    );
    let (got, _) = poller.receive().unwrap();
    assert_eq!(got, id);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let waiting = metric_sum(&broker, "ringlog_fetch_waiters");
        if waiting == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{waiting} waits outlived the response"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// (partition, bytes of records, high watermark) of each partition of the
/// first topic of a fetch response, in response order.
fn fetch_results(response: &support::cluster::Response) -> Vec<(i32, u32, i64)> {
    let parsed =
        protocol::flatbuffers::root::<protocol::wire::FetchResponse>(&response.body).unwrap();
    parsed
        .topics()
        .unwrap()
        .get(0)
        .partitions()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p.partition(),
                p.records().unwrap().length(),
                p.high_watermark(),
            )
        })
        .collect()
}

/// A consumer fetch naming many idle partitions of one shard wakes for a
/// record appended to any one of them: the response holds it, where a
/// missed wake would answer empty at the deadline.
#[test]
fn a_fetch_over_many_idle_partitions_wakes_for_a_record_in_any_of_them() {
    const MANY: i32 = 300;
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&dir.path().join("data"), 1);
    let mut client = Client::connect(broker.addr()).unwrap();
    assert_eq!(client.create_topic("idle", MANY, &[]), ErrorCode::None);
    // Round 0 waits on empty partitions, round 1 on partitions one record
    // long, at their end.
    for round in 0..2 {
        let target = if round == 0 { MANY - 1 } else { 7 };
        let partitions: Vec<(i32, i64)> = (0..MANY).map(|p| (p, round)).collect();
        let mut poller = Client::connect(broker.addr()).unwrap();
        let id = poller.send_fetch_many("idle", &partitions, 15_000, 64 << 20);
        let deadline = Instant::now() + Duration::from_secs(10);
        while metric_sum(&broker, "ringlog_fetch_waiters") < i64::from(MANY) {
            assert!(Instant::now() < deadline, "the poll never waited");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            client
                .produce("idle", target, &batch(target as u64, 1, 5, 10), 1)
                .0,
            ErrorCode::None
        );
        let (got, response) = poller.receive().unwrap();
        assert_eq!(got, id);
        let with_records: Vec<(i32, i64)> = fetch_results(&response)
            .into_iter()
            .filter(|&(_, length, _)| length > 0)
            .map(|(partition, _, high_watermark)| (partition, high_watermark))
            .collect();
        assert_eq!(with_records, vec![(target, round + 1)]);
        assert_eq!(decode(&response.payload).len(), 1);
        if round == 0 {
            for partition in (0..MANY).filter(|p| *p != target) {
                assert_eq!(
                    client.produce("idle", partition, &batch(1, 1, 5, 10), 1).0,
                    ErrorCode::None
                );
            }
        }
    }
}

/// A fetch over several partitions reads from disk only what its response
/// has room for, in request order: partitions past the room answer their
/// state without reading (each used to read up to its own bound, and the
/// response then dropped what did not fit).
#[test]
fn a_fetch_reads_from_disk_only_what_its_response_holds() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut broker = Broker::start(&data, 1);
    let mut client = Client::connect(broker.addr()).unwrap();
    assert_eq!(client.create_topic("r", 4, &[]), ErrorCode::None);
    // ~800 KB per partition, uncompressed (even tags).
    for partition in 0..4 {
        for round in 0..8u64 {
            let produced = client.produce("r", partition, &batch(round * 2, 100, 1, 1_000), 1);
            assert_eq!(produced.0, ErrorCode::None);
        }
    }
    // A restart empties the batch cache: what follows is read from disk.
    assert_eq!(broker.stop(), Some(0));
    let broker = Broker::start(&data, 1);
    let mut client = Client::connect(broker.addr()).unwrap();
    let read_before = metric_sum(&broker, "ringlog_log_read_bytes_total");
    let response_bytes_max = 256 << 10;
    let id = client.send_fetch_many(
        "r",
        &[(2, 0), (0, 0), (1, 0), (3, 0)],
        0,
        response_bytes_max,
    );
    let (got, response) = client.receive().unwrap();
    assert_eq!(got, id);
    let returned = fetch_results(&response);
    assert_eq!(returned.len(), 4, "{returned:?}");
    // The first partition asked fills the response; the others answer their
    // high watermark with no records.
    assert_eq!(returned[0].0, 2);
    assert!(
        returned[0].1 > 0 && returned[0].1 <= response_bytes_max as u32,
        "{returned:?}"
    );
    for &(partition, length, high_watermark) in &returned[1..] {
        assert_eq!(
            length, 0,
            "partition {partition} past the room: {returned:?}"
        );
        assert_eq!(
            high_watermark, 800,
            "partition {partition} answers its state"
        );
    }
    let read = metric_sum(&broker, "ringlog_log_read_bytes_total") - read_before;
    assert!(
        read > 0 && read < 2 * i64::from(response_bytes_max),
        "read {read} bytes from disk for a response of at most {response_bytes_max}"
    );
}

/// Responses go out in vectored sends that never wait; a client that reads
/// nothing for a while fills its socket, so sends come back short or find
/// no room and the rest goes out once there is. Every response must still
/// arrive whole, in order and byte for byte the same.
#[test]
fn responses_larger_than_the_socket_arrive_whole_while_the_client_reads_late() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = Broker::start(&dir.path().join("data"), 1);
    let mut client = Client::connect(broker.addr()).unwrap();
    assert_eq!(client.create_topic("v", 1, &[]), ErrorCode::None);
    // About 1 MB in 20 batches of 50 KB (even tags: uncompressed).
    for round in 0..20u64 {
        let produced = client.produce("v", 0, &batch(round * 2, 50, 1, 1_000), 1);
        assert_eq!(produced.0, ErrorCode::None);
    }
    let expected: Vec<(i64, Vec<Vec<u8>>)> = read_all(&mut client, "v", 0);
    assert_eq!(expected.len(), 20);
    // 24 answers of about 1 MB each, well past what loopback sockets buffer.
    let ids: Vec<u32> = (0..24)
        .map(|_| client.send_fetch_many("v", &[(0, 0)], 0, 2 << 20))
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let mut first_payload = None;
    for id in ids {
        let (got, response) = client.receive().unwrap();
        assert_eq!(got, id, "answers in request order");
        let returned = fetch_results(&response);
        assert_eq!(returned.len(), 1);
        assert_eq!(
            decode(&response.payload),
            expected,
            "response {id} decodes whole"
        );
        match &first_payload {
            None => first_payload = Some(response.payload),
            Some(first) => assert!(*first == response.payload, "response {id} the same bytes"),
        }
    }
    assert_eq!(broker.stop(), Some(0));
}

/// A clean shutdown leaves one record in the data dir naming every log it
/// closed (no marker per partition), a restart takes it and rescans
/// nothing, and a crash after that restart rescans: the record was removed
/// before any log opened.
#[test]
fn a_clean_shutdown_is_recorded_once_for_every_log() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut broker = Broker::start(&data, 2);
    let mut client = Client::connect(broker.addr()).unwrap();
    assert_eq!(client.create_topic("c", PARTITIONS, &[]), ErrorCode::None);
    let tags = produce_all(&broker, &mut client, "c", 4);
    assert_eq!(broker.stop(), Some(0));
    let record = std::fs::read_to_string(data.join("clean-shutdown-logs")).unwrap();
    for partition in 0..PARTITIONS {
        let name = format!("c-{partition}");
        assert!(record.lines().any(|l| l == name), "{name} in {record}");
        assert!(!data
            .join("topics")
            .join(&name)
            .join("clean-shutdown")
            .exists());
    }

    let mut broker = Broker::start(&data, 2);
    let mut client = Client::connect(broker.addr()).unwrap();
    check(&mut client, "c", &tags);
    assert!(!data.join("clean-shutdown-logs").exists(), "taken at start");
    assert_eq!(
        metric_sum(&broker, "ringlog_log_rescanned_segments_total"),
        0
    );

    // Closed again with nothing written since the open: no file is
    // rewritten, and the logs are still recorded and trusted.
    assert_eq!(broker.stop(), Some(0));
    assert!(data.join("clean-shutdown-logs").exists());
    let mut broker = Broker::start(&data, 2);
    let mut client = Client::connect(broker.addr()).unwrap();
    check(&mut client, "c", &tags);
    assert_eq!(
        metric_sum(&broker, "ringlog_log_rescanned_segments_total"),
        0
    );

    broker.kill9();
    let broker = Broker::start(&data, 2);
    let mut client = Client::connect(broker.addr()).unwrap();
    check(&mut client, "c", &tags);
    assert!(
        metric_sum(&broker, "ringlog_log_rescanned_segments_total") >= i64::from(PARTITIONS),
        "after a crash every log is rescanned"
    );
}

/// A listener on 127.0.0.1:`port` with SO_REUSEPORT only, as glommio's own
/// bind makes one.
fn bind_reuse_port_only(port: u16) -> std::io::Result<socket2::Socket> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    socket.set_reuse_port(true)?;
    socket.bind(&std::net::SocketAddr::from(([127, 0, 0, 1], port)).into())?;
    Ok(socket)
}

/// The port's last listener set SO_REUSEADDR (as tokio's, Java's and Rust's
/// std do) and closed its connections first, which leaves them in TIME-WAIT
/// for a minute: a listener with SO_REUSEPORT alone cannot bind then, and
/// the broker still starts at once.
#[test]
fn a_broker_starts_on_a_port_whose_last_connections_wait_in_time_wait() {
    let dir = tempfile::tempdir().unwrap();
    let port = support::cluster::free_port_block(1);
    {
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        // The listening side closes first: its end goes to TIME-WAIT.
        drop(accepted);
        std::thread::sleep(Duration::from_millis(100));
        drop(client);
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        bind_reuse_port_only(port).unwrap_err().kind(),
        std::io::ErrorKind::AddrInUse,
        "the TIME-WAIT connection holds the port against SO_REUSEPORT alone"
    );
    let broker = Broker::start_on(&dir.path().join("data"), 1, port);
    let mut client = Client::connect(broker.addr()).unwrap();
    assert_eq!(client.create_topic("t", 1, &[]), ErrorCode::None);
}

/// SO_REUSEPORT would let a second broker started on a port in use join the
/// first's listeners and take some of its connections: it refuses to start
/// instead, and the first serves on.
#[test]
fn a_second_broker_on_a_port_in_use_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&dir.path().join("first"), 1);
    assert!(
        bind_reuse_port_only(broker.port).is_ok(),
        "the kernel alone would let it in"
    );
    let log = dir.path().join("second.log");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_ringlog-broker"))
        .args(["--node-id", "2", "--cores", "1", "--listen"])
        .arg(format!("127.0.0.1:{}", broker.port))
        .arg("--data-dir")
        .arg(dir.path().join("second"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .status()
        .unwrap();
    assert!(!status.success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(&format!(
            "another process listens on 127.0.0.1:{} already",
            broker.port
        )),
        "{text}"
    );
    let mut client = Client::connect(broker.addr()).unwrap();
    assert_eq!(client.create_topic("t", 1, &[]), ErrorCode::None);
}

/// Shards are pinned to the CPUs the process was given (`taskset`, a
/// container's cpuset), never to CPUs 0.. it was kept off: a broker given
/// only the machine's last CPU runs every thread there.
#[test]
fn shards_run_on_the_cpus_the_process_was_given() {
    let allowed = core_affinity::get_core_ids().unwrap_or_default();
    let Some(last) = allowed.iter().map(|core| core.id).max() else {
        panic!("this test process's affinity mask is unreadable");
    };
    if allowed.len() < 2 {
        eprintln!("one CPU only: pinning to it is all a broker can do");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start_on_cpus(&dir.path().join("data"), 1, &last.to_string());
    let pid = broker.child.as_ref().unwrap().id();
    let mut shard_threads = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        let name = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        let status = std::fs::read_to_string(task.join("status")).unwrap_or_default();
        let Some(cpus) = status
            .lines()
            .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
        else {
            continue; // the thread ended meanwhile
        };
        shard_threads += usize::from(name.starts_with("shard-"));
        assert_eq!(cpus.trim(), last.to_string(), "thread {}", name.trim());
    }
    assert!(shard_threads >= 1);
}

/// Retention takes a segment's names at once and leaves its blocks to the
/// shard's releaser, which frees them in paced steps: the metrics account
/// for every byte of the removed files, and nothing stays pending.
#[test]
fn retention_leaves_a_removed_segments_space_to_the_releaser() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let broker = Broker::start(&data, 1);
    let mut client = Client::connect(broker.addr()).unwrap();
    // Larger than a release step: smaller files are freed with their unlink.
    let segment_bytes = 5 << 20;
    assert_eq!(
        client.create_topic(
            "r",
            1,
            &[
                ("segment.bytes", &segment_bytes.to_string()),
                ("retention.bytes", &segment_bytes.to_string()),
            ]
        ),
        ErrorCode::None
    );
    for tag in 0..48 {
        // Even tags: uncompressed, about 512 KB each.
        let (code, _) = client.produce("r", 0, &batch(tag * 2, 32, 1_000, 16_000), 1);
        assert_eq!(code, ErrorCode::None);
    }
    // Retention runs every few seconds; the releaser right after it.
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric_sum(&broker, "ringlog_log_released_files_total") < 2
        || metric_sum(&broker, "ringlog_log_release_pending_bytes") > 0
    {
        assert!(Instant::now() < deadline, "no segment's space was released");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Every appended byte is either in a file still there or released
    // (the active file may also hold alignment padding).
    let released = metric_sum(&broker, "ringlog_log_released_bytes_total");
    let appended = metric_sum(&broker, "ringlog_log_appended_bytes_total");
    let logs: Vec<u64> = std::fs::read_dir(data.join("topics").join("r-0"))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .map(|e| e.metadata().unwrap().len())
        .collect();
    let left: u64 = logs.iter().sum();
    assert!(
        released <= appended && released + left as i64 >= appended,
        "{appended} appended, {released} released, {left} in {} files left",
        logs.len()
    );
    assert!(logs.len() <= 3, "{} segment files left", logs.len());
    assert_eq!(metric_sum(&broker, "ringlog_log_release_failures_total"), 0);
    let (code, _, log_start, _) = client.fetch("r", 0, 0, 1 << 20, 0);
    assert!(
        code == ErrorCode::OffsetOutOfRange || log_start > 0,
        "{code:?}, log start {log_start}"
    );
}
