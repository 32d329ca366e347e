//! Bad input never takes the broker down or loses data: each malformed frame,
//! oversized request, unknown API, corrupt batch, unknown topic, out-of-range
//! offset or silent client gets an error code or a closed connection, and a
//! well-behaved client is served normally afterwards.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use protocol::flatbuffers::FlatBufferBuilder;
use protocol::frame::{encode_request, RequestHeader};
use protocol::{wire, ApiKey, ErrorCode};
use support::batch;
use support::cluster::{free_port_block, Broker, Client};

/// Asserts the broker still answers a normal produce and fetch.
fn still_serving(broker: &mut Broker) {
    assert!(broker.is_running(), "broker died; log:\n{}", broker.log());
    serves(&mut Client::connect(broker.addr()).unwrap());
}

/// Asserts a normal produce and fetch are answered on `client`'s connection.
fn serves(client: &mut Client) {
    let (code, base) = client.produce("t", 0, &batch(7, 1, 1, 8), -1);
    assert_eq!(code, ErrorCode::None);
    let (code, hw, _, records) = client.fetch("t", 0, base, 1 << 20, 0);
    assert_eq!(code, ErrorCode::None);
    assert!(!records.is_empty() && hw == base + 1);
}

/// Reads until the peer closes; true if it did within the deadline.
fn closed_by_peer(stream: &mut TcpStream) -> bool {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

fn start(dir: &std::path::Path, extra: &[&str]) -> Broker {
    let broker = Broker::start_with(&dir.join("data"), 1, free_port_block(1), extra);
    let mut client = Client::connect(broker.addr()).unwrap();
    assert_eq!(client.create_topic("t", 1, &[]), ErrorCode::None);
    broker
}

fn raw_frame(api_key: u16, api_version: u16, body: &[u8], payload: &[&[u8]]) -> Vec<u8> {
    let mut frame = Vec::new();
    encode_request(
        &mut frame,
        &RequestHeader {
            api_key,
            api_version,
            correlation_id: 9,
            client_id: "bad".into(),
        },
        body,
        payload,
    );
    frame
}

/// Garbage, an oversized length prefix, a truncated frame, a body that is not
/// a flatbuffer and a records range outside the payload each close only their
/// own connection.
#[test]
fn malformed_frames_close_only_their_connection() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = start(dir.path(), &[]);

    let mut garbage = TcpStream::connect(broker.addr()).unwrap();
    garbage.write_all(&[0x7f; 64]).unwrap();
    assert!(
        closed_by_peer(&mut garbage),
        "garbage length prefix over the bound"
    );
    still_serving(&mut broker);

    let mut oversized = TcpStream::connect(broker.addr()).unwrap();
    oversized.write_all(&u32::MAX.to_be_bytes()).unwrap();
    assert!(
        closed_by_peer(&mut oversized),
        "frame_size_bytes_max enforced before allocating"
    );
    still_serving(&mut broker);

    let mut truncated = TcpStream::connect(broker.addr()).unwrap();
    truncated.write_all(&100u32.to_be_bytes()).unwrap();
    truncated.write_all(&[0u8; 10]).unwrap();
    drop(truncated);
    still_serving(&mut broker);

    let mut not_flatbuffer = TcpStream::connect(broker.addr()).unwrap();
    not_flatbuffer
        .write_all(&raw_frame(ApiKey::Produce as u16, 0, &[0xff; 40], &[]))
        .unwrap();
    assert!(closed_by_peer(&mut not_flatbuffer), "unverifiable body");
    still_serving(&mut broker);

    let mut bad_range = TcpStream::connect(broker.addr()).unwrap();
    let body = Client::produce_body("t", 0, 10_000, -1);
    bad_range
        .write_all(&raw_frame(ApiKey::Produce as u16, 0, &body, &[&[1, 2, 3]]))
        .unwrap();
    assert!(
        closed_by_peer(&mut bad_range),
        "records range outside the payload"
    );
    still_serving(&mut broker);

    let mut bad_client_id = TcpStream::connect(broker.addr()).unwrap();
    let mut frame = raw_frame(0, 0, &[], &[]);
    frame[12..14].copy_from_slice(&u16::MAX.to_be_bytes());
    bad_client_id.write_all(&frame).unwrap();
    assert!(
        closed_by_peer(&mut bad_client_id),
        "client id over its bound"
    );
    still_serving(&mut broker);
    assert!(broker.log().contains("bad frame"), "logged");
}

