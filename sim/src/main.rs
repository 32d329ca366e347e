//! `ringlog-sim`: runs seeds of the deterministic simulator. A range of
//! seeds for soak testing (`--seeds N --first S`), or one seed with its full
//! trace to replay a failure (`--seed S --trace`). `--storage` runs the
//! storage simulation (the real partition log on the deterministic runtime)
//! and `--shard` the shard simulation (the real shard behind the simulated
//! network) instead of the cluster one.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::Parser;

static CURRENT_SEED: AtomicU64 = AtomicU64::new(0);
/// The mode flag a replay needs ("--storage ", "--shard " or none).
static MODE: std::sync::Mutex<&str> = std::sync::Mutex::new("");

#[derive(Parser, Debug)]
#[command(name = "ringlog-sim", about = "Ringlog's deterministic simulator")]
struct Args {
    /// Replay this one seed.
    #[arg(long)]
    seed: Option<u64>,
    /// How many seeds to run (from --first).
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    #[arg(long, default_value_t = 0)]
    first: u64,
    /// Print every event.
    #[arg(long)]
    trace: bool,
    /// Simulated milliseconds of faults per seed (cluster simulation).
    #[arg(long, default_value_t = 20_000)]
    chaos_ms: u64,
    /// Simulated milliseconds after healing, before the final checks (cluster
    /// simulation).
    #[arg(long, default_value_t = 15_000)]
    settle_ms: u64,
    /// Brokers of the cluster simulation (the replicated one has three).
    #[arg(long, default_value_t = 3)]
    brokers: u32,
    /// Partitions of the topic (default: the mode's own, 2 for the cluster
    /// simulation, 3 for the shard and replicated ones).
    #[arg(long)]
    partitions: Option<u32>,
    /// Stop at the first failing seed.
    #[arg(long)]
    fail_fast: bool,
    /// Run the storage simulation: the broker's partition log on the
    /// deterministic runtime, through kill -9 and power losses.
    #[arg(long)]
    storage: bool,
    /// Run the shard simulation: the broker's shard end to end (listener,
    /// connections, handlers, replicas, log) behind the simulated network,
    /// with wire-protocol clients, through kill -9 and power losses.
    #[arg(long, conflicts_with = "storage")]
    shard: bool,
    /// Run the replicated simulation: three real brokers replicating over
    /// the simulated network under a simulated controller, through kill -9
    /// of one broker at a time, then of all of them (often with a power
    /// loss), read back from the restarted cluster.
    #[arg(long, conflicts_with_all = ["storage", "shard"])]
    replicated: bool,
    /// Shard simulation: simulated milliseconds the last life runs its
    /// workload before closing cleanly (long lives keep long connections).
    #[arg(long, default_value_t = 1_500)]
    last_life_ms: u64,
    /// Shard simulation: cut the power under every flush policy (the
    /// checker's self-test: acknowledged records may then be lost).
    #[arg(long)]
    power_loss_under_any_policy: bool,
    /// Replicated simulation: send acks=all batches with acks=1 but count
    /// them as acks=all (the checker's self-test: failovers lose some).
    #[arg(long)]
    acks_all_sent_as_acks_one: bool,
    /// Replicated simulation: leave one broker down once the faults end
    /// (the checker's self-test: the quiet period's checks fail).
    #[arg(long)]
    leave_a_broker_down: bool,
    /// Replicated simulation: instead of drawn faults, brokers cut off from
    /// the others while every wall clock jumps five minutes back, then
    /// forward.
    #[arg(long)]
    wall_clock_jumps_during_cuts: bool,
    /// Replicated simulation: instead of drawn faults, a broker fenced while
    /// it still fetches, then another cut off from the brokers.
    #[arg(long)]
    fenced_follower_during_cut: bool,
}

