//! `ringlog-chaos`: runs the fault scenarios against the built binaries and
//! prints (and writes) the results table. With `--duration` longer than one
//! pass, the scenarios run again in turn until the time is used: the soak
//! form. Exits 1 if any scenario found a broken promise.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chaos::cluster::Binaries;
use chaos::report::{details, markdown};
use chaos::scenario::{run, Nemesis, Settings};
use clap::Parser;
use loadgen::units::parse_duration_ms;

#[derive(Debug, Parser)]
#[command(name = "ringlog-chaos", about = "Ringlog's fault suite")]
struct Cli {
    /// Directory holding ringlog-broker and ringlog-controller [default:
    /// this executable's directory].
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Where clusters keep their data and logs [default: target/chaos].
    #[arg(long, default_value = "target/chaos")]
    work_dir: PathBuf,
    /// Scenarios to run, comma-separated [default: all].
    #[arg(long, value_delimiter = ',')]
    scenarios: Vec<Nemesis>,
    /// Load per scenario: 20s, 2m.
    #[arg(long, default_value = "20s", value_parser = parse_duration_ms)]
    load: u64,
    /// Offered rate of the replicated scenarios, msgs/s of 500 B.
    #[arg(long, default_value_t = 2_000)]
    rate: u64,
    /// Keep running the scenarios in turn for this long (soak): 30m, 2h.
    #[arg(long, value_parser = parse_duration_ms)]
    duration: Option<u64>,
    /// Write the Markdown table here too.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    let bin_dir = match cli.bin_dir {
        Some(dir) => dir,
        None => std::env::current_exe()?
            .parent()
            .context("executable directory")?
            .to_path_buf(),
    };
    let settings = Settings {
        binaries: Binaries::in_dir(&bin_dir),
        work_dir: cli.work_dir,
        load_ms: cli.load,
        rate_msgs_per_s: cli.rate,
    };
    let scenarios = if cli.scenarios.is_empty() {
        Nemesis::ALL.to_vec()
    } else {
        cli.scenarios
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let started = Instant::now();
    let until = cli.duration.map(|ms| started + Duration::from_millis(ms));
    let mut outcomes = Vec::new();
    loop {
        for &nemesis in &scenarios {
            eprintln!("== scenario {}", nemesis.name());
            let outcome = runtime.block_on(run(nemesis, &settings));
            eprintln!("{}", markdown(std::slice::from_ref(&outcome)));
            outcomes.push(outcome);
        }
        if until.is_none_or(|t| Instant::now() >= t) {
            break;
        }
    }
    let table = markdown(&outcomes);
    println!("{table}");
    let failed = details(&outcomes);
    print!("{failed}");
    if let Some(path) = &cli.report {
        std::fs::write(path, format!("{table}\n{failed}"))?;
    }
    if let Some(path) = &cli.json {
        std::fs::write(path, serde_json::to_string_pretty(&outcomes)?)?;
    }
    Ok(if outcomes.iter().all(|o| o.passed()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