/// Unknown APIs and versions get UNSUPPORTED_VERSION with the supported list.
#[test]
fn unknown_api_and_version_get_an_error_code() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = start(dir.path(), &[]);
    let mut client = Client::connect(broker.addr()).unwrap();
    for (key, version) in [(999u16, 0u16), (ApiKey::Fetch as u16, 7)] {
        client
            .stream
            .write_all(&raw_frame(key, version, &[], &[]))
            .unwrap();
        let (id, response) = client.receive().unwrap();
        assert_eq!(id, 9);
        let parsed =
            protocol::flatbuffers::root::<wire::ApiVersionsResponse>(&response.body).unwrap();
        assert_eq!(
            ErrorCode::from_u16(parsed.error_code()),
            ErrorCode::UnsupportedVersion
        );
        assert_eq!(parsed.apis().unwrap().len(), ApiKey::ALL.len());
    }
    still_serving(&mut broker);
}

/// A batch with a bad CRC is refused with CORRUPT_MESSAGE and nothing is appended;
/// unknown topics and partitions and out-of-range offsets get their codes.
#[test]
fn bad_batches_topics_and_offsets_get_error_codes() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = start(dir.path(), &[]);
    let mut client = Client::connect(broker.addr()).unwrap();
    assert_eq!(
        client.produce("t", 0, &batch(1, 2, 1, 8), -1),
        (ErrorCode::None, 0)
    );
    let mut corrupt = batch(2, 2, 1, 8);
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xff;
    assert_eq!(
        client.produce("t", 0, &corrupt, -1).0,
        ErrorCode::CorruptMessage
    );
    assert_eq!(
        client.produce("t", 0, &corrupt[..30], -1).0,
        ErrorCode::CorruptMessage,
        "truncated batch"
    );
    assert_eq!(
        client.list_offset("t", 0, -1),
        (ErrorCode::None, 2),
        "nothing appended"
    );
    assert_eq!(
        client.produce("nope", 0, &batch(3, 1, 1, 8), -1).0,
        ErrorCode::UnknownTopicOrPartition
    );
    assert_eq!(
        client.produce("t", 99, &batch(3, 1, 1, 8), -1).0,
        ErrorCode::UnknownTopicOrPartition
    );
    assert_eq!(
        client.fetch("nope", 0, 0, 100, 0).0,
        ErrorCode::UnknownTopicOrPartition
    );
    let (code, hw, log_start, records) = client.fetch("t", 0, 50, 100, 0);
    assert_eq!(
        (code, hw, log_start, records.len()),
        (ErrorCode::OffsetOutOfRange, 2, 0, 0),
        "the valid range comes back"
    );
    assert_eq!(
        client.fetch("t", 0, -5, 100, 0).0,
        ErrorCode::OffsetOutOfRange
    );
    assert_eq!(
        client.create_topic("bad/name", 1, &[]),
        ErrorCode::InvalidTopicName
    );
    assert_eq!(
        client.create_topic("x", 0, &[]),
        ErrorCode::InvalidPartitions
    );
    assert_eq!(
        client.create_topic("y", 1, &[("retention.ms", "soon")]),
        ErrorCode::InvalidConfig
    );
    still_serving(&mut broker);
}

