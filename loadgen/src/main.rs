//! `ringlog-loadgen`: the composition root. Parses flags, builds the typed
//! configuration, and dispatches to `plan`, `run` or `verify`. It holds no
//! logic of its own beyond wiring and exit codes.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};

use loadgen::keys::KeySpec;
use loadgen::payload::PayloadKind;
use loadgen::pinning;
use loadgen::plan::{Plan, PlanInput};
use loadgen::report::render_latency_table;
use loadgen::report_dir::write_report_dir;
use loadgen::run_config::{parse_topic_config, Acks, Compression, RunConfig, RunFlags, Scenario};
use loadgen::units::{parse_bandwidth_bytes_per_s, parse_duration_ms, parse_size_bytes};
use loadgen::verify::{parse_history, verify};

/// Exit code when a run had failed or unaccounted sends.
const EXIT_RUN_FAILED: u8 = 3;
/// Threads of the run's tokio runtime: the reference machine has two cores,
/// shared with the broker.
const RUNTIME_THREADS: usize = 2;
/// Exit code when `verify` finds anomalies.
const EXIT_VERIFY_ANOMALIES: u8 = 1;
/// Exit code for a flag that parsed but failed validation (clap uses 2 too).
const EXIT_BAD_FLAG: u8 = 2;

/// Prints a validation error the way clap prints parse errors: one line, no backtrace.
fn bad_flag(error: impl std::fmt::Display) -> ExitCode {
    loadgen::say_err!("error: {error}");
    ExitCode::from(EXIT_BAD_FLAG)
}

#[derive(Debug, Parser)]
#[command(
    name = "ringlog-loadgen",
    version,
    about = "Open-loop load generator and capacity planner for Ringlog"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Capacity plan for a workload: bandwidths, retained bytes, brokers, partitions.
    Plan(PlanArgs),
    /// Drive an open-loop load against a cluster and write a report.
    Run(Box<RunArgs>),
    /// Check an acked/consumed history for lost, duplicated and reordered records.
    Verify(VerifyArgs),
    /// Read a topic back from its earliest offset (as a fresh consumer would
    /// after a restart) and check it against an acknowledged history.
    Readback(ReadbackArgs),
}

#[derive(Debug, Args)]
struct ReadbackArgs {
    /// Brokers to bootstrap from, HOST:PORT, comma-separated.
    #[arg(long, default_value = "127.0.0.1:9092")]
    bootstrap: String,
    #[arg(long, default_value = "loadgen")]
    topic: String,
    /// The run's payload kind: random or json.
    #[arg(long, default_value = "random")]
    payload: PayloadKind,
    /// Write what was read as `partition offset value_id` lines here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// An acknowledged history (acked.txt of a run with --history-dir) to
    /// check the read-back against.
    #[arg(long)]
    acked: Option<PathBuf>,
    /// Give up after this long: 60s, 5m.
    #[arg(long, default_value = "60s", value_parser = parse_duration_ms)]
    timeout: u64,
}

