//! One fault scenario, end to end: a fresh cluster, the load generator
//! writing with acks=all (`min.insync.replicas=2`, small segments) and
//! reading with `--verify`, one nemesis applied while it runs, then every
//! broker restarted, the topic read back from the earliest offset, every
//! replica directory checked with `verify-log`, and every process that died
//! on its own reported.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use loadgen::payload::PayloadKind;
use loadgen::run_config::{Acks, RunConfig, RunFlags};
use serde::Serialize;

use crate::check::{compare, verify_log, ReadBackCounts};
use crate::cluster::{Binaries, Cluster, Shape, SESSION_TIMEOUT_MS};

/// The topic every scenario writes.
pub const TOPIC: &str = "chaos";
/// Partitions of the replicated scenarios' topic.
const PARTITIONS: i32 = 6;
/// Small segments, so rolls happen throughout the run.
const SEGMENT_BYTES: &str = "262144";
/// How long the read-back may take.
const READ_BACK_MS_MAX: u64 = 120_000;

/// What goes wrong in a scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Nemesis {
    /// kill -9 of partition 0's leader; restarted 3 s later.
    KillLeader,
    /// SIGSTOP of partition 0's leader past its session; SIGCONT.
    PauseLeader,
    /// SIGTERM of partition 0's leader under load (controlled shutdown);
    /// restarted.
    TerminateLeader,
    /// kill -9 of every broker at once; all restarted.
    KillAllBrokers,
    /// kill -9 of the Raft leader controller; restarted.
    KillControllerLeader,
    /// kill -9 and restart of each controller in turn: no broker may be
    /// fenced and no leadership may move.
    RestartEachController,
    /// Partition 0's leader cut off from the controllers and the other
    /// brokers (clients still reach it) past its session; healed.
    PartitionLeader,
    /// One broker's disk full for a few seconds; freed.
    FullDisk,
    /// One broker, one partition, small segments, no fsync, several
    /// producers as fast as they go: segments roll while writes are in
    /// flight. Checked after a clean stop.
    RollHeavy,
}

impl Nemesis {
    pub const ALL: [Nemesis; 9] = [
        Nemesis::KillLeader,
        Nemesis::PauseLeader,
        Nemesis::TerminateLeader,
        Nemesis::KillAllBrokers,
        Nemesis::KillControllerLeader,
        Nemesis::RestartEachController,
        Nemesis::PartitionLeader,
        Nemesis::FullDisk,
        Nemesis::RollHeavy,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Nemesis::KillLeader => "kill-leader",
            Nemesis::PauseLeader => "pause-leader",
            Nemesis::TerminateLeader => "terminate-leader",
            Nemesis::KillAllBrokers => "kill-all-brokers",
            Nemesis::KillControllerLeader => "kill-controller-leader",
            Nemesis::RestartEachController => "restart-each-controller",
            Nemesis::PartitionLeader => "partition-leader",
            Nemesis::FullDisk => "full-disk",
            Nemesis::RollHeavy => "roll-heavy",
        }
    }

    /// Why this scenario cannot run here, if it cannot.
    pub fn unavailable(self) -> Option<&'static str> {
        let root = nix::unistd::geteuid().is_root();
        match self {
            Nemesis::PartitionLeader if !crate::netns::available() => {
                Some("needs root and iproute2 for network namespaces")
            }
            Nemesis::FullDisk if !root => Some("needs root to mount a small tmpfs"),
            _ => None,
        }
    }
}

impl FromStr for Nemesis {
    type Err = String;
    fn from_str(s: &str) -> Result<Nemesis, String> {
        Nemesis::ALL
            .into_iter()
            .find(|n| n.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Nemesis::ALL.iter().map(|n| n.name()).collect();
                format!("{s:?}: known scenarios: {}", names.join(", "))
            })
    }
}

/// Knobs of a scenario run.
#[derive(Clone, Debug)]
pub struct Settings {
    pub binaries: Binaries,
    pub work_dir: PathBuf,
    /// How long the load runs; the nemesis starts a quarter in.
    pub load_ms: u64,
    /// Offered rate of the replicated scenarios, msgs/s of 500 B.
    pub rate_msgs_per_s: u64,
}