/// A client that connects and sends nothing does not block others and is
/// closed after the idle bound; connections beyond the bound are refused.
#[test]
fn silent_clients_and_connection_bound() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("broker.toml");
    std::fs::write(
        &config,
        "connection_idle_ms_max = 500\nconnections_per_shard_max = 4\n",
    )
    .unwrap();
    let mut broker = start(dir.path(), &["--config", config.to_str().unwrap()]);
    let mut silent = TcpStream::connect(broker.addr()).unwrap();
    still_serving(&mut broker);
    let started = Instant::now();
    assert!(closed_by_peer(&mut silent), "idle connection closed");
    assert!(started.elapsed() < Duration::from_secs(5));

    let held: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(broker.addr()).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let mut extra = TcpStream::connect(broker.addr()).unwrap();
    assert!(closed_by_peer(&mut extra), "fifth connection refused");
    drop(held);
    // Each shard frees its slots once it has seen the held connections
    // close; a connection that got one is served (a new connection could
    // land on a shard that has not seen them close yet).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut client = Client::connect(broker.addr()).unwrap();
        if client.api_versions().is_ok() {
            serves(&mut client);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "slots free again after the held connections close"
        );
    }
    assert!(broker.is_running(), "broker died; log:\n{}", broker.log());
}

/// Many requests in flight on one connection are answered in request order.
#[test]
fn pipelined_requests_are_answered_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = start(dir.path(), &[]);
    let mut client = Client::connect(broker.addr()).unwrap();
    let mut fbb = FlatBufferBuilder::new();
    let root = wire::ApiVersionsRequest::create(&mut fbb, &wire::ApiVersionsRequestArgs {});
    fbb.finish_minimal(root);
    let body = fbb.finished_data().to_vec();
    let produce = batch(4, 1, 1, 8);
    let produce_body = Client::produce_body("t", 0, produce.len(), 1);
    let mut ids = Vec::new();
    for i in 0..300 {
        let id = if i % 3 == 0 {
            client
                .send(ApiKey::Produce, &produce_body, &[&produce])
                .unwrap()
        } else {
            client.send(ApiKey::ApiVersions, &body, &[]).unwrap()
        };
        ids.push(id);
    }
    for id in ids {
        assert_eq!(client.receive().unwrap().0, id);
    }
    assert_eq!(client.list_offset("t", 0, -1), (ErrorCode::None, 100));
    still_serving(&mut broker);
}

/// Frames cut anywhere by the network (inside the length prefix, a byte at a
/// time, many in one segment, one larger than a receive chunk) arrive whole
/// and in order, and what they carried reads back record for record.
#[test]
fn frames_split_anywhere_across_receives_arrive_whole() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = start(dir.path(), &[]);
    // Small (copied out of the receive buffer), mid-sized (shared with it)
    // and larger than one receive chunk; five sizes against two compressions
    // (by the tag's parity) give each size both ways.
    let value_sizes = [8usize, 3_000, 9_000, 700_000, 100];
    let mut stream = Vec::new();
    let mut sent = Vec::new();
    for (i, &value_bytes) in value_sizes.iter().cycle().take(25).enumerate() {
        let tag = i as u64;
        let records = batch(tag, 1, 1_000 + tag as i64, value_bytes);
        let body = Client::produce_body("t", 0, records.len(), 1);
        stream.extend_from_slice(&raw_frame(ApiKey::Produce as u16, 0, &body, &[&records]));
        sent.push(batch_values(tag, value_bytes));
    }
    let mut client = Client::connect(broker.addr()).unwrap();
    client.stream.set_nodelay(true).unwrap();
    // Piece sizes that fall on every kind of boundary; a pause after some
    // lets the broker's receive come back short.
    let pieces = [
        1usize, 2, 1, 3, 5_000, 1, 7, 70_000, 333, 300_000, 4, 1_000_000,
    ];
    let mut at = 0;
    for (n, size) in pieces.iter().cycle().enumerate() {
        if at == stream.len() {
            break;
        }
        let end = (at + size).min(stream.len());
        client.stream.write_all(&stream[at..end]).unwrap();
        at = end;
        if n % 3 == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    for expected_base in 0..sent.len() as i64 {
        let (id, response) = client.receive().unwrap();
        assert_eq!(id, 9, "raw frames carry correlation id 9");
        let parsed = protocol::flatbuffers::root::<wire::ProduceResponse>(&response.body).unwrap();
        let result = parsed.topics().unwrap().get(0).partitions().unwrap().get(0);
        assert_eq!(ErrorCode::from_u16(result.error_code()), ErrorCode::None);
        assert_eq!(result.base_offset(), expected_base, "answered in order");
    }
    let mut next = 0;
    let mut read = Vec::new();
    while next < sent.len() as i64 {
        let (code, _, _, records) = client.fetch("t", 0, next, 4 << 20, 0);
        assert_eq!(code, ErrorCode::None);
        for (base, values) in support::decode(&records) {
            assert_eq!(base, next);
            next += values.len() as i64;
            read.extend(values);
        }
    }
    assert_eq!(read, sent, "every value read back as sent");
    still_serving(&mut broker);
}

