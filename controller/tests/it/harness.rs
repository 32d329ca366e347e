//! Multi-process test harness: starts real `ringlog-controller` processes on
//! 127.0.0.1 with free ports and temporary data directories (killed on drop,
//! their logs printed when a test fails), and a blocking wire client for the
//! controller API built on the crate's own codec.

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use controller::messages::{
    AlterIsr, ApiFailure, BrokerHeartbeat, ClusterDescription, CreateTopicSpec, FetchMetadata,
    ImageView, MetadataUpdate, RegisterBroker, Registered, SessionState, TopicOutcome,
};
use controller::{wire, BrokerEndpoints, BrokerEpoch, BrokerId, MetadataVersion};
use protocol::api::ControllerApiKey;
use protocol::frame::{self, RequestHeader};
use protocol::ApiKey;
use tempfile::TempDir;

/// Bound on one call's connect, write and read.
const CALL_TIMEOUT_MS_MAX: u64 = 5_000;
const RESPONSE_BYTES_MAX: u32 = 64 << 20;
/// Pause between polls of a condition that has a deadline.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Reserves free ports by binding them all at once, then releasing them.
fn free_ports(count: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind ephemeral port"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("local addr").port())
        .collect()
}

#[derive(Debug)]
pub struct ControllerProcess {
    pub id: u64,
    pub endpoint: String,
    child: Child,
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A quorum of controller processes; slot `i` runs node id `i + 1`.
#[derive(Debug)]
pub struct Cluster {
    pub endpoints: Vec<String>,
    nodes: Vec<Option<ControllerProcess>>,
    dir: TempDir,
    session_timeout_ms: u64,
}

impl Cluster {
    pub fn start(size: usize, session_timeout_ms: u64) -> Cluster {
        let dir = TempDir::new().expect("tempdir");
        let endpoints: Vec<String> = free_ports(size)
            .into_iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let mut cluster = Cluster {
            endpoints,
            nodes: (0..size).map(|_| None).collect(),
            dir,
            session_timeout_ms,
        };
        for slot in 0..size {
            cluster.spawn(slot);
        }
        cluster
    }

    fn log_path(&self, slot: usize) -> PathBuf {
        self.dir.path().join(format!("controller-{}.log", slot + 1))
    }

    fn spawn(&mut self, slot: usize) {
        let id = slot as u64 + 1;
        let peers: Vec<String> = self
            .endpoints
            .iter()
            .enumerate()
            .map(|(i, e)| format!("{}={e}", i + 1))
            .collect();
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path(slot))
            .expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_ringlog-controller"))
            .arg("--node-id")
            .arg(id.to_string())
            .arg("--listen")
            .arg(&self.endpoints[slot])
            .arg("--peers")
            .arg(peers.join(","))
            .arg("--data-dir")
            .arg(self.dir.path().join(format!("data-{id}")))
            .arg("--session-timeout-ms")
            .arg(self.session_timeout_ms.to_string())
            .env("RUST_LOG", "info,openraft=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn ringlog-controller");
        self.nodes[slot] = Some(ControllerProcess {
            id,
            endpoint: self.endpoints[slot].clone(),
            child,
        });
    }

    /// SIGKILL: no shutdown, no flush beyond what was already synced.
    pub fn kill(&mut self, slot: usize) {
        self.nodes[slot] = None;
    }

