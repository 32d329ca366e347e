//! `ringlog-broker`: the composition root of the broker binary and its tools.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use broker::config::{BrokerConfig, FileConfig};
use broker::log::verify::{verify_partition_dir, VerifyOptions};

#[derive(Parser, Debug)]
#[command(
    name = "ringlog-broker",
    version,
    about = "Ringlog broker and storage tools"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

/// Flags of a running broker; each overrides the same field of `--config`.
#[derive(clap::Args, Debug, Default)]
struct RunArgs {
    /// TOML config file (fields as in BrokerConfig).
    #[arg(long)]
    config: Option<PathBuf>,
    /// This broker's id.
    #[arg(long)]
    node_id: Option<i32>,
    /// Root of metadata and partition logs.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Main listener, HOST:PORT (default 127.0.0.1:9092); other ports derive from it.
    #[arg(long)]
    listen: Option<String>,
    /// Shards, one pinned per CPU from CPU 0 (default: all CPUs).
    #[arg(long)]
    cores: Option<usize>,
    /// First shard port (default: listen port + 1).
    #[arg(long)]
    shard_port_base: Option<u16>,
    /// Admin/metrics listener (default: listen host, port + 64).
    #[arg(long)]
    admin_listen: Option<String>,
    /// Host clients are told to connect to (default: the listen IP).
    #[arg(long)]
    advertised_host: Option<String>,
    /// Controller quorum endpoints, HOST:PORT,...: register with it and follow
    /// its metadata. Without it the broker runs its own one-voter controller.
    #[arg(long)]
    controller: Option<String>,
    /// Listener of the embedded controller (default: listen host, port + 65).
    #[arg(long)]
    embedded_controller_listen: Option<String>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Check a partition directory: every batch's CRC, offsets, epochs and
    /// records, and its index files. Exits 1 naming the first corruption.
    VerifyLog {
        /// The partition directory holding `*.log`, `*.index`, `*.timeindex`.
        dir: PathBuf,
        /// Print one line per batch.
        #[arg(long)]
        print: bool,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,openraft=warn".into()),
        )
        .with_writer(|| LossyStderr)
        // A log redirected to a file stays plain text that grep can read.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    match cli.command {
        Some(Command::VerifyLog { dir, print }) => verify_log(dir, print),
        None => run_broker(cli.run),
    }
}

fn run_broker(args: RunArgs) -> ExitCode {
    let file = match &args.config {
        Some(path) => match FileConfig::read(path) {
            Ok(file) => file,
            Err(e) => {
                complain(&e);
                return ExitCode::from(2);
            }
        },
        None => FileConfig::default(),
    };
    let overrides = FileConfig {
        node_id: args.node_id,
        data_dir: args.data_dir,
        listen: args.listen,
        cores: args.cores,
        shard_port_base: args.shard_port_base,
        admin_listen: args.admin_listen,
        advertised_host: args.advertised_host,
        controller: args.controller,
        embedded_controller_listen: args.embedded_controller_listen,
        ..FileConfig::default()
    };
    let config = match BrokerConfig::from_file_config(file.merge(overrides)) {
        Ok(config) => config,
        Err(e) => {
            complain(&e);
            return ExitCode::from(2);
        }
    };
    match broker::server::run(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            complain(&e);
            ExitCode::from(1)
        }
    }
}

/// Writes why the broker stops to standard error, if it can: a full log
/// disk must not turn an orderly failure exit into a crash (`eprintln!`
/// panics when the write fails, and panics abort).
fn complain(e: &dyn std::fmt::Display) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "ringlog-broker: {e}");
}

fn verify_log(dir: PathBuf, print: bool) -> ExitCode {
    let options = VerifyOptions {
        print,
        ..VerifyOptions::default()
    };
    let result = broker::runtime::run_local(async {
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        verify_partition_dir(&dir, options, &mut out).await
    });
    let report = match result {
        Ok(report) => report,
        Err(e) => {
            eprintln!("verify-log: cannot read {}: {e}", dir.display());
            return ExitCode::from(2);
        }
    };
    for path in &report.missing_indexes {
        println!(
            "note: {} is missing; the broker rebuilds it on open",
            path.display()
        );
    }
    println!(
        "{} segments, {} batches, {} records, {} valid bytes",
        report.segments, report.batches, report.records, report.bytes
    );
    match report.first_problem() {
        None => {
            println!("OK");
            ExitCode::SUCCESS
        }
        Some(first) => {
            for p in &report.problems {
                println!(
                    "CORRUPT {} at byte {}: {}",
                    p.file.display(),
                    p.position,
                    p.reason
                );
            }
            eprintln!(
                "verify-log: first corruption in {} at byte {}: {}",
                first.file.display(),
                first.position,
                first.reason
            );
            ExitCode::from(1)
        }
    }
}

/// Standard error that drops what it cannot write. The log file may sit on the
/// disk that just filled up; the logger must not take the process down with
/// it (tracing-subscriber reports a failed write with a print that panics).
struct LossyStderr;

impl std::io::Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::Write::write_all(&mut std::io::stderr(), buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::Write::flush(&mut std::io::stderr());
        Ok(())
    }
}
