//! Ringlog's deterministic simulator. One thread runs several brokers and
//! the controller on simulated time, disk and network, driven by a seed:
//! messages are delayed, lost, duplicated and reordered, links and brokers
//! are cut off, processes are killed (losing what they had not synced, with
//! torn tails), the controller quorum goes away, clocks jump and disks stall.
//! Producers (acks=0, 1, all) and consumers run throughout, and a checker
//! looks at the whole system after every event. A failing seed prints the
//! violation, the trace leading to it, and the command that replays it.
//!
//! What runs is the product's own code: the controller's `ClusterState` and
//! its codec, the broker's metadata view and reconcile, and each replica's
//! replication state machine (`ReplicaCore`). Only the order in which the
//! shard drives them is mirrored here (`broker`), and Raft is one
//! linearizable copy.
//!
//! The storage simulation (`storage`) goes further down: the broker's
//! `PartitionLog` itself runs as async tasks on the runtime's deterministic
//! executor and simulated disk, through kill -9 and power losses. The shard
//! simulation (`shard`) runs a whole real `Shard` behind the runtime's
//! simulated network with wire-protocol clients, and the replicated one
//! (`replicated`) three real brokers replicating to each other under a
//! simulated controller that speaks the real control protocol
//! (`control_server`).

pub mod broker;
pub mod checker;
pub mod client;
pub mod control_server;
pub mod controller;
pub mod disk;
pub mod msg;
pub mod replicated;
pub mod rng;
pub mod shard;
pub mod storage;
pub mod tagged;
pub mod world;

use ::broker::log::shard_journal::ShardJournal;
pub use world::{Failure, Options, Report};

/// Runs `run` in a fresh directory, removed afterwards (unless
/// `SIM_KEEP_SCRATCH` is set). Its name is unique
/// in the process too, since tests run seeds (sometimes the same one) on
/// several threads at once.
fn in_scratch_dir<T>(kind: &str, seed: u64, run: impl FnOnce(&std::path::Path) -> T) -> T {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let number = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let root = std::env::temp_dir().join(format!(
        "ringlog-sim-{kind}-{}-{seed}-{number}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).expect("temp dir");
    let result = run(&root);
    // `SIM_KEEP_SCRATCH=1` keeps the files of a run (data directories as the
    // run left them) for a look after a failure.
    if std::env::var_os("SIM_KEEP_SCRATCH").is_some() {
        eprintln!("kept {}", root.display());
    } else {
        let _ = std::fs::remove_dir_all(&root);
    }
    result
}

/// `verify-log` on one partition directory: its first problem, if any.
fn verify_log(dir: &std::path::Path) -> Option<String> {
    use ::broker::log::verify::{verify_partition_dir, VerifyOptions};
    let report = ::broker::runtime::run_local(verify_partition_dir(
        dir,
        VerifyOptions::default(),
        &mut std::io::sink(),
    ))
    .expect("verify runs");
    report.first_problem().map(|problem| format!("{problem:?}"))
}

/// What a broker's start does before any log opens (`server::run`): the
/// shard journals' records under `data_dir` go back into their segment
/// files, synced through `std::fs` (which `disk` is told of), and the rings
/// are emptied.
fn replay_journals_at_start(
    data_dir: &std::path::Path,
    disk: &::broker::runtime::sim::SimDisk,
) -> Result<::broker::log::journal_replay::ReplayReport, String> {
    let report =
        ::broker::log::journal_replay::replay_journals(data_dir).map_err(|e| e.to_string())?;
    let log_dirs = report
        .logs
        .iter()
        .map(|log| data_dir.join("topics").join(log));
    for synced in report.files.iter().cloned().chain(log_dirs) {
        disk.synced_outside(&synced)
            .map_err(|e| format!("{}: {e}", synced.display()))?;
    }
    Ok(report)
}

/// The shard journal of a simulated broker's shard, opened and attached
/// as `server::run_shard` does when `journal_ring_bytes_per_shard` is set
/// (`None` when it is 0), with a guard that hands its rounds to
/// `add_rounds` when the process's tasks end.
async fn attach_shard_journal(
    config: &::broker::config::BrokerConfig,
    shard: &mut ::broker::shard::Shard,
    add_rounds: Box<dyn Fn(u64)>,
) -> Result<Option<(std::rc::Rc<ShardJournal>, CountJournalRounds)>, String> {
    let ring_bytes = config.journal_ring_bytes_per_shard;
    if ring_bytes == 0 {
        return Ok(None);
    }
    let dir = config
        .data_dir
        .join(::broker::log::journal_replay::JOURNAL_DIR);
    let journal = ShardJournal::open(&dir, "shard-0", ring_bytes)
        .await
        .map_err(|e| format!("opening the journal in {}: {e}", dir.display()))?;
    shard.use_journal(journal.clone());
    let counted = CountJournalRounds {
        journal: journal.clone(),
        add: add_rounds,
    };
    Ok(Some((journal, counted)))
}

/// Hands the rounds a simulated process's shard journal wrote to `add`
/// when the process's tasks end, killed (dropped) or closed.
struct CountJournalRounds {
    journal: std::rc::Rc<ShardJournal>,
    add: Box<dyn Fn(u64)>,
}

impl Drop for CountJournalRounds {
    fn drop(&mut self) {
        (self.add)(self.journal.stats().rounds);
    }
}

/// A number for one choice of a seed (`what` names the choice): each choice
/// gets bits of its own, so neighbouring seeds and lives do not make
/// neighbouring choices (splitmix64 of the pair).
pub fn draw(seed: u64, what: u64) -> u64 {
    let mut z = seed ^ what.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Runs one seed.
pub fn run(seed: u64, options: &Options) -> Result<Report, Failure> {
    world::World::new(seed, options.clone()).run()
}