#[derive(Debug, Args)]
struct PlanArgs {
    /// Messages per second produced.
    #[arg(long)]
    rate: u64,
    /// Message size: 500, 1KB (1000 B), 1KiB (1024 B).
    #[arg(long, value_parser = parse_size_bytes)]
    message_size: u64,
    /// Retention: 7d, 12h, 604800s.
    #[arg(long, value_parser = parse_duration_ms)]
    retention: u64,
    #[arg(long, default_value_t = 3)]
    replication_factor: u32,
    /// Usable disk per broker: 20TB (decimal) or 18TiB.
    #[arg(long, value_parser = parse_size_bytes)]
    disk_per_broker: u64,
    /// Spare capacity as a fraction: 0.1 is 10 %.
    #[arg(long, default_value_t = 0.1)]
    headroom: f64,
    /// Consumer groups each reading the whole stream.
    #[arg(long, default_value_t = 1)]
    consumer_groups: u32,
    /// Messages per second one consumer handles.
    #[arg(long, default_value_t = 5_000)]
    per_consumer_rate: u64,
    /// NIC bandwidth per direction: 10Gbps or 1.25GB/s.
    #[arg(long, default_value = "10Gbps", value_parser = parse_bandwidth_bytes_per_s)]
    nic_bandwidth: f64,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Brokers to bootstrap from, HOST:PORT, comma-separated [default: 127.0.0.1:9092].
    #[arg(long)]
    bootstrap: Option<String>,
    /// Topic to create or use [default: loadgen].
    #[arg(long)]
    topic: Option<String>,
    /// Partitions of the topic [default: 16].
    #[arg(long)]
    partitions: Option<u32>,
    /// Replication factor of the topic [default: 3].
    #[arg(long)]
    replication_factor: Option<u32>,
    /// Message size: 500, 1KB, 1KiB [default: 500].
    #[arg(long, value_parser = parse_size_bytes)]
    message_size: Option<u64>,
    /// Total offered rate in msgs/s; 0 = as fast as possible [default: 10000].
    #[arg(long)]
    rate: Option<u64>,
    /// Measured duration: 60s, 5m [default: 60s].
    #[arg(long, value_parser = parse_duration_ms)]
    duration: Option<u64>,
    /// Unmeasured warmup before it [default: 5s].
    #[arg(long, value_parser = parse_duration_ms)]
    warmup: Option<u64>,
    /// Producer workers [default: 1].
    #[arg(long)]
    producers: Option<u32>,
    /// Consumer workers, one group; 0 = produce only. With
    /// --consumer-group: the members of each group [default: 1].
    #[arg(long)]
    consumers: Option<u32>,
    /// Consume through consumer groups with this group id (the id prefix
    /// with several groups: NAME-0, NAME-1, ...). Members start at the log
    /// end once every group is stable, auto-commit every second, and
    /// commit and leave at the end. Without it, consumers split the
    /// partitions among themselves and commit nothing.
    #[arg(long)]
    consumer_group: Option<String>,
    /// How many groups read the whole topic (1..=16) [default: 1]: with
    /// --consumer-group, each of --consumers members; without, each of
    /// --consumers of the load generator's own splitting the partitions.
    #[arg(long)]
    consumer_groups: Option<u32>,
    /// 0, 1 or all [default: all].
    #[arg(long)]
    acks: Option<Acks>,
    /// true or false: producers take a producer id and number their
    /// batches, so a retried batch is appended once [default: true; off
    /// with --acks 0].
    #[arg(long)]
    idempotence: Option<bool>,
    /// Write in transactions committed every this many milliseconds, each
    /// producer with its own transactional id over every partition;
    /// consumers read committed records only. Needs --acks all
    /// (10..=30000) [default: 0, off].
    #[arg(long)]
    transaction_ms: Option<u64>,
    /// Pin the load generator's worker threads, one each in turn, to these
    /// CPUs: 1, 0,2, 2-3 [default: unpinned, placed by the scheduler].
    #[arg(long, value_parser = parse_cpu_list)]
    cpus: Option<CpuList>,
    /// Producer batch bound: 64KiB [default: 64KiB].
    #[arg(long, value_parser = parse_size_bytes)]
    batch_bytes: Option<u64>,
    /// Producer linger in milliseconds [default: 5].
    #[arg(long)]
    linger_ms: Option<u64>,
    /// none or zstd [default: none].
    #[arg(long)]
    compression: Option<Compression>,
    /// none, uniform:N or zipf:N:S [default: none].
    #[arg(long)]
    keys: Option<KeySpec>,
    /// random or json [default: random].
    #[arg(long)]
    payload: Option<PayloadKind>,
    /// Where result.json, *.hgrm and report.html go [default: loadgen-report].
    #[arg(long)]
    report_dir: Option<PathBuf>,
    /// Seed for keys and payloads [default: from the clock, reported].
    #[arg(long)]
    seed: Option<u64>,
    /// Preset: 1m-500b (1M msgs/s of 500 B for 30 s), max-rate (searches the
    /// highest rate producers sustain), many-partitions (1M msgs/s over
    /// 10 000 partitions), catch-up (three readers of a 20 GB backlog while
    /// producers write 500k msgs/s) or rf3-acks-all (three brokers, RF 3,
    /// acks=all, as scripts/cluster.sh starts them); flags override it.
    #[arg(long)]
    scenario: Option<Scenario>,
    /// Record the acked/consumed history and check it at the end.
    #[arg(long)]
    verify: bool,
    /// Consumers start reading when the warmup ends, from where the run
    /// began: the warmup writes the backlog they catch up on.
    #[arg(long)]
    catch_up: bool,
    /// Retry a batch that failed with a retriable error for this long: 2m,
    /// 30s; 0 sends each batch once [default: 2m].
    #[arg(long, value_parser = parse_duration_ms)]
    delivery_timeout: Option<u64>,
    /// A config of the topic when the run creates it, key=value; repeatable.
    #[arg(long = "topic-config", value_parser = parse_topic_config)]
    topic_configs: Vec<(String, String)>,
    /// With --verify: write acked.txt and consumed.txt here.
    #[arg(long)]
    history_dir: Option<PathBuf>,
}