    /// The slot of the controller that reports itself leader, polled until `deadline`.
    pub fn wait_for_leader(&self, deadline: Instant) -> (usize, ClusterDescription) {
        loop {
            for (slot, node) in self.nodes.iter().enumerate() {
                let Some(node) = node else { continue };
                if let Ok(Ok(d)) = describe_cluster(&node.endpoint) {
                    if d.leader_id == Some(node.id) {
                        return (slot, d);
                    }
                }
            }
            assert!(Instant::now() < deadline, "no leader before the deadline");
            std::thread::sleep(POLL_INTERVAL);
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.nodes.iter_mut().for_each(|n| *n = None);
        if std::thread::panicking() {
            for slot in 0..self.endpoints.len() {
                let log = std::fs::read_to_string(self.log_path(slot)).unwrap_or_default();
                eprintln!("---- controller {} log ----\n{log}", slot + 1);
            }
        }
    }
}

/// One request, one response, on a fresh connection.
pub fn call(endpoint: &str, api_key: u16, body: &[u8]) -> io::Result<Vec<u8>> {
    let timeout = Duration::from_millis(CALL_TIMEOUT_MS_MAX);
    let addr = endpoint.parse().map_err(io::Error::other)?;
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let header = RequestHeader {
        api_key,
        api_version: 0,
        correlation_id: 7,
        client_id: "controller-test".into(),
    };
    let mut out = Vec::new();
    frame::encode_request(&mut out, &header, body, &[]);
    stream.write_all(&out)?;
    let mut prefix = [0u8; 4];
    stream.read_exact(&mut prefix)?;
    let len = frame::frame_len(prefix, RESPONSE_BYTES_MAX).map_err(io::Error::other)?;
    let mut frame = vec![0u8; len];
    stream.read_exact(&mut frame)?;
    let response = frame::decode_response(&frame).map_err(io::Error::other)?;
    assert_eq!(response.correlation_id, 7);
    Ok(response.body.to_vec())
}

pub fn describe_cluster(endpoint: &str) -> io::Result<Result<ClusterDescription, ApiFailure>> {
    let body = call(
        endpoint,
        ControllerApiKey::DescribeCluster as u16,
        &wire::encode_describe_cluster_request(),
    )?;
    wire::decode_describe_cluster_response(&body).map_err(io::Error::other)
}

pub fn register_broker(endpoint: &str, id: u32) -> io::Result<Result<Registered, ApiFailure>> {
    // Every call stands for a new broker process: a new incarnation.
    static INCARNATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let request = RegisterBroker {
        broker_id: BrokerId(id),
        incarnation_id: INCARNATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        endpoints: BrokerEndpoints {
            client: format!("127.0.0.1:{}", 19_000 + id),
            shards: vec![
                format!("127.0.0.1:{}", 19_100 + id * 2),
                format!("127.0.0.1:{}", 19_101 + id * 2),
            ],
        },
    };
    let body = call(
        endpoint,
        ControllerApiKey::RegisterBroker as u16,
        &wire::encode_register_broker_request(&request),
    )?;
    wire::decode_register_broker_response(&body).map_err(io::Error::other)
}

pub fn heartbeat(
    endpoint: &str,
    id: u32,
    epoch: BrokerEpoch,
) -> io::Result<Result<SessionState, ApiFailure>> {
    let request = BrokerHeartbeat {
        broker_id: BrokerId(id),
        broker_epoch: epoch,
        ready: true,
        want_shutdown: false,
    };
    let body = call(
        endpoint,
        ControllerApiKey::BrokerHeartbeat as u16,
        &wire::encode_broker_heartbeat_request(&request),
    )?;
    wire::decode_broker_heartbeat_response(&body).map_err(io::Error::other)
}

pub fn fetch_metadata(
    endpoint: &str,
    request: FetchMetadata,
) -> io::Result<Result<MetadataUpdate, ApiFailure>> {
    let body = call(
        endpoint,
        ControllerApiKey::FetchMetadata as u16,
        &wire::encode_fetch_metadata_request(&request),
    )?;
    wire::decode_fetch_metadata_response(&body).map_err(io::Error::other)
}

pub fn image(endpoint: &str) -> ImageView {
    let request = FetchMetadata {
        from_version: MetadataVersion(0),
        max_wait_ms: 0,
        full_image: true,
    };
    match fetch_metadata(endpoint, request) {
        Ok(Ok(MetadataUpdate::Image(image))) => image,
        other => panic!("fetch image from {endpoint}: {other:?}"),
    }
}

pub fn create_topic(
    endpoint: &str,
    name: &str,
    partition_count: u32,
    replication_factor: u16,
) -> io::Result<TopicOutcome> {
    let spec = CreateTopicSpec {
        name: name.into(),
        partition_count,
        replication_factor,
        config: Default::default(),
    };
    let body = call(
        endpoint,
        ApiKey::CreateTopics as u16,
        &wire::encode_create_topics_request(&[spec]),
    )?;
    let mut outcomes = wire::decode_create_topics_response(&body).map_err(io::Error::other)?;
    assert_eq!(outcomes.len(), 1);
    Ok(outcomes.remove(0))
}

pub fn alter_isr(
    endpoint: &str,
    request: &AlterIsr,
) -> io::Result<Result<(controller::PartitionIndex, controller::PartitionRecord), ApiFailure>> {
    let body = call(
        endpoint,
        ControllerApiKey::AlterIsr as u16,
        &wire::encode_alter_isr_request(request),
    )?;
    wire::decode_alter_isr_response(&body).map_err(io::Error::other)
}

/// Registers broker `id` and heartbeats it until it is alive (unfenced).
pub fn join_broker(endpoint: &str, id: u32, deadline: Instant) -> BrokerEpoch {
    let registered = register_broker(endpoint, id)
        .expect("register call")
        .expect("registered");
    loop {
        match heartbeat(endpoint, id, registered.broker_epoch).expect("heartbeat call") {
            Ok(SessionState::Alive) => return registered.broker_epoch,
            other => assert!(
                Instant::now() < deadline,
                "broker {id} not alive: {other:?}"
            ),
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}
