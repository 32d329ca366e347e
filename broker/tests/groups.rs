//! The group coordinator in a real broker process, over the wire: finding
//! the coordinator creates `__consumer_offsets`; a member joins and gets
//! every partition; a commit is answered once written and survives a clean
//! restart and a kill -9 (the coordinator loads it back from the log); the
//! internal topic cannot be deleted; bad group ids get their error.

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use protocol::flatbuffers::FlatBufferBuilder;
use protocol::{wire, ApiKey, ErrorCode};
use support::cluster::{free_port_block, Broker, Client};

const CONFIG: &str = "[groups]\noffsets_topic_partitions = 4\n";

fn find_coordinator(addr: SocketAddr, group: &str) -> Result<SocketAddr, ErrorCode> {
    let mut client = Client::connect(addr).unwrap();
    let mut fbb = FlatBufferBuilder::new();
    let id = fbb.create_string(group);
    let root = wire::FindCoordinatorRequest::create(
        &mut fbb,
        &wire::FindCoordinatorRequestArgs {
            group_id: Some(id),
            key_type: 0,
        },
    );
    fbb.finish_minimal(root);
    let response = client
        .call(ApiKey::FindCoordinator, fbb.finished_data(), &[])
        .unwrap();
    let r = protocol::flatbuffers::root::<wire::FindCoordinatorResponse>(&response.body).unwrap();
    match ErrorCode::from_u16(r.error_code()) {
        ErrorCode::None => Ok(format!("{}:{}", r.host().unwrap(), r.port())
            .parse()
            .unwrap()),
        code => Err(code),
    }
}

/// Retries retriable answers (the topic being created, a coordinator loading).
fn coordinator(addr: SocketAddr, group: &str) -> SocketAddr {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match find_coordinator(addr, group) {
            Ok(a) => return a,
            Err(code) if code.is_retriable() && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(code) => panic!("find coordinator: {code}"),
        }
    }
}

struct Joined {
    epoch: i32,
    assignment: Vec<(String, i32)>,
}

fn heartbeat(
    coordinator: SocketAddr,
    group: &str,
    member: &str,
    epoch: i32,
    topics: &[&str],
) -> Result<Joined, ErrorCode> {
    let mut client = Client::connect(coordinator).unwrap();
    let mut fbb = FlatBufferBuilder::new();
    let group_id = fbb.create_string(group);
    let member_id = fbb.create_string(member);
    let client_id = fbb.create_string("test");
    let names: Vec<_> = topics.iter().map(|t| fbb.create_string(t)).collect();
    let subscribed = fbb.create_vector(&names);
    let owned = fbb.create_vector::<protocol::flatbuffers::WIPOffset<wire::TopicPartitions>>(&[]);
    let root = wire::GroupHeartbeatRequest::create(
        &mut fbb,
        &wire::GroupHeartbeatRequestArgs {
            group_id: Some(group_id),
            member_id: Some(member_id),
            member_epoch: epoch,
            instance_id: None,
            client_id: Some(client_id),
            session_timeout_ms: 30_000,
            rebalance_timeout_ms: 30_000,
            subscribed_topics: Some(subscribed),
            assignor: None,
            owned: Some(owned),
        },
    );
    fbb.finish_minimal(root);
    let response = client
        .call(ApiKey::GroupHeartbeat, fbb.finished_data(), &[])
        .unwrap();
    let r = protocol::flatbuffers::root::<wire::GroupHeartbeatResponse>(&response.body).unwrap();
    match ErrorCode::from_u16(r.error_code()) {
        ErrorCode::None => Ok(Joined {
            epoch: r.member_epoch(),
            assignment: r
                .assignment()
                .iter()
                .flatten()
                .flat_map(|t| {
                    let topic = t.topic().unwrap().to_string();
                    t.partitions()
                        .unwrap()
                        .iter()
                        .map(move |p| (topic.clone(), p))
                        .collect::<Vec<_>>()
                })
                .collect(),
        }),
        code => Err(code),
    }
}

fn commit(
    coordinator: SocketAddr,
    group: &str,
    member: &str,
    epoch: i32,
    topic: &str,
    partition: i32,
    offset: i64,
) -> ErrorCode {
    let mut client = Client::connect(coordinator).unwrap();
    let mut fbb = FlatBufferBuilder::new();
    let metadata = fbb.create_string("m");
    let p = wire::OffsetCommitPartition::create(
        &mut fbb,
        &wire::OffsetCommitPartitionArgs {
            partition,
            offset,
            metadata: Some(metadata),
        },
    );
    let partitions = fbb.create_vector(&[p]);
    let name = fbb.create_string(topic);
    let t = wire::OffsetCommitTopic::create(
        &mut fbb,
        &wire::OffsetCommitTopicArgs {
            name: Some(name),
            partitions: Some(partitions),
        },
    );
    let topics = fbb.create_vector(&[t]);
    let group_id = fbb.create_string(group);
    let member_id = fbb.create_string(member);
    let root = wire::OffsetCommitRequest::create(
        &mut fbb,
        &wire::OffsetCommitRequestArgs {
            group_id: Some(group_id),
            member_id: Some(member_id),
            member_epoch: epoch,
            topics: Some(topics),
        },
    );
    fbb.finish_minimal(root);
    let response = client
        .call(ApiKey::OffsetCommit, fbb.finished_data(), &[])
        .unwrap();
    let r = protocol::flatbuffers::root::<wire::OffsetCommitResponse>(&response.body).unwrap();
    ErrorCode::from_u16(r.error_code())
}