impl RunArgs {
    fn into_flags(self) -> RunFlags {
        RunFlags {
            bootstrap: self.bootstrap,
            topic: self.topic,
            partitions: self.partitions,
            replication_factor: self.replication_factor,
            message_size_bytes: self.message_size,
            rate_msgs_per_s: self.rate,
            duration_ms: self.duration,
            warmup_ms: self.warmup,
            producers: self.producers,
            consumers: self.consumers,
            acks: self.acks,
            batch_bytes: self.batch_bytes,
            linger_ms: self.linger_ms,
            compression: self.compression,
            keys: self.keys,
            payload: self.payload,
            report_dir: self.report_dir,
            seed: self.seed,
            scenario: self.scenario,
            verify: self.verify,
            catch_up: self.catch_up,
            delivery_timeout_ms: self.delivery_timeout,
            topic_configs: self.topic_configs,
            history_dir: self.history_dir,
            consumer_group: self.consumer_group,
            consumer_groups: self.consumer_groups,
            idempotence: self.idempotence,
            transaction_ms: self.transaction_ms,
            cpus: self.cpus.map(|list| list.0).unwrap_or_default(),
        }
    }
}

#[derive(Debug, Args)]
struct VerifyArgs {
    /// Acknowledged records: one `partition offset value_id` per line.
    #[arg(long)]
    acked: PathBuf,
    /// Consumed records, same format.
    #[arg(long)]
    consumed: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    match cli.command {
        Command::Plan(args) => plan(args),
        Command::Run(args) => run(*args),
        Command::Verify(args) => verify_command(args),
        Command::Readback(args) => readback_command(args),
    }
}

fn plan(args: PlanArgs) -> anyhow::Result<ExitCode> {
    let input = PlanInput {
        rate_msgs_per_s: args.rate,
        message_size_bytes: args.message_size,
        retention_ms: args.retention,
        replication_factor: args.replication_factor,
        disk_per_broker_bytes: args.disk_per_broker,
        headroom_fraction: args.headroom,
        consumer_groups: args.consumer_groups,
        per_consumer_rate_msgs_per_s: args.per_consumer_rate,
        nic_bandwidth_bytes_per_s: args.nic_bandwidth,
    };
    let plan = match Plan::compute(&input) {
        Ok(plan) => plan,
        Err(error) => return Ok(bad_flag(error)),
    };
    if args.json {
        loadgen::say!("{}", serde_json::to_string_pretty(&plan)?);
    } else {
        loadgen::say_part!("{}", plan.render_text());
    }
    Ok(ExitCode::SUCCESS)
}

fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let seed_fallback = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .context("system clock before 1970")?
        .as_nanos() as u64;
    let config = match RunConfig::resolve(args.into_flags(), seed_fallback) {
        Ok(config) => config,
        Err(error) => return Ok(bad_flag(error)),
    };
    loadgen::say_err!(
        "resolved run configuration:\n{}",
        serde_json::to_string_pretty(&config)?
    );
    if let Err(error) = pinning::check_allowed(&config.cpus, &pinning::allowed_cpus()) {
        return Ok(bad_flag(error));
    }
    let report_dir = config.report_dir.clone();
    let partitions = config.partitions;
    let workload = config.workload_parameters();
    let threads = std::env::var("RINGLOG_LOADGEN_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(RUNTIME_THREADS);
    if config.scenario == Some(Scenario::MaxRate) {
        return run_max_rate(config, threads);
    }
    let outcome = loadgen::driver::run_blocking(config, threads)?;
    loadgen::say!("\n{}", render_latency_table(outcome.recorder.aggregate()));
    let counters = outcome.recorder.all_counters();
    loadgen::say!(
        "published {} acked {} errors {} consumed {} unsent {}",
        counters.published_messages,
        counters.acked_messages,
        counters.errors,
        counters.consumed_messages,
        counters.unsent_messages
    );
    loadgen::say!(
        "longest partition unavailability {} ms · batches retried {} · fetch errors ridden through {}",
        outcome.longest_ack_gap_ms, outcome.retried_batches, outcome.fetch_errors
    );
    if let Some(cpu) = outcome.recorder.cpu() {
        loadgen::say!(
            "cpu over the measured seconds: load generator {:.2} cores, everything else {:.2} (the broker, on a host running nothing else), taken by the hypervisor {:.2}, of {}",
            cpu.loadgen_cores, cpu.other_cores, cpu.stolen_cores, cpu.machine_cores
        );
    }
    loadgen::say!(
        "load generator threads: {}",
        describe_pinning(&workload.loadgen_cpus, threads)
    );
    for group in &outcome.groups {
        loadgen::say!("{}", group.render_line(partitions));
    }
    let files = write_report_dir(&report_dir, &workload, &outcome.recorder)?;
    for file in &files {
        loadgen::say!("wrote {}", file.display());
    }
    loadgen::say!("report directory: {}", report_dir.display());
    let unaccounted = counters
        .published_messages
        .saturating_sub(counters.acked_messages + counters.errors);
    if unaccounted > 0 {
        loadgen::say_err!("{unaccounted} sends were neither acknowledged nor failed");
        return Ok(ExitCode::from(EXIT_RUN_FAILED));
    }
    for group in &outcome.groups {
        if let Some(report) = &group.verify {
            loadgen::say_part!("group {}: {}", group.group_id, report.render_text());
        }
    }
    if let Some(report) = outcome.verify {
        if !outcome.groups.is_empty() {
            loadgen::say_part!("all {} groups: ", outcome.groups.len());
        }
        loadgen::say_part!("{}", report.render_text());
        if !report.is_clean() {
            return Ok(ExitCode::from(EXIT_VERIFY_ANOMALIES));
        }
    }
    Ok(if counters.errors == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_RUN_FAILED)
    })
}

/// Pause between two steps, so a step that overloaded the cluster does not
/// leave its backlog (unwritten tails, retention) to the next one.
const MAX_RATE_STEP_PAUSE_MS: u64 = 3_000;

/// `--scenario max-rate`: one whole run per step (`loadgen::max_rate`
/// decides the rates), each step's report in `REPORT_DIR/step-N-RATE`, and
/// the steps with the rate found in `REPORT_DIR/max-rate.json`.
fn run_max_rate(config: RunConfig, threads: usize) -> anyhow::Result<ExitCode> {
    use loadgen::histograms::LatencyKind;
    use loadgen::max_rate::{Search, StepResult, STEP_RATE_MSGS_PER_S_MAX};

    if !(1..=STEP_RATE_MSGS_PER_S_MAX).contains(&config.rate_msgs_per_s) {
        return Ok(bad_flag(format!(
            "--scenario max-rate starts at --rate, which must be within 1..={STEP_RATE_MSGS_PER_S_MAX}"
        )));
    }
    let mut search = Search::new(config.rate_msgs_per_s, STEP_RATE_MSGS_PER_S_MAX);
    let base_dir = config.report_dir.clone();
    while let Some(rate) = search.next_rate() {
        let index = search.steps().len();
        if index > 0 {
            std::thread::sleep(std::time::Duration::from_millis(MAX_RATE_STEP_PAUSE_MS));
        }
        let mut step = config.clone();
        step.rate_msgs_per_s = rate;
        step.report_dir = base_dir.join(format!("step-{index}-{rate}"));
        loadgen::say_err!("max-rate step {index}: offering {rate} msgs/s");
        let outcome = loadgen::driver::run_blocking(step.clone(), threads)?;
        write_report_dir(
            &step.report_dir,
            &step.workload_parameters(),
            &outcome.recorder,
        )?;
        let histograms = outcome.recorder.aggregate();
        // The rate over the measured seconds up to the end of sending (not
        // the drain after it); a second in which a stalled generator sent
        // nothing still counts.
        let sending_end_s = (step.warmup_ms + step.duration_ms) as f64 / 1000.0;
        let (sent, sending_s) = outcome
            .recorder
            .series()
            .iter()
            .filter(|i| i.elapsed_s - i.duration_s < sending_end_s)
            .fold((0.0, 0.0), |(sent, s), i| {
                (
                    sent + i.publish_rate_msgs_per_s * i.duration_s,
                    s + i.duration_s,
                )
            });
        // Sent on schedule over the measured window; every one of them must
        // also be acknowledged by the end of the run (no errors, none
        // unaccounted).
        let all = outcome.recorder.all_counters();
        let unacked = all.published_messages - all.acked_messages.min(all.published_messages);
        let result = StepResult::judge(
            rate,
            if sending_s > 0.0 {
                sent / sending_s
            } else {
                0.0
            },
            histograms.summary(LatencyKind::Publish).p99_ms,
            histograms.summary(LatencyKind::PublishDelay).p99_ms,
            all.errors + unacked,
        );
        loadgen::say!(
            "step {index}: offered {rate} msgs/s, sent {:.0} msgs/s, publish p99 {:.2} ms, publish delay p99 {:.2} ms, errors or unacknowledged {}: {}",
            result.sent_msgs_per_s,
            result.publish_p99_ms,
            result.publish_delay_p99_ms,
            result.errors,
            if result.held { "held" } else { "not held" }
        );
        search.record(result);
    }
    let summary = serde_json::json!({
        "scenario": "max-rate",
        "message_size_bytes": config.message_size_bytes,
        "acks": config.acks,
        "partitions": config.partitions,
        "step_duration_ms": config.duration_ms,
        "publish_delay_p99_ms_max": loadgen::max_rate::STEP_PUBLISH_DELAY_P99_MS_MAX,
        "acked_fraction_min": loadgen::max_rate::STEP_ACKED_FRACTION_MIN,
        "max_rate_msgs_per_s": search.best(),
        "truncated_by_step_bound": search.truncated(),
        "steps": search.steps(),
    });
    std::fs::create_dir_all(&base_dir)
        .with_context(|| format!("creating {}", base_dir.display()))?;
    let path = base_dir.join("max-rate.json");
    std::fs::write(&path, serde_json::to_string_pretty(&summary)?)
        .with_context(|| format!("writing {}", path.display()))?;
    match search.best() {
        Some(best) => loadgen::say!(
            "max sustainable rate: {}{best} msgs/s ({:.0} MB/s of {} B messages)",
            if search.truncated() {
                "at least (the step bound ended the search) "
            } else {
                ""
            },
            best as f64 * config.message_size_bytes as f64 / 1e6,
            config.message_size_bytes
        ),
        None => loadgen::say!("no step held"),
    }
    loadgen::say!("wrote {}", path.display());
    Ok(if search.best().is_some() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_RUN_FAILED)
    })
}

