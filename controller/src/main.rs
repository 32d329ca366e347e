//! `ringlog-controller`: the composition root of one controller process. Builds,
//! in order: config, logging, Raft node (stores, network), listener, API server,
//! fencing timer, bootstrap; waits for SIGTERM or SIGINT; then stops the server
//! and timer and shuts Raft down, in reverse.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use controller::config::{ControllerConfig, PartialConfig};
use controller::process;
use tokio::signal::unix::{signal, SignalKind};

/// Runs one controller of Ringlog's metadata quorum.
#[derive(Debug, Parser)]
#[command(name = "ringlog-controller")]
struct Flags {
    /// TOML file with any of the settings below (flags override it).
    #[arg(long)]
    config: Option<PathBuf>,
    /// This controller's Raft node id.
    #[arg(long)]
    node_id: Option<u64>,
    /// HOST:PORT to listen on (brokers, admin clients and peer controllers).
    #[arg(long)]
    listen: Option<String>,
    /// Initial voters including this node: ID=HOST:PORT,ID=HOST:PORT,...
    #[arg(long)]
    peers: Option<String>,
    /// Directory of the Raft log, vote and snapshot.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Broker session timeout in ms (default 3000).
    #[arg(long)]
    session_timeout_ms: Option<u64>,
    /// Raft heartbeat interval in ms (default 100).
    #[arg(long)]
    raft_heartbeat_interval_ms: Option<u64>,
    /// Lower end of the Raft election timeout in ms (default 500; upper is 2x).
    #[arg(long)]
    election_timeout_ms: Option<u64>,
}

fn load_config(flags: Flags) -> anyhow::Result<ControllerConfig> {
    let file = match &flags.config {
        Some(path) => PartialConfig::from_file(path)?,
        None => PartialConfig::default(),
    };
    let given = PartialConfig {
        node_id: flags.node_id,
        listen: flags.listen,
        peers: flags.peers,
        data_dir: flags.data_dir,
        session_timeout_ms: flags.session_timeout_ms,
        raft_heartbeat_interval_ms: flags.raft_heartbeat_interval_ms,
        election_timeout_ms: flags.election_timeout_ms,
    };
    Ok(ControllerConfig::validate(file.overlay(given))?)
}

fn main() -> anyhow::Result<()> {
    let config = load_config(Flags::parse())?;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,openraft=warn".into()),
        )
        .with_writer(|| LossyStderr)
        // A log redirected to a file stays plain text that grep can read.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // Metadata traffic is light: two workers are plenty and leave the cores to brokers.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("build tokio runtime")?;
    runtime.block_on(run(config))
}

async fn run(config: ControllerConfig) -> anyhow::Result<()> {
    let running = process::start(&config).await?;
    let mut terminate = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
    tokio::select! {
        _ = terminate.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = interrupt.recv() => tracing::info!("SIGINT: shutting down"),
    }
    running.stop().await
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
