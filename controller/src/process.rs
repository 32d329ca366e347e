//! One running controller: the composition shared by the `ringlog-controller`
//! binary and the one-voter controller a broker embeds when it is given no
//! quorum. Builds, in order: Raft node (stores, network), listener, API server,
//! fencing timer, bootstrap; stops them in reverse.

use std::net::SocketAddr;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::ControllerConfig;
use crate::service::ControllerService;
use crate::{fencer, node, server};

/// A started controller; `stop` shuts it down cleanly.
pub struct Running {
    pub service: ControllerService,
    pub listen: SocketAddr,
    node: node::Node,
    shutdown: watch::Sender<bool>,
    server_task: JoinHandle<()>,
    fencer_task: JoinHandle<()>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("listen", &self.listen)
            .finish_non_exhaustive()
    }
}

/// Starts the node, serves its listener and, if this node should, bootstraps
/// a new quorum. Must run inside a multi-threaded tokio runtime.
pub async fn start(config: &ControllerConfig) -> anyhow::Result<Running> {
    tracing::info!(node_id = config.node_id, listen = %config.listen, peers = ?config.peers, "starting controller");
    let node = node::start(config).await.context("start raft node")?;
    tracing::info!(recovery = ?node.recovery, "stores opened");
    let listener = TcpListener::bind(&config.listen)
        .await
        .with_context(|| format!("listen on {}", config.listen))?;
    let listen = listener.local_addr().context("listener address")?;
    let service = ControllerService::new(
        config.node_id,
        node.raft.clone(),
        node.state_machine.clone(),
        config.session_timeout_ms,
    );
    let (shutdown, shutdown_rx) = watch::channel(false);
    let server_task = tokio::spawn(server::serve(
        listener,
        service.clone(),
        shutdown_rx.clone(),
    ));
    let fencer_task = tokio::spawn(fencer::run(service.clone(), shutdown_rx));
    if node::bootstrap(&node, config).await.context("bootstrap")? {
        tracing::info!(voters = ?config.peers, "initialized a new quorum");
    }
    Ok(Running {
        service,
        listen,
        node,
        shutdown,
        server_task,
        fencer_task,
    })
}

impl Running {
    pub async fn stop(self) -> anyhow::Result<()> {
        // A metadata write waiting for room on a full disk would hold the
        // Raft core, and with it every task below, until the disk had room.
        self.node.state_machine.stop_waiting_for_room();
        self.shutdown.send_replace(true);
        self.fencer_task.await.context("fencer task")?;
        self.server_task.await.context("server task")?;
        drop(self.service);
        self.node
            .raft
            .shutdown()
            .await
            .map_err(|e| anyhow::anyhow!("raft shutdown: {e}"))?;
        tracing::info!("controller stopped");
        Ok(())
    }
}

/// A controller running on its own thread with its own small tokio runtime,
/// inside another process (a broker without a quorum of its own).
#[derive(Debug)]
pub struct Embedded {
    pub listen: SocketAddr,
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
}

impl Embedded {
    /// Starts the controller and returns once it listens (or failed to).
    pub fn spawn(config: ControllerConfig) -> anyhow::Result<Embedded> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<anyhow::Result<SocketAddr>>();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("controller".into())
            .spawn(move || -> anyhow::Result<()> {
                // Metadata traffic is light: one worker leaves the cores to the shards.
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("controller-rt")
                    .enable_all()
                    .build()
                    .context("build tokio runtime")?;
                runtime.block_on(async move {
                    let running = match start(&config).await {
                        Ok(running) => running,
                        Err(e) => {
                            let message = format!("{e:#}");
                            let _ = ready_tx.send(Err(e));
                            anyhow::bail!(message);
                        }
                    };
                    let _ = ready_tx.send(Ok(running.listen));
                    // Blocking wait for the stop signal off the runtime's workers.
                    let _ = tokio::task::spawn_blocking(move || stop_rx.recv()).await;
                    running.stop().await
                })
            })
            .context("spawn controller thread")?;
        let listen = ready_rx
            .recv()
            .context("controller thread ended before it listened")??;
        Ok(Embedded {
            listen,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// Stops the controller and waits for its thread.
    pub fn stop(mut self) -> anyhow::Result<()> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> anyhow::Result<()> {
        drop(self.stop.take());
        match self.thread.take() {
            Some(thread) => thread
                .join()
                .map_err(|_| anyhow::anyhow!("controller thread panicked"))?,
            None => Ok(()),
        }
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        if let Err(e) = self.stop_inner() {
            tracing::warn!(error = %e, "embedded controller stopped with an error");
        }
    }
}