fn main() -> ExitCode {
    // The product's own log lines, when asked for (`RUST_LOG=info`): they
    // come in simulated order, with wall-clock stamps.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let args = Args::parse();
    let options = sim::Options {
        brokers: args.brokers,
        partitions: args
            .partitions
            .unwrap_or(sim::Options::default().partitions),
        chaos_ms: args.chaos_ms,
        settle_ms: args.settle_ms,
        trace: args.trace,
        ..sim::Options::default()
    };
    let seeds: Vec<u64> = match args.seed {
        Some(seed) => vec![seed],
        None => (args.first..args.first + args.seeds).collect(),
    };
    // A panic (an assertion of the product's own code) aborts the process;
    // say which seed it was first.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let seed = CURRENT_SEED.load(Ordering::Relaxed);
        let mode = *MODE.lock().unwrap_or_else(|e| e.into_inner());
        eprintln!("seed {seed} panicked; replay: cargo run --release -p sim --bin ringlog-sim -- {mode}--seed {seed} --trace");
        default_hook(info);
    }));
    if args.storage {
        *MODE.lock().expect("not poisoned") = "--storage ";
        return run_storage(&args, seeds);
    }
    if args.shard {
        *MODE.lock().expect("not poisoned") = "--shard ";
        return run_shard(&args, seeds);
    }
    if args.replicated {
        *MODE.lock().expect("not poisoned") = "--replicated ";
        return run_replicated(&args, seeds);
    }
    let started = Instant::now();
    let (mut acked_all, mut committed, mut events) = (0u64, 0u64, 0u64);
    let (passed, failed) = run_seeds(
        &args,
        seeds,
        |seed| sim::run(seed, &options),
        |report| {
            acked_all += report.acked_all;
            committed += report.committed;
            events += report.events;
        },
    );
    println!(
        "{passed} seeds passed, {} failed {:?}; {acked_all} acks=all records acknowledged, {committed} committed, {events} events in {:.1} s",
        failed.len(),
        failed,
        started.elapsed().as_secs_f64()
    );
    exit_code(&failed)
}

/// Runs each seed in turn (a failure is printed; `--fail-fast` stops at the
/// first), adding each passing seed's report with `add`; returns how many
/// passed and which failed.
fn run_seeds<R: std::fmt::Debug, E: std::fmt::Display>(
    args: &Args,
    seeds: Vec<u64>,
    run: impl Fn(u64) -> Result<R, E>,
    mut add: impl FnMut(&R),
) -> (u64, Vec<u64>) {
    let (mut passed, mut failed) = (0u64, Vec::new());
    for seed in seeds {
        CURRENT_SEED.store(seed, Ordering::Relaxed);
        match run(seed) {
            Ok(report) => {
                passed += 1;
                add(&report);
                if args.seed.is_some() {
                    println!("{report:?}");
                }
            }
            Err(failure) => {
                eprintln!("{failure}");
                failed.push(seed);
                if args.fail_fast {
                    break;
                }
            }
        }
    }
    (passed, failed)
}