/// The one value `support::batch(tag, 1, _, value_bytes)` carries.
fn batch_values(tag: u64, value_bytes: usize) -> Vec<u8> {
    let mut value = format!("{tag}:0:").into_bytes();
    value.resize(value_bytes.max(value.len()), b'x');
    value
}

// The disk holding the log file fills up: every write to standard error fails
// with ENOSPC. The broker keeps serving; it only loses its log lines.
#[test]
fn a_full_log_disk_does_not_stop_the_broker() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = Broker::start_logging_to(
        &dir.path().join("data"),
        1,
        free_port_block(1),
        &[],
        std::path::Path::new("/dev/full"),
    );
    let mut client = Client::connect(broker.addr()).unwrap();
    assert_eq!(client.create_topic("t", 1, &[]), ErrorCode::None);
    // Errors are logged too: ask for an unknown topic.
    let (code, _) = client.produce("missing", 0, &batch(1, 1, 1, 8), -1);
    assert_eq!(code, ErrorCode::UnknownTopicOrPartition);
    still_serving(&mut broker);
}

/// The broker is stopped while its data directory refuses new files (made
/// immutable, as a full or failing disk would refuse them) and its log
/// disk is full: the record of logs closed cleanly cannot be written, so
/// the exit is a failure (the next start rescans), but an orderly one with
/// its own exit code. Saying why must not crash the process because the
/// log cannot take the message either (it did: an abort and a core dump
/// when a disk filled up during a benchmark).
#[test]
fn a_stop_that_cannot_record_its_clean_shutdown_exits_with_an_error_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = free_port_block(1);
    let mut broker =
        Broker::start_logging_to(&data, 1, port, &[], std::path::Path::new("/dev/full"));
    let mut client = Client::connect(broker.addr()).unwrap();
    assert_eq!(client.create_topic("t", 1, &[]), ErrorCode::None);
    let (code, _) = client.produce("t", 0, &batch(2, 1, 1_000, 4 << 10), -1);
    assert_eq!(code, ErrorCode::None);
    let immutable = support::Immutable::new(&data);
    let code = broker.stop();
    assert!(immutable.release());
    assert_eq!(code, Some(1), "an exit code, not a signal");
}

/// A tmpfs mounted for one test and unmounted when dropped: a real disk that
/// fills up, with the kernel's own ENOSPC.
struct SmallDisk {
    path: std::path::PathBuf,
}

impl SmallDisk {
    fn mount(path: &std::path::Path, size: &str) -> SmallDisk {
        std::fs::create_dir_all(path).unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .status()
            .expect("mount runs");
        assert!(
            status.success(),
            "mounting a tmpfs needs root, as the chaos tests do"
        );
        SmallDisk {
            path: path.to_path_buf(),
        }
    }

    fn grow(&self, size: &str) {
        let status = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.path)
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.path)
            .status();
    }
}