fn committed(coordinator: SocketAddr, group: &str) -> Result<Vec<(String, i32, i64)>, ErrorCode> {
    let mut client = Client::connect(coordinator).unwrap();
    let mut fbb = FlatBufferBuilder::new();
    let group_id = fbb.create_string(group);
    let root = wire::OffsetFetchRequest::create(
        &mut fbb,
        &wire::OffsetFetchRequestArgs {
            group_id: Some(group_id),
            topics: None,
        },
    );
    fbb.finish_minimal(root);
    let response = client
        .call(ApiKey::OffsetFetch, fbb.finished_data(), &[])
        .unwrap();
    let r = protocol::flatbuffers::root::<wire::OffsetFetchResponse>(&response.body).unwrap();
    match ErrorCode::from_u16(r.error_code()) {
        ErrorCode::None => Ok(r
            .topics()
            .iter()
            .flatten()
            .flat_map(|t| {
                let name = t.name().unwrap().to_string();
                t.partitions()
                    .unwrap()
                    .iter()
                    .map(move |p| (name.clone(), p.partition(), p.offset()))
                    .collect::<Vec<_>>()
            })
            .collect()),
        code => Err(code),
    }
}

/// Committed offsets once the coordinator answers (it may be loading).
fn committed_eventually(addr: SocketAddr, group: &str) -> Vec<(String, i32, i64)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match committed(coordinator(addr, group), group) {
            Ok(v) => return v,
            Err(code) if code.is_retriable() && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(code) => panic!("offset fetch: {code}"),
        }
    }
}

#[test]
fn commits_survive_restart_and_kill9_and_the_offsets_topic_is_protected() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = dir.path().join("broker.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let config = config.to_str().unwrap().to_string();
    let port = free_port_block(2);
    let mut broker = Broker::start_with(&data, 2, port, &["--config", &config]);
    let mut admin = Client::connect(broker.addr()).unwrap();
    assert_eq!(admin.create_topic("t", 6, &[]), ErrorCode::None);

    assert_eq!(
        find_coordinator(broker.addr(), ""),
        Err(ErrorCode::InvalidGroupId)
    );
    let at = coordinator(broker.addr(), "g");
    let joined = loop {
        match heartbeat(at, "g", "member-1", 0, &["t"]) {
            Ok(j) => break j,
            Err(ErrorCode::CoordinatorLoadInProgress) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(code) => panic!("join: {code}"),
        }
    };
    assert!(joined.epoch > 0);
    assert_eq!(
        joined.assignment.len(),
        6,
        "a lone member gets every partition"
    );
    // A stale epoch is fenced; a stranger is unknown.
    assert_eq!(
        heartbeat(at, "g", "member-1", joined.epoch + 7, &["t"]).err(),
        Some(ErrorCode::FencedMemberEpoch)
    );
    assert_eq!(
        commit(at, "g", "stranger", 1, "t", 0, 1),
        ErrorCode::UnknownMemberId
    );
    assert_eq!(
        commit(at, "g", "member-1", joined.epoch, "t", 0, 42),
        ErrorCode::None
    );
    assert_eq!(
        commit(at, "g", "member-1", joined.epoch, "t", 5, 7),
        ErrorCode::None
    );
    assert_eq!(
        commit(at, "g", "member-1", joined.epoch, "nope", 0, 1),
        ErrorCode::UnknownTopicOrPartition
    );
    let expected = vec![("t".to_string(), 0, 42), ("t".to_string(), 5, 7)];
    assert_eq!(committed(at, "g").unwrap(), expected);

    // The internal topic is the brokers' own.
    let mut fbb = FlatBufferBuilder::new();
    let name = fbb.create_string("__consumer_offsets");
    let names = fbb.create_vector(&[name]);
    let root = wire::DeleteTopicsRequest::create(
        &mut fbb,
        &wire::DeleteTopicsRequestArgs { names: Some(names) },
    );
    fbb.finish_minimal(root);
    let response = admin
        .call(ApiKey::DeleteTopics, fbb.finished_data(), &[])
        .unwrap();
    let r = protocol::flatbuffers::root::<wire::DeleteTopicsResponse>(&response.body).unwrap();
    assert_eq!(
        ErrorCode::from_u16(r.results().unwrap().get(0).error_code()),
        ErrorCode::PolicyViolation
    );
    // Nor can clients write group records into it.
    let forged = support::batch(1, 1, 0, 8);
    assert_eq!(
        admin.produce("__consumer_offsets", 0, &forged, 1).0,
        ErrorCode::PolicyViolation
    );
    drop(admin);

    assert_eq!(broker.stop(), Some(0));
    let mut broker = Broker::start_with(&data, 2, port, &["--config", &config]);
    assert_eq!(
        committed_eventually(broker.addr(), "g"),
        expected,
        "after a clean restart"
    );
    // The member's session restarted with the load: it is still known.
    let at = coordinator(broker.addr(), "g");
    assert_eq!(
        commit(at, "g", "member-1", joined.epoch, "t", 0, 43),
        ErrorCode::None
    );

    broker.kill9();
    let broker = Broker::start_with(&data, 2, port, &["--config", &config]);
    let after = committed_eventually(broker.addr(), "g");
    assert_eq!(
        after,
        vec![("t".to_string(), 0, 43), ("t".to_string(), 5, 7)],
        "after kill -9"
    );
}