/// A scenario's outcome, as the report shows it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Outcome {
    pub scenario: String,
    pub skipped: Option<String>,
    pub counts: ReadBackCounts,
    /// Records the producers sent, and those that failed for good (not
    /// acknowledged within the delivery timeout, or not retriable).
    pub published: u64,
    pub send_errors: u64,
    /// The longest any partition went without an acknowledgement.
    pub longest_unavailability_ms: u64,
    pub retried_batches: u64,
    /// Processes that died without being asked to, broken clean stops,
    /// failed checks of the scenario itself.
    pub problems: Vec<String>,
    pub verify_log_problems: Vec<String>,
    pub replica_dirs_checked: usize,
    pub elapsed_ms: u64,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.skipped.is_some()
            || (self.counts.is_clean()
                && self.counts.acknowledged > 0
                && self.problems.is_empty()
                && self.verify_log_problems.is_empty())
    }
}

/// Runs one scenario in `settings.work_dir/<name>`.
pub async fn run(nemesis: Nemesis, settings: &Settings) -> Outcome {
    let started = Instant::now();
    let mut outcome = Outcome {
        scenario: nemesis.name().to_owned(),
        ..Outcome::default()
    };
    if let Some(why) = nemesis.unavailable() {
        outcome.skipped = Some(why.to_owned());
        return outcome;
    }
    let dir = settings.work_dir.join(nemesis.name());
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = run_in(nemesis, settings, &dir, &mut outcome).await {
        outcome.problems.push(format!("{e:#}"));
    }
    outcome.elapsed_ms = started.elapsed().as_millis() as u64;
    outcome
}

async fn run_in(
    nemesis: Nemesis,
    settings: &Settings,
    dir: &Path,
    outcome: &mut Outcome,
) -> anyhow::Result<()> {
    let shape = if nemesis == Nemesis::RollHeavy {
        Shape::Single
    } else {
        Shape::Replicated
    };
    let small_disk = (nemesis == Nemesis::FullDisk).then(|| dir.join("b3"));
    if let Some(mount) = &small_disk {
        mount_small_tmpfs(mount)?;
    }
    let result = run_cluster(nemesis, settings, dir, shape, outcome).await;
    if let Some(mount) = &small_disk {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(mount)
            .status();
    }
    result
}

async fn run_cluster(
    nemesis: Nemesis,
    settings: &Settings,
    dir: &Path,
    shape: Shape,
    outcome: &mut Outcome,
) -> anyhow::Result<()> {
    let with_network = nemesis == Nemesis::PartitionLeader;
    let mut cluster = Cluster::start(&settings.binaries, dir, shape, with_network)
        .context("starting the cluster")?;
    let result = load_and_judge(nemesis, settings, dir, &mut cluster, outcome).await;
    if result.is_err() {
        // A step that failed often did so because a process died: say which,
        // with the end of its log.
        outcome.problems.extend(cluster.crashes());
    }
    result
}