fn verify_command(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let read = |path: &PathBuf| -> anyhow::Result<_> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        parse_history(&text).with_context(|| format!("parsing {}", path.display()))
    };
    let acked = read(&args.acked)?;
    let consumed = read(&args.consumed)?;
    let report = verify(&acked, &consumed);
    if args.json {
        loadgen::say!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        loadgen::say_part!("{}", report.render_text());
    }
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_VERIFY_ANOMALIES)
    })
}

/// `--cpus` as one value (clap would take a bare `Vec` for a repeated flag).
#[derive(Debug, Clone)]
struct CpuList(Vec<usize>);

fn parse_cpu_list(list: &str) -> Result<CpuList, String> {
    pinning::parse_cpus(list)
        .map(CpuList)
        .map_err(|e| e.to_string())
}

fn describe_pinning(cpus: &[usize], threads: usize) -> String {
    if cpus.is_empty() {
        return format!(
            "{threads} workers placed by the scheduler on CPUs {:?}",
            pinning::allowed_cpus()
        );
    }
    let each: Vec<String> = (0..threads)
        .filter_map(|i| pinning::worker_cpu(cpus, i).map(|cpu| format!("worker {i} on CPU {cpu}")))
        .collect();
    each.join(", ")
}

fn readback_command(args: ReadbackArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(RUNTIME_THREADS)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let read = runtime.block_on(loadgen::readback::read_back(
        &args.bootstrap,
        &args.topic,
        args.payload,
        std::time::Duration::from_millis(args.timeout),
    ))?;
    loadgen::say!("read back {} records of {}", read.len(), args.topic);
    if let Some(out) = &args.out {
        let dir = out.parent().unwrap_or(std::path::Path::new("."));
        let name = out
            .file_name()
            .context("--out names a file")?
            .to_string_lossy()
            .into_owned();
        loadgen::driver::write_history(dir, &name, &read)?;
    }
    let Some(acked) = &args.acked else {
        return Ok(ExitCode::SUCCESS);
    };
    let text =
        std::fs::read_to_string(acked).with_context(|| format!("reading {}", acked.display()))?;
    let acked = parse_history(&text).with_context(|| format!("parsing {}", acked.display()))?;
    let report = verify(&acked, &read);
    loadgen::say_part!("{}", report.render_text());
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_VERIFY_ANOMALIES)
    })
}