/// A one-shard broker whose data directory has a small tmpfs mounted at
/// `subdir`, logging to a file: its temporary directory, data directory,
/// disk, log file, port and the broker.
fn on_small_disk(
    subdir: &str,
    size: &str,
) -> (tempfile::TempDir, PathBuf, SmallDisk, PathBuf, u16, Broker) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let disk = SmallDisk::mount(&data.join(subdir), size);
    let log_path = dir.path().join("broker.log");
    let port = free_port_block(1);
    let broker = Broker::start_logging_to(&data, 1, port, &[], &log_path);
    (dir, data, disk, log_path, port, broker)
}

/// The disk holding the partition logs fills up. Produce is answered
/// STORAGE_ERROR and the broker log names the cause; fetches of what was
/// acknowledged are still served; the failing log is warned about once, not
/// on every retry of its write-out; once the disk has room the partition
/// takes writes again; and after a restart every acknowledged record reads
/// back from disk and `verify-log` passes. A refused batch may still be
/// written once there is room (as after a timeout, the producer cannot
/// know): it is never acknowledged, and never stored twice.
#[test]
fn a_full_data_disk_answers_storage_errors_and_recovers_when_it_has_room() {
    let (_dir, data, disk, log_path, port, mut broker) = on_small_disk("topics", "16m");
    let mut client = Client::connect(broker.addr()).unwrap();
    assert_eq!(client.create_topic("t", 1, &[]), ErrorCode::None);
    // Even tags: uncompressed 64 KiB batches, so 16 MiB fill in ~250.
    let mut acked = Vec::new();
    let mut refused = None;
    for tag in (0..2_000u64).step_by(2) {
        let (code, base) = client.produce("t", 0, &batch(tag, 1, 1_000, 64 << 10), -1);
        if code != ErrorCode::None {
            refused = Some((code, tag));
            break;
        }
        acked.push((base, tag));
    }
    let (code, refused_tag) = refused.expect("a 16 MiB disk fills");
    assert_eq!(code, ErrorCode::StorageError);
    assert!(acked.len() > 100, "{} acknowledged", acked.len());

    // Two seconds full: the maintenance retries back off and warn once.
    std::thread::sleep(Duration::from_secs(2));
    let log = broker.log();
    assert!(log.contains("No space left on device"), "{log}");
    let warnings = log.matches("log maintenance failed").count();
    assert!(
        (1..=2).contains(&warnings),
        "{warnings} maintenance warnings in two seconds"
    );
    assert!(broker.is_running(), "broker died; log:\n{log}");
    let (code, _, _, records) = client.fetch("t", 0, 0, 1 << 20, 0);
    assert_eq!(code, ErrorCode::None);
    assert_eq!(
        support::decode(&records)[0].0,
        0,
        "acknowledged data served"
    );

    disk.grow("64m");
    let deadline = Instant::now() + Duration::from_secs(10);
    let after = loop {
        let (code, base) = client.produce("t", 0, &batch(100_000, 1, 1_000, 8), -1);
        if code == ErrorCode::None {
            break (base, 100_000u64);
        }
        assert!(
            Instant::now() < deadline,
            "still refused with room: {code:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    acked.push(after);
    assert!(
        broker.log().contains("log maintenance works again")
            || broker.log().matches("log maintenance failed").count() <= 2
    );

    broker.stop();
    let mut broker = Broker::start_logging_to(&data, 1, port, &[], &log_path);
    let mut client = Client::connect(broker.addr()).unwrap();
    let mut read = Vec::new();
    let mut next = 0;
    let end = after.0 + 1;
    while next < end {
        let (code, _, _, records) = client.fetch("t", 0, next, 4 << 20, 0);
        assert_eq!(code, ErrorCode::None);
        for (base, values) in support::decode(&records) {
            assert_eq!(base, next, "offsets follow each other");
            next += values.len() as i64;
            for value in values {
                let text = String::from_utf8_lossy(&value[..value.len().min(24)]).into_owned();
                let tag: u64 = text.split(':').next().unwrap().parse().unwrap();
                read.push((base, tag));
            }
        }
    }
    let acked_read: Vec<(i64, u64)> = read
        .iter()
        .copied()
        .filter(|&(_, tag)| tag != refused_tag)
        .collect();
    assert_eq!(
        acked_read, acked,
        "every acknowledged record, where it was acknowledged"
    );
    assert!(read.iter().filter(|&&(_, tag)| tag == refused_tag).count() <= 1);
    broker.stop();
    let verify = std::process::Command::new(env!("CARGO_BIN_EXE_ringlog-broker"))
        .arg("verify-log")
        .arg(data.join("topics").join("t-0"))
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
    drop(disk);
}

/// Writes `path` until the file system refuses: what is left of its disk.
fn fill_disk(path: &std::path::Path) {
    let mut file = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 4096];
    loop {
        match file.write_all(&chunk).and_then(|()| file.sync_data()) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::StorageFull => return,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
}

/// The disk holding the embedded controller's Raft log fills up. A metadata
/// change (creating a topic) is answered with an error once the broker has
/// given up on the controller (its forwarding tries several times), and the
/// broker stays up; the controller warns about the full disk instead of
/// stopping its Raft node (which openraft does on any storage error, for
/// good); once the disk has room the stalled change lands and new ones are
/// made again. A broker stopped while a metadata write waits for room stops
/// at once, and after a restart every topic is there.
#[test]
fn a_full_controller_disk_stalls_metadata_changes_until_it_has_room() {
    let (_dir, data, disk, log_path, port, mut broker) = on_small_disk("controller", "2m");
    let mut client = Client::connect(broker.addr()).unwrap();
    // A refused change is answered after the broker's forwarding retries.
    client
        .stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    assert_eq!(client.create_topic("before", 1, &[]), ErrorCode::None);

    let filler = data.join("controller").join("filler");
    fill_disk(&filler);
    // The log file's last page may still have room for a few records.
    let stalled = (0..200)
        .map(|i| format!("during-{i}"))
        .find(|topic| client.create_topic(topic, 1, &[]) != ErrorCode::None)
        .expect("a full disk refuses metadata changes");
    std::thread::sleep(Duration::from_secs(1));
    assert!(broker.is_running(), "broker died; log:\n{}", broker.log());
    let log = broker.log();
    assert!(log.contains("controller storage is full"), "{log}");
    assert!(log.contains("No space left on device"), "{log}");

    std::fs::remove_file(&filler).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match client.create_topic("after", 1, &[]) {
            ErrorCode::None => break,
            code => assert!(
                Instant::now() < deadline,
                "metadata changes still refused with room: {code:?}; log:\n{}",
                broker.log()
            ),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // The change that waited for room was made too: a creation that timed
    // out may still happen, as with any request whose answer was lost.
    assert_eq!(
        client.create_topic(&stalled, 1, &[]),
        ErrorCode::TopicAlreadyExists
    );
    assert!(broker.log().contains("controller storage has room again"));

    // Full again, a change waiting for room: SIGTERM stops the broker
    // (`stop` fails the test after 20 s).
    let warned = broker.log().matches("controller storage is full").count();
    fill_disk(&filler);
    let addr = broker.addr();
    let waiting = std::thread::spawn(move || {
        let mut client = Client::connect(addr).unwrap();
        for i in 0..200 {
            if client.create_topic(&format!("late-{i}"), 1, &[]) != ErrorCode::None {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while broker.log().matches("controller storage is full").count() <= warned {
        assert!(Instant::now() < deadline, "no change waits for room");
        std::thread::sleep(Duration::from_millis(50));
    }
    let stopping = Instant::now();
    broker.stop();
    assert!(stopping.elapsed() < Duration::from_secs(15));
    let _ = waiting.join();
    std::fs::remove_file(&filler).unwrap();

    let broker = Broker::start_logging_to(&data, 1, port, &[], &log_path);
    let mut client = Client::connect(broker.addr()).unwrap();
    for topic in ["before", stalled.as_str(), "after"] {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (code, _) = client.produce(topic, 0, &batch(1, 1, 1_000, 8), -1);
            if code == ErrorCode::None {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{topic} after a restart: {code:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    drop(broker);
    drop(disk);
}
