//! Starts a real three-controller `ringlog-controller` quorum on 127.0.0.1
//! for multi-process tests, finds its leader and kills members with -9. The
//! controller binary lives in another package, so it is built here (a no-op
//! when fresh) and found next to this test executable.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use client::messages::{describe_cluster_request, describe_cluster_response, ClusterDescription};
use client::{ClientConfig, Connection};

pub struct Quorum {
    children: Vec<Option<Child>>,
    pub endpoints: Vec<String>,
    _dir: tempfile::TempDir,
}

impl Drop for Quorum {
    fn drop(&mut self) {
        for child in self.children.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn controller_binary() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "-p", "controller", "--bin", "ringlog-controller"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building ringlog-controller failed");
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .and_then(|p| p.parent())
        .unwrap()
        .join("ringlog-controller")
}

impl Quorum {
    /// Three controllers, ids 1..=3, with extra flags for each (such as
    /// `--session-timeout-ms`).
    pub fn start(extra: &[&str]) -> Quorum {
        let binary = controller_binary();
        let dir = tempfile::tempdir().unwrap();
        let listeners: Vec<TcpListener> = (0..3)
            .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let endpoints: Vec<String> = listeners
            .iter()
            .map(|l| l.local_addr().unwrap().to_string())
            .collect();
        drop(listeners);
        let peers: Vec<String> = endpoints
            .iter()
            .enumerate()
            .map(|(i, e)| format!("{}={e}", i + 1))
            .collect();
        let children = endpoints
            .iter()
            .enumerate()
            .map(|(i, endpoint)| {
                Some(
                    Command::new(&binary)
                        .args([
                            "--node-id",
                            &(i + 1).to_string(),
                            "--listen",
                            endpoint,
                            "--peers",
                            &peers.join(","),
                        ])
                        .args(extra)
                        .arg("--data-dir")
                        .arg(dir.path().join(format!("c{}", i + 1)))
                        .env("RUST_LOG", "warn")
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .expect("controller starts"),
                )
            })
            .collect();
        Quorum {
            children,
            endpoints,
            _dir: dir,
        }
    }

    /// "HOST:PORT,HOST:PORT,HOST:PORT" for `--controller`.
    pub fn controller_list(&self) -> String {
        self.endpoints.join(",")
    }

    /// kill -9 of controller `id` (1-based).
    pub fn kill9(&mut self, id: u64) {
        if let Some(mut child) = self.children[(id - 1) as usize].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The first answer of a live controller that knows a leader.
    pub async fn describe(&self) -> Option<ClusterDescription> {
        let config = ClientConfig::default();
        for (i, endpoint) in self.endpoints.iter().enumerate() {
            if self.children[i].is_none() {
                continue;
            }
            let answer = async {
                let connection = Connection::connect(endpoint, &config).await.ok()?;
                let response = connection
                    .request_controller(
                        protocol::api::ControllerApiKey::DescribeCluster,
                        &describe_cluster_request(),
                    )
                    .await
                    .ok()?;
                describe_cluster_response(response.body()).ok()
            }
            .await;
            if let Some(description) = answer.filter(|d| d.leader_id.is_some()) {
                return Some(description);
            }
        }
        None
    }

    /// Waits until some live controller reports a leader; returns its id.
    pub async fn leader(&self, within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        loop {
            if let Some(id) = self.describe().await.and_then(|d| d.leader_id) {
                if self.children[(id - 1) as usize].is_some() {
                    return id;
                }
            }
            assert!(Instant::now() < deadline, "no controller leader elected");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
