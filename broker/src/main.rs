//! `ringlog-broker`: the composition root of the broker binary and its tools.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use broker::log::verify::{verify_partition_dir, VerifyOptions};

#[derive(Parser, Debug)]
#[command(
    name = "ringlog-broker",
    version,
    about = "Ringlog broker and storage tools"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
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
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::VerifyLog { dir, print } => verify_log(dir, print),
    }
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