fn exit_code(failed: &[u64]) -> ExitCode {
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn run_storage(args: &Args, seeds: Vec<u64>) -> ExitCode {
    let options = sim::storage::StorageOptions {
        trace: args.trace,
        ..Default::default()
    };
    let started = Instant::now();
    let mut total = sim::storage::StorageReport::default();
    let (passed, failed) = run_seeds(
        args,
        seeds,
        |seed| sim::storage::run(seed, &options),
        |report| {
            total.acked_batches += report.acked_batches;
            total.power_losses += report.power_losses;
            total.writes_torn += report.writes_torn;
            total.names_reverted += report.names_reverted;
            total.truncations += report.truncations;
            total.records_checked += report.records_checked;
            total.journal_commits += report.journal_commits;
            total.journal_writes_replayed += report.journal_writes_replayed;
        },
    );
    println!(
        "storage: {passed} seeds passed, {} failed {:?}; {} batches acknowledged, {} power losses ({} writes torn, {} directory entries undone or brought back), {} truncations, {} recovered records checked, {} journal commits, {} chunk images replayed from journals in {:.1} s",
        failed.len(),
        failed,
        total.acked_batches,
        total.power_losses,
        total.writes_torn,
        total.names_reverted,
        total.truncations,
        total.records_checked,
        total.journal_commits,
        total.journal_writes_replayed,
        started.elapsed().as_secs_f64()
    );
    exit_code(&failed)
}

fn run_shard(args: &Args, seeds: Vec<u64>) -> ExitCode {
    let default = sim::shard::ShardOptions::default();
    let options = sim::shard::ShardOptions {
        partitions: args.partitions.unwrap_or(default.partitions),
        last_life_ms: args.last_life_ms,
        power_loss_under_any_policy: args.power_loss_under_any_policy,
        trace: args.trace,
        ..default
    };
    let started = Instant::now();
    let mut total = sim::shard::ShardReport::default();
    let (passed, failed) = run_seeds(
        args,
        seeds,
        |seed| sim::shard::run(seed, &options),
        |report| {
            total.requests += report.requests;
            total.acked_batches += report.acked_batches;
            total.kills += report.kills;
            total.power_losses += report.power_losses;
            total.writes_torn += report.writes_torn;
            total.names_reverted += report.names_reverted;
            total.records_read_back += report.records_read_back;
            total.records_consumed += report.records_consumed;
            total.longest_connection_requests = total
                .longest_connection_requests
                .max(report.longest_connection_requests);
            total.journal_rounds += report.journal_rounds;
            total.journal_writes_replayed += report.journal_writes_replayed;
        },
    );
    println!(
        "shard: {passed} seeds passed, {} failed {:?}; {} produce requests, {} batches acknowledged, {} kills, {} power losses ({} writes torn, {} directory entries undone or brought back), {} journal rounds, {} chunk images replayed from the journal, {} records read back after restarts, {} consumed while tailing, at most {} requests on one connection, in {:.1} s",
        failed.len(),
        failed,
        total.requests,
        total.acked_batches,
        total.kills,
        total.power_losses,
        total.writes_torn,
        total.names_reverted,
        total.journal_rounds,
        total.journal_writes_replayed,
        total.records_read_back,
        total.records_consumed,
        total.longest_connection_requests,
        started.elapsed().as_secs_f64()
    );
    exit_code(&failed)
}

fn run_replicated(args: &Args, seeds: Vec<u64>) -> ExitCode {
    let default = sim::replicated::ReplicatedOptions::default();
    let options = sim::replicated::ReplicatedOptions {
        partitions: args.partitions.unwrap_or(default.partitions),
        acks_all_sent_as_acks_one: args.acks_all_sent_as_acks_one,
        leave_a_broker_down: args.leave_a_broker_down,
        wall_clock_jumps_during_cuts: args.wall_clock_jumps_during_cuts,
        fenced_follower_during_cut: args.fenced_follower_during_cut,
        trace: args.trace,
        ..default
    };
    let started = Instant::now();
    let mut total = sim::replicated::ReplicatedReport::default();
    let (passed, failed) = run_seeds(
        args,
        seeds,
        |seed| sim::replicated::run(seed, &options),
        |report| {
            total.requests += report.requests;
            total.acked_all += report.acked_all;
            total.acked_one += report.acked_one;
            total.refused += report.refused;
            total.kills += report.kills;
            total.link_faults += report.link_faults;
            total.pauses += report.pauses;
            total.slow_disks += report.slow_disks;
            total.clock_jumps += report.clock_jumps;
            total.connections_reset += report.connections_reset;
            total.quiet_answers += report.quiet_answers;
            total.power_losses += report.power_losses;
            total.writes_torn += report.writes_torn;
            total.records_read_back += report.records_read_back;
            total.records_consumed += report.records_consumed;
            total.journal_rounds += report.journal_rounds;
            total.journal_writes_replayed += report.journal_writes_replayed;
        },
    );
    println!(
        "replicated: {passed} seeds passed, {} failed {:?}; {} produce requests, {} acks=all and {} acks=1 batches acknowledged, {} refused, {} broker kills, {} brokers cut off, {} paused, {} slow disks, {} clock jumps, {} connections reset, {} power losses ({} writes torn), {} journal rounds, {} chunk images replayed from journals, {} answers in the quiet periods, {} records consumed during the faults, {} read back after the whole cluster restarted, in {:.1} s",
        failed.len(),
        failed,
        total.requests,
        total.acked_all,
        total.acked_one,
        total.refused,
        total.kills,
        total.link_faults,
        total.pauses,
        total.slow_disks,
        total.clock_jumps,
        total.connections_reset,
        total.power_losses,
        total.writes_torn,
        total.journal_rounds,
        total.journal_writes_replayed,
        total.quiet_answers,
        total.records_consumed,
        total.records_read_back,
        started.elapsed().as_secs_f64()
    );
    exit_code(&failed)
}