async fn load_and_judge(
    nemesis: Nemesis,
    settings: &Settings,
    dir: &Path,
    cluster: &mut Cluster,
    outcome: &mut Outcome,
) -> anyhow::Result<()> {
    cluster
        .wait_ready()
        .await
        .context("waiting for the cluster")?;
    let config = load_config(nemesis, settings, cluster, dir)?;
    create_topic(cluster, &config)
        .await
        .context("creating the topic")?;
    let load = std::thread::spawn(move || loadgen::driver::run_blocking(config, 2));
    tokio::time::sleep(Duration::from_millis(settings.load_ms / 4)).await;
    apply(nemesis, cluster, outcome)
        .await
        .with_context(|| format!("applying {}", nemesis.name()))?;
    let run = tokio::task::spawn_blocking(move || load.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the load generator panicked"))?
        .context("running the load")?;
    outcome.longest_unavailability_ms = run.longest_ack_gap_ms;
    let totals = run.recorder.all_counters();
    outcome.published = totals.published_messages;
    outcome.send_errors = totals.errors;
    outcome.retried_batches = run.retried_batches;
    outcome.problems.extend(cluster.crashes());

    // Every broker restarts, then the log alone is the judge.
    outcome.problems.extend(cluster.stop_brokers());
    cluster.start_brokers().context("restarting the brokers")?;
    cluster
        .wait_ready()
        .await
        .context("waiting for the restarted cluster")?;
    let read_back = loadgen::readback::read_back(
        &cluster.bootstrap(),
        TOPIC,
        PayloadKind::Random,
        Duration::from_millis(READ_BACK_MS_MAX),
    )
    .await
    .context("reading the topic back")?;
    outcome.counts = compare(&run.acked, &run.consumed, &read_back);
    outcome.problems.extend(cluster.crashes());
    outcome.problems.extend(cluster.stop_brokers());
    for replica in cluster.partition_dirs() {
        outcome.replica_dirs_checked += 1;
        if let Some(problem) = verify_log(&settings.binaries.broker, &replica) {
            outcome.verify_log_problems.push(problem);
        }
    }
    Ok(())
}

fn load_config(
    nemesis: Nemesis,
    settings: &Settings,
    cluster: &Cluster,
    dir: &Path,
) -> anyhow::Result<RunConfig> {
    let topic_configs = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let flags = if nemesis == Nemesis::RollHeavy {
        RunFlags {
            partitions: Some(1),
            replication_factor: Some(1),
            message_size_bytes: Some(1024),
            rate_msgs_per_s: Some(0),
            // Enough producers that appends fill whole write chunks while
            // a write wave is in flight (acks=1 waits for the write).
            producers: Some(24),
            acks: Some(Acks::Leader),
            topic_configs: topic_configs(&[("segment.bytes", "8388608"), ("flush.policy", "none")]),
            ..RunFlags::default()
        }
    } else {
        RunFlags {
            partitions: Some(PARTITIONS as u32),
            replication_factor: Some(3),
            message_size_bytes: Some(500),
            rate_msgs_per_s: Some(settings.rate_msgs_per_s),
            producers: Some(2),
            acks: Some(Acks::All),
            topic_configs: topic_configs(&[
                ("min.insync.replicas", "2"),
                ("segment.bytes", SEGMENT_BYTES),
            ]),
            ..RunFlags::default()
        }
    };
    let flags = RunFlags {
        bootstrap: Some(cluster.bootstrap()),
        topic: Some(TOPIC.to_owned()),
        duration_ms: Some(settings.load_ms),
        warmup_ms: Some(0),
        consumers: Some(2),
        verify: true,
        delivery_timeout_ms: Some(60_000),
        report_dir: Some(dir.join("report")),
        ..flags
    };
    Ok(RunConfig::resolve(flags, 7)?)
}

/// Creates the topic and waits until every partition has a leader, so the
/// nemesis can find one.
async fn create_topic(cluster: &Cluster, config: &RunConfig) -> anyhow::Result<()> {
    let admin = cluster.admin().await?;
    admin
        .create_topic(
            &config.topic,
            config.partitions as i32,
            config.replication_factor as i16,
            &config.topic_configs,
        )
        .await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    for partition in 0..config.partitions as i32 {
        while cluster.leader_of(&config.topic, partition).await.is_none() {
            if Instant::now() >= deadline {
                bail!("partition {partition} got no leader");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

async fn leader(cluster: &Cluster) -> anyhow::Result<usize> {
    cluster
        .leader_of(TOPIC, 0)
        .await
        .context("partition 0 has no leader")
}

async fn apply(
    nemesis: Nemesis,
    cluster: &mut Cluster,
    outcome: &mut Outcome,
) -> anyhow::Result<()> {
    let session = Duration::from_millis(SESSION_TIMEOUT_MS);
    match nemesis {
        Nemesis::KillLeader => {
            let victim = leader(cluster).await?;
            cluster.brokers[victim].kill9();
            tokio::time::sleep(Duration::from_secs(3)).await;
            cluster.brokers[victim].start()?;
        }
        Nemesis::PauseLeader => {
            let victim = leader(cluster).await?;
            cluster.pause_broker(victim);
            tokio::time::sleep(session + Duration::from_secs(3)).await;
            cluster.resume_broker(victim);
        }
        Nemesis::TerminateLeader => {
            let victim = leader(cluster).await?;
            match cluster.brokers[victim].terminate() {
                Ok(status) if status.success() => {}
                Ok(status) => outcome.problems.push(format!(
                    "broker {} exited with {status} on SIGTERM",
                    victim + 1
                )),
                Err(e) => outcome.problems.push(e),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            cluster.brokers[victim].start()?;
        }
        Nemesis::KillAllBrokers => {
            for broker in &mut cluster.brokers {
                broker.kill9();
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            cluster.start_brokers()?;
        }
        Nemesis::KillControllerLeader => {
            let victim = cluster
                .controller_leader()
                .await
                .context("no controller leader")?;
            cluster.controllers[victim].kill9();
            tokio::time::sleep(Duration::from_secs(2)).await;
            cluster.controllers[victim].start()?;
        }
        Nemesis::RestartEachController => restart_each_controller(cluster, outcome).await?,
        Nemesis::PartitionLeader => {
            let victim = leader(cluster).await?;
            let network = cluster.network.as_ref().context("no network")?;
            let host = cluster.broker_host(victim);
            let peers: Vec<usize> = (0..6).filter(|&h| h != host).collect();
            network.isolate(host, &peers)?;
            tokio::time::sleep(session + Duration::from_secs(4)).await;
            network.heal(host, &peers)?;
        }
        Nemesis::FullDisk => {
            let filler = cluster.broker_dirs[2].join("filler");
            fill_disk(&filler)?;
            tokio::time::sleep(Duration::from_secs(4)).await;
            std::fs::remove_file(&filler)?;
        }
        Nemesis::RollHeavy => {}
    }
    Ok(())
}

/// Kills and restarts each controller in turn; a controller failover must
/// fence no healthy broker and move no leadership.
async fn restart_each_controller(
    cluster: &mut Cluster,
    outcome: &mut Outcome,
) -> anyhow::Result<()> {
    let epochs_before = cluster.broker_epochs().await.context("broker epochs")?;
    let leaders_before = partition_leaders(cluster).await?;
    for i in 0..cluster.controllers.len() {
        cluster.controllers[i].kill9();
        tokio::time::sleep(Duration::from_secs(2)).await;
        cluster.controllers[i].start()?;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let epochs_after = loop {
        match cluster.broker_epochs().await {
            Some(e) => break e,
            None if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            None => bail!("no controller leader after the restarts"),
        }
    };
    if epochs_after != epochs_before {
        outcome.problems.push(format!(
            "broker registrations changed across controller failovers: {epochs_before:?} -> {epochs_after:?}"
        ));
    }
    let leaders_after = partition_leaders(cluster).await?;
    if leaders_after != leaders_before {
        outcome.problems.push(format!(
            "leadership moved across controller failovers: {leaders_before:?} -> {leaders_after:?}"
        ));
    }
    Ok(())
}

/// (leader, leader epoch) of every partition of the topic.
async fn partition_leaders(cluster: &Cluster) -> anyhow::Result<Vec<(i32, i32)>> {
    let admin = cluster.admin().await?;
    let metadata = admin.metadata().await?;
    let topic = metadata.topic(TOPIC).context("topic metadata")?;
    Ok(topic
        .partitions
        .iter()
        .map(|p| (p.leader, p.leader_epoch))
        .collect())
}

/// Mounts a 128 MiB tmpfs at `dir`, to be filled by the full-disk nemesis.
fn mount_small_tmpfs(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=128m", "tmpfs"])
        .arg(dir)
        .status()
        .context("running mount")?;
    if !status.success() {
        bail!("mounting a tmpfs at {} failed", dir.display());
    }
    Ok(())
}

/// Writes `path` until the file system is full.
fn fill_disk(path: &Path) -> anyhow::Result<()> {
    use std::io::Write;
    let mut file = std::fs::File::create(path)?;
    let chunk = vec![0u8; 1 << 20];
    loop {
        match file.write_all(&chunk) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(28) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}
