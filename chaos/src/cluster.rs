//! A cluster under test: three controllers and three brokers (or one broker
//! with its embedded controller), real processes started from the built
//! binaries, on 127.0.0.1 ports or, for partitions, each in its own network
//! namespace. It knows where each process listens and keeps its data, finds
//! partition leaders and the controller leader, and collects crashes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use client::messages::{describe_cluster_request, describe_cluster_response};
use client::{Admin, ClientConfig, Cluster as ClientCluster, Connection};
use nix::sys::signal::Signal;

use crate::netns::Network;
use crate::process::{Bind, Process};

/// Session timeout of the brokers with the controllers: a silent broker is
/// fenced and its partitions move within about this.
pub const SESSION_TIMEOUT_MS: u64 = 2_000;
/// Bound on waiting for a cluster to be ready (every broker registered and
/// unfenced).
pub const READY_MS_MAX: u64 = 60_000;

/// Where the binaries under test are.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub broker: PathBuf,
    pub controller: PathBuf,
}

impl Binaries {
    /// The binaries in `dir` (a cargo target profile directory).
    pub fn in_dir(dir: &Path) -> Binaries {
        Binaries {
            broker: dir.join("ringlog-broker"),
            controller: dir.join("ringlog-controller"),
        }
    }
}

/// How the cluster is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Three controllers, three brokers of one shard each.
    Replicated,
    /// One broker with its embedded one-voter controller.
    Single,
}

#[derive(Debug)]
pub struct Cluster {
    pub controllers: Vec<Process>,
    pub brokers: Vec<Process>,
    /// Each broker's main address, HOST:PORT.
    pub broker_addresses: Vec<String>,
    pub controller_addresses: Vec<String>,
    pub broker_dirs: Vec<PathBuf>,
    /// Host index in `network` of controller `i` is `i`, of broker `i` is `3 + i`.
    pub network: Option<Network>,
}

/// A port with `span` free ports after it on 127.0.0.1, below the
/// ephemeral range so outgoing connections never take it.
fn free_port_block(span: u16) -> anyhow::Result<u16> {
    let seed = std::process::id() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::from(d.subsec_nanos()));
    for attempt in 0..400u64 {
        let port = 12_000 + ((seed + attempt * 7_919) % 180) as u16 * 100;
        let free = (0..span).all(|i| std::net::TcpListener::bind(("127.0.0.1", port + i)).is_ok());
        if free {
            return Ok(port);
        }
    }
    bail!("no free block of {span} ports")
}

/// The ports a one-shard broker listening on `port` binds: its main port,
/// its shard's port, its admin port and, when it embeds one, its
/// controller's. The offsets are the broker's defaults (its `config`
/// module), which the processes here do not override.
fn broker_ports(port: u16, embedded_controller: bool) -> Vec<(u16, Bind)> {
    const SHARD_PORT_OFFSET: u16 = 1;
    const ADMIN_PORT_OFFSET: u16 = 64;
    const EMBEDDED_CONTROLLER_PORT_OFFSET: u16 = 65;
    let mut ports = vec![
        (port, Bind::ReuseAddressAndPort),
        (port + SHARD_PORT_OFFSET, Bind::ReuseAddressAndPort),
        (port + ADMIN_PORT_OFFSET, Bind::ReuseAddressAndPort),
    ];
    if embedded_controller {
        ports.push((port + EMBEDDED_CONTROLLER_PORT_OFFSET, Bind::ReuseAddress));
    }
    ports
}

impl Cluster {
    /// Starts the processes (not waiting for them to be ready).
    pub fn start(
        bin: &Binaries,
        dir: &Path,
        shape: Shape,
        with_network: bool,
    ) -> anyhow::Result<Cluster> {
        std::fs::create_dir_all(dir)?;
        let network = if with_network {
            Some(Network::create(6).context("creating network namespaces")?)
        } else {
            None
        };
        let mut cluster = match shape {
            Shape::Replicated => Cluster::replicated(bin, dir, network)?,
            Shape::Single => Cluster::single(bin, dir)?,
        };
        for process in cluster.controllers.iter_mut().chain(&mut cluster.brokers) {
            process.start()?;
        }
        Ok(cluster)
    }

