//! A broker started with `--controller` registers with a real controller,
//! heartbeats to stay alive, is fenced by the controller after kill -9, and is
//! registered again (a new epoch, alive) when it restarts.

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use protocol::api::ControllerApiKey;
use protocol::flatbuffers::{self, FlatBufferBuilder};
use protocol::frame::{decode_response, encode_request, RequestHeader};
use protocol::wire;
use support::cluster::{free_port_block, Broker};

struct Controller(Child);

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn controller_binary() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "-p", "controller", "--bin", "ringlog-controller"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .unwrap();
    assert!(status.success());
    std::env::current_exe()
        .unwrap()
        .parent()
        .and_then(|p| p.parent())
        .unwrap()
        .join("ringlog-controller")
}

/// (broker epoch, fenced) of broker `id` as the controller describes it.
fn broker_state(endpoint: &str, id: u32) -> Option<(u64, bool)> {
    let mut stream = TcpStream::connect(endpoint).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut fbb = FlatBufferBuilder::new();
    let root = wire::DescribeClusterRequest::create(&mut fbb, &wire::DescribeClusterRequestArgs {});
    fbb.finish_minimal(root);
    let mut frame = Vec::new();
    let header = RequestHeader {
        api_key: ControllerApiKey::DescribeCluster as u16,
        api_version: 0,
        correlation_id: 1,
        client_id: "test".into(),
    };
    encode_request(&mut frame, &header, fbb.finished_data(), &[]);
    stream.write_all(&frame).ok()?;
    let mut prefix = [0u8; 4];
    stream.read_exact(&mut prefix).ok()?;
    let mut response = vec![0u8; u32::from_be_bytes(prefix) as usize];
    stream.read_exact(&mut response).ok()?;
    let decoded = decode_response(&response).ok()?;
    let description = flatbuffers::root::<wire::DescribeClusterResponse>(decoded.body).ok()?;
    description
        .brokers()?
        .iter()
        .find(|b| b.id() == id)
        .map(|b| (b.epoch(), b.fenced()))
}

fn wait_for(
    endpoint: &str,
    what: &str,
    condition: impl Fn(Option<(u64, bool)>) -> bool,
) -> Option<(u64, bool)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let state = broker_state(endpoint, 1);
        if condition(state) {
            return state;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; last state {state:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn broker_registers_heartbeats_and_is_fenced_when_killed() {
    let dir = tempfile::tempdir().unwrap();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("127.0.0.1:{port}");
    let _controller = Controller(
        Command::new(controller_binary())
            .args([
                "--node-id",
                "1",
                "--listen",
                &endpoint,
                "--peers",
                &format!("1={endpoint}"),
                "--session-timeout-ms",
                "1000",
            ])
            .arg("--data-dir")
            .arg(dir.path().join("controller"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let data = dir.path().join("broker");
    let broker_port = free_port_block(2);
    let mut broker = Broker::start_with(&data, 2, broker_port, &["--controller", &endpoint]);
    let (first_epoch, _) = wait_for(&endpoint, "the broker alive", |s| {
        matches!(s, Some((_, false)))
    })
    .unwrap();
    // Alive through several session timeouts: heartbeats keep it so.
    std::thread::sleep(Duration::from_millis(2_500));
    assert!(
        matches!(broker_state(&endpoint, 1), Some((epoch, false)) if epoch == first_epoch),
        "still alive on its heartbeats"
    );
    broker.kill9();
    wait_for(&endpoint, "the killed broker fenced", |s| {
        matches!(s, Some((_, true)))
    });
    let _broker = Broker::start_with(&data, 2, broker_port, &["--controller", &endpoint]);
    let (epoch, _) = wait_for(
        &endpoint,
        "the restarted broker alive",
        |s| matches!(s, Some((e, false)) if e > first_epoch),
    )
    .unwrap();
    assert!(epoch > first_epoch, "a new registration epoch");
}
