//! Starts the real `ringlog-broker` binary on 127.0.0.1 for end-to-end tests
//! of the client and the CLI. The broker binary lives in another package, so it
//! is built here (a no-op when fresh) and found next to this test executable.

#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub fn broker_binary() -> &'static PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "broker", "--bin", "ringlog-broker"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("cargo runs");
        assert!(status.success(), "building ringlog-broker failed");
        // target/debug/deps/e2e-xxxx -> target/debug/ringlog-broker
        let exe = std::env::current_exe().unwrap();
        exe.parent()
            .and_then(Path::parent)
            .unwrap()
            .join("ringlog-broker")
    })
}

/// A free port P with P+1..=P+shards and P+64 (admin), P+65 (embedded
/// controller) free too. Taken below the kernel's ephemeral range (32768 and
/// up by default), so outgoing connections, which take ephemeral ports, never
/// grab a broker's port between this check and the bind, nor while a killed
/// broker is down before its restart.
pub fn free_port_block(shards: u16) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 10_000;
    const HIGH: u32 = 32_000;
    const STRIDE: u32 = 80;
    static CURSOR: AtomicU32 = AtomicU32::new(0);
    // One seed per process: with the cursor, concurrent tests of one binary
    // then take distinct slots (a seed drawn per call could map two calls
    // to the same slot, and both brokers to one port block).
    static SEED: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let seed = *SEED.get_or_init(|| {
        std::process::id().wrapping_mul(7919)
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos())
    });
    let slots = (HIGH - LOW) / STRIDE;
    for _ in 0..slots {
        let step = CURSOR.fetch_add(1, Ordering::Relaxed);
        let port = (LOW + (seed.wrapping_add(step) % slots) * STRIDE) as u16;
        if (0..=shards)
            .map(|i| port + i)
            .chain([port + 64, port + 65])
            .all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok())
        {
            return port;
        }
    }
    panic!("no free port block");
}

#[derive(Debug)]
pub struct RealBroker {
    child: Option<Child>,
    pub port: u16,
    pub data_dir: PathBuf,
    log_path: PathBuf,
}

impl RealBroker {
    pub fn start(data_dir: &Path, port: u16) -> RealBroker {
        RealBroker::start_node(data_dir, port, 1, 2, &[])
    }

    /// Starts broker `node_id` with `cores` shards and extra flags (such as
    /// `--controller`), and waits until its log says every shard is ready
    /// and its main and shard ports accept.
    pub fn start_node(
        data_dir: &Path,
        port: u16,
        node_id: u32,
        cores: u16,
        extra: &[&str],
    ) -> RealBroker {
        RealBroker::start_node_with_env(data_dir, port, node_id, cores, extra, &[])
    }

    /// `start_node` with extra environment variables.
    pub fn start_node_with_env(
        data_dir: &Path,
        port: u16,
        node_id: u32,
        cores: u16,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> RealBroker {
        let log_path = data_dir.with_extension(format!("{port}.log"));
        let child = Command::new(broker_binary())
            .args([
                "--node-id",
                &node_id.to_string(),
                "--cores",
                &cores.to_string(),
                "--listen",
                &format!("127.0.0.1:{port}"),
            ])
            .arg("--data-dir")
            .arg(data_dir)
            .args(extra)
            .env("RUST_LOG", "info,openraft=warn")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .unwrap();
        let broker = RealBroker {
            child: Some(child),
            port,
            data_dir: data_dir.to_path_buf(),
            log_path,
        };
        // Ready once this process says every shard serves: a port that
        // accepts may belong to another broker, since shards listen with
        // SO_REUSEPORT and a restart leaves the ports free for a moment.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !(broker.log().matches("shard ready").count() >= usize::from(cores)
            && (0..=cores).all(|i| TcpStream::connect(("127.0.0.1", port + i)).is_ok()))
        {
            assert!(
                Instant::now() < deadline,
                "broker not ready:\n{}",
                broker.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        broker
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let status = child.wait().unwrap();
            assert!(status.success(), "clean exit:\n{}", self.log());
        }
    }

    /// Sends `signal` (a `kill` name: STOP, CONT) to the running broker.
    pub fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("the broker runs");
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal}");
    }

    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RealBroker {
    fn drop(&mut self) {
        // A failing test's broker log is the first thing to read, and its
        // temporary directory is about to go.
        if std::thread::panicking() {
            eprintln!(
                "--- log of the broker on port {} ---\n{}",
                self.port,
                self.log()
            );
        }
        self.kill9();
    }
}

/// Runs `ringlog-broker verify-log` on a partition directory and fails the
/// test with its report unless the log is valid.
pub fn verify_log(dir: &Path) {
    let output = Command::new(broker_binary())
        .arg("verify-log")
        .arg(dir)
        .output()
        .expect("verify-log runs");
    assert!(
        output.status.success(),
        "verify-log {}:\n{}{}",
        dir.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `GET /metrics` from the admin port of the broker listening on `port`
/// (the admin port is the listen port + 64).
pub fn scrape_metrics(port: u16) -> String {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect(("127.0.0.1", port + 64)).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}