    fn replicated(bin: &Binaries, dir: &Path, network: Option<Network>) -> anyhow::Result<Cluster> {
        let base = if network.is_some() {
            0
        } else {
            free_port_block(400)?
        };
        let controller_address = |i: usize| match &network {
            Some(n) => format!("{}:9300", n.address(i)),
            None => format!("127.0.0.1:{}", base + i as u16),
        };
        let broker_address = |i: usize| match &network {
            Some(n) => format!("{}:9092", n.address(3 + i)),
            None => format!("127.0.0.1:{}", base + 100 * (i as u16 + 1)),
        };
        let controller_addresses: Vec<String> = (0..3).map(controller_address).collect();
        let peers: Vec<String> = controller_addresses
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}={a}", i + 1))
            .collect();
        let namespace = |host: usize| network.as_ref().map(|_| Network::namespace(host));
        let controllers = (0..3)
            .map(|i| {
                let args = vec![
                    "--node-id".into(),
                    (i + 1).to_string(),
                    "--listen".into(),
                    controller_addresses[i].clone(),
                    "--peers".into(),
                    peers.join(","),
                    "--data-dir".into(),
                    dir.join(format!("c{}", i + 1)).display().to_string(),
                    "--session-timeout-ms".into(),
                    SESSION_TIMEOUT_MS.to_string(),
                ];
                let log = dir.join(format!("c{}.log", i + 1));
                Process::new(
                    &format!("controller {}", i + 1),
                    &bin.controller,
                    args,
                    namespace(i),
                    log,
                )
                .with_listen_ports(vec![(base + i as u16, Bind::ReuseAddress)])
            })
            .collect();
        let broker_addresses: Vec<String> = (0..3).map(broker_address).collect();
        let broker_dirs: Vec<PathBuf> = (0..3).map(|i| dir.join(format!("b{}", i + 1))).collect();
        let brokers = (0..3)
            .map(|i| {
                let args = vec![
                    "--node-id".into(),
                    (i + 1).to_string(),
                    "--cores".into(),
                    "1".into(),
                    "--listen".into(),
                    broker_addresses[i].clone(),
                    "--data-dir".into(),
                    broker_dirs[i].display().to_string(),
                    "--controller".into(),
                    controller_addresses.join(","),
                ];
                let log = dir.join(format!("b{}.log", i + 1));
                Process::new(
                    &format!("broker {}", i + 1),
                    &bin.broker,
                    args,
                    namespace(3 + i),
                    log,
                )
                .with_listen_ports(broker_ports(base + 100 * (i as u16 + 1), false))
            })
            .collect();
        Ok(Cluster {
            controllers,
            brokers,
            broker_addresses,
            controller_addresses,
            broker_dirs,
            network,
        })
    }

    fn single(bin: &Binaries, dir: &Path) -> anyhow::Result<Cluster> {
        let port = free_port_block(70)?;
        let address = format!("127.0.0.1:{port}");
        let data = dir.join("b1");
        let args = vec![
            "--node-id".into(),
            "1".into(),
            "--cores".into(),
            "1".into(),
            "--listen".into(),
            address.clone(),
            "--data-dir".into(),
            data.display().to_string(),
        ];
        let broker = Process::new("broker 1", &bin.broker, args, None, dir.join("b1.log"))
            .with_listen_ports(broker_ports(port, true));
        Ok(Cluster {
            controllers: Vec::new(),
            brokers: vec![broker],
            broker_addresses: vec![address],
            controller_addresses: Vec::new(),
            broker_dirs: vec![data],
            network: None,
        })
    }

    pub fn bootstrap(&self) -> String {
        self.broker_addresses.join(",")
    }

    /// Waits until the metadata lists every broker (unfenced) and some
    /// broker answers.
    pub async fn wait_ready(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_millis(READY_MS_MAX);
        let expected = self.brokers.len();
        loop {
            let config = ClientConfig {
                metadata_attempts_max: 1,
                metadata_timeout_ms: 2_000,
                ..ClientConfig::default()
            };
            if let Ok(cluster) = ClientCluster::connect(&self.bootstrap(), config).await {
                if cluster.metadata().brokers.len() == expected {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                bail!("the cluster was not ready within {READY_MS_MAX} ms");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The broker index (0-based) leading `topic`'s `partition` now.
    pub async fn leader_of(&self, topic: &str, partition: i32) -> Option<usize> {
        let config = ClientConfig {
            metadata_attempts_max: 1,
            metadata_timeout_ms: 2_000,
            ..ClientConfig::default()
        };
        let cluster = ClientCluster::connect(&self.bootstrap(), config)
            .await
            .ok()?;
        let metadata = cluster.metadata();
        let leader = metadata.topic(topic)?.partition(partition)?.leader;
        usize::try_from(leader - 1).ok()
    }

    /// The controller index (0-based) leading the Raft quorum now.
    pub async fn controller_leader(&self) -> Option<usize> {
        let config = ClientConfig::default();
        for (i, address) in self.controller_addresses.iter().enumerate() {
            if !self.controllers[i].is_running() {
                continue;
            }
            let answer = async {
                let connection = Connection::connect(address, &config).await.ok()?;
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
            if let Some(leader) = answer.and_then(|d| d.leader_id) {
                return usize::try_from(leader - 1).ok();
            }
        }
        None
    }

    /// Broker epochs (by broker id) and partition leaders of `topic` as the
    /// controller leader describes them.
    pub async fn broker_epochs(&self) -> Option<Vec<(u32, u64, bool)>> {
        let leader = self.controller_leader().await?;
        let connection =
            Connection::connect(&self.controller_addresses[leader], &ClientConfig::default())
                .await
                .ok()?;
        let response = connection
            .request_controller(
                protocol::api::ControllerApiKey::DescribeCluster,
                &describe_cluster_request(),
            )
            .await
            .ok()?;
        let description = describe_cluster_response(response.body()).ok()?;
        Some(
            description
                .brokers
                .iter()
                .map(|b| (b.id, b.epoch, b.fenced))
                .collect(),
        )
    }

    pub async fn admin(&self) -> anyhow::Result<Admin> {
        Ok(Admin::connect(&self.bootstrap(), ClientConfig::default()).await?)
    }

    pub fn pause_broker(&self, i: usize) {
        self.brokers[i].signal(Signal::SIGSTOP);
    }

    pub fn resume_broker(&self, i: usize) {
        self.brokers[i].signal(Signal::SIGCONT);
    }

    /// Every process that exited on its own since the last call.
    pub fn crashes(&mut self) -> Vec<String> {
        let mut crashes = Vec::new();
        for process in self.controllers.iter_mut().chain(&mut self.brokers) {
            process.check_alive();
            crashes.extend(process.take_crashes());
        }
        crashes
    }

    /// SIGTERM to every running broker; a broker that does not exit cleanly
    /// is reported.
    pub fn stop_brokers(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        for broker in &mut self.brokers {
            if !broker.check_alive() {
                continue;
            }
            match broker.terminate() {
                Ok(status) if status.success() => {}
                Ok(status) => problems.push(format!(
                    "{} exited with {status} on SIGTERM; log ends:\n{}",
                    broker.name,
                    broker.log_tail(20)
                )),
                Err(e) => problems.push(e),
            }
        }
        problems
    }

    pub fn start_brokers(&mut self) -> anyhow::Result<()> {
        for broker in &mut self.brokers {
            if !broker.is_running() {
                broker.start()?;
            }
        }
        Ok(())
    }

    /// Every partition directory of every broker.
    pub fn partition_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = Vec::new();
        for data in &self.broker_dirs {
            if let Ok(entries) = std::fs::read_dir(data.join("topics")) {
                for entry in entries.flatten() {
                    if entry.path().is_dir() {
                        dirs.push(entry.path());
                    }
                }
            }
        }
        dirs.sort();
        dirs
    }

    /// The network host index of broker `i`.
    pub fn broker_host(&self, i: usize) -> usize {
        3 + i
    }
}
