//! Running a broker: start the embedded one-voter controller when no quorum is
//! configured, start one shard per configured core, follow the controller's
//! metadata until it shows this broker registered and unfenced (each shard
//! opening the replicas placed on it), then serve the main port (every shard,
//! SO_REUSEPORT), each shard's own port, and the admin port (shard 0). On
//! SIGTERM/SIGINT stop accepting, finish in-flight requests, flush and close
//! every log, then stop the embedded controller.

use std::rc::Rc;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::SystemClock;
use crate::config::BrokerConfig;
use crate::net;
use crate::runtime::net::Listener;
use crate::runtime::shards::{self, ShardContext};
use crate::runtime::{self, TaskClass};
use crate::shard::{MeshMessage, Shard, METADATA_SHARD};

/// How long a stopping broker waits for the controller to move its
/// leadership elsewhere before it stops serving anyway.
pub const CONTROLLED_SHUTDOWN_MS_MAX: u64 = 3_000;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("data dir {path}: {source}")]
    DataDir {
        path: String,
        source: std::io::Error,
    },
    /// Every log closed, but the record naming them is not durable: the
    /// next start rescans them all (nothing acknowledged is lost).
    #[error(
        "data dir {path}: every log closed, but the record of it was not written, so the next start rescans them: {source}"
    )]
    CleanShutdownRecord {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Journal(#[from] crate::log::journal_replay::ReplayError),
    #[error("data dir {0} is in use by another broker")]
    DataDirLocked(String),
    #[error("embedded controller: {0}")]
    Controller(String),
    #[error("shard {shard}: {reason}")]
    Shard { shard: usize, reason: String },
    #[error("starting shards: {0}")]
    Start(std::io::Error),
    #[error("{0}")]
    PortInUse(std::io::Error),
    #[error("{0}")]
    CpusNotAllowed(String),
}

/// Runs the broker until a stop signal; returns once every shard closed cleanly.
pub fn run(config: BrokerConfig) -> Result<(), ServerError> {
    let dir = config.data_dir.display().to_string();
    // Asked on the main thread, whose mask is still the process's.
    let cpus: Vec<usize> = shards::allowed_cpus()
        .into_iter()
        .take(config.cores)
        .collect();
    if cpus.len() < config.cores {
        return Err(ServerError::CpusNotAllowed(format!(
            "{} shards asked for, and this process may run on {} CPUs only ({cpus:?})",
            config.cores,
            cpus.len()
        )));
    }

    crate::log::create_dir_durably(&crate::cluster_view::topics_dir(&config.data_dir)).map_err(
        |source| ServerError::DataDir {
            path: dir.clone(),
            source,
        },
    )?;
    let lock = std::fs::File::create(config.data_dir.join("broker.lock")).map_err(|source| {
        ServerError::DataDir {
            path: dir.clone(),
            source,
        }
    })?;
    if lock.try_lock().is_err() {
        return Err(ServerError::DataDirLocked(dir));
    }
    let shard_addrs = (0..config.cores)
        .map(|shard| std::net::SocketAddr::new(config.listen.ip(), config.shard_port(shard)));
    for addr in std::iter::once(config.listen)
        .chain(shard_addrs)
        .chain(std::iter::once(config.admin_listen))
    {
        runtime::net::refuse_if_listened(addr).map_err(ServerError::PortInUse)?;
    }
    // What a killed predecessor left only in the page cache becomes durable
    // before any of it is trusted (a new replica's directory made in bulk is
    // written first and synced after, `log::create_empty_logs`).
    crate::log::sync_file_system(&config.data_dir).map_err(|source| ServerError::DataDir {
        path: dir.clone(),
        source,
    })?;
    // Removed durably before any log opens: a crash from here on rescans.
    let mut clean_logs =
        crate::log::take_clean_logs(&config.data_dir).map_err(|source| ServerError::DataDir {
            path: dir.clone(),
            source,
        })?;
    // The shard journals' records go back into their segment files before
    // any log opens, and those logs are rescanned even if closed cleanly
    // (after the record above is taken, so a crash between the two cannot
    // leave a log written into and still listed as clean).
    let replayed = crate::log::journal_replay::replay_journals(&config.data_dir)?;
    if replayed.records > 0 {
        tracing::info!(
            rings = replayed.rings,
            records = replayed.records,
            writes = replayed.writes,
            skipped_missing = replayed.skipped_missing,
            logs = replayed.logs.len(),
            "journal replayed"
        );
    }
    clean_logs.retain(|name| !replayed.logs.contains(name));
    let clean_logs = Arc::new(clean_logs);
    let mut config = config;
    let embedded = if config.controllers.is_empty() {
        let embedded = start_embedded_controller(&config)?;
        config.controllers = vec![embedded.listen.to_string()];
        Some(embedded)
    } else {
        None
    };
    let stop = Arc::new(AtomicBool::new(false));
    shards::stop_on_signals(&stop).map_err(ServerError::Start)?;
    let mesh_queue_max = config.mesh_queue_max;
    tracing::info!(node_id = config.node_id, listen = %config.listen, shards = config.cores, shard_cpus = ?cpus, data_dir = %dir, controllers = ?config.controllers, "starting broker");
    let idle_spin = Duration::from_micros(config.idle_spin_us);
    let options = shards::ExecutorOptions {
        mesh_queue_max,
        idle_spin,
        io_memory_bytes: config.io_memory_bytes_per_shard,
        blocking_threads: config.blocking_threads_per_shard,
    };
    let data_dir = config.data_dir.clone();
    let results = shards::run_shards(&cpus, options, stop, move |ctx| {
        let config = config.clone();
        // Each shard takes its own copy: nothing is shared across cores.
        let clean_logs = (*clean_logs).clone();
        async move { run_shard(ctx, config, clean_logs).await }
    })
    .map_err(ServerError::Start)?;
    if let Some(embedded) = embedded {
        embedded
            .stop()
            .map_err(|e| ServerError::Controller(format!("{e:#}")))?;
    }
    let closed = results
        .into_iter()
        .collect::<Result<Vec<Vec<String>>, ServerError>>()?;
    // Every shard closed: one durable record names every log closed cleanly.
    let closed: Vec<String> = closed.into_iter().flatten().collect();
    crate::log::write_clean_logs(&data_dir, &closed).map_err(|source| {
        ServerError::CleanShutdownRecord {
            path: dir.clone(),
            source,
        }
    })?;
    drop(lock);
    tracing::info!(logs = closed.len(), "broker stopped cleanly");
    Ok(())
}

/// The one-voter controller of a broker without a quorum: same code as
/// `ringlog-controller`, its Raft log under `DATA_DIR/controller`.
fn start_embedded_controller(
    config: &BrokerConfig,
) -> Result<controller::process::Embedded, ServerError> {
    let node_id = u64::try_from(config.node_id).expect("node id validated >= 0");
    let listen = config.embedded_controller_listen.to_string();
    let partial = controller::config::PartialConfig {
        node_id: Some(node_id),
        listen: Some(listen.clone()),
        peers: Some(format!("{node_id}={listen}")),
        data_dir: Some(config.data_dir.join("controller")),
        ..controller::config::PartialConfig::default()
    };
    let controller_config = controller::config::ControllerConfig::validate(partial)
        .map_err(|e| ServerError::Controller(e.to_string()))?;
    controller::process::Embedded::spawn(controller_config)
        .map_err(|e| ServerError::Controller(format!("{e:#}")))
}

/// Runs one shard until the stop; returns the directory names of the logs
/// it closed cleanly.
async fn run_shard(
    ctx: ShardContext<MeshMessage>,
    config: BrokerConfig,
    clean_logs: std::collections::HashSet<String>,
) -> Result<Vec<String>, ServerError> {
    let ShardContext {
        shard_id,
        shard_count,
        mesh,
        stop,
    } = ctx;
    let fail = |reason: String| ServerError::Shard {
        shard: shard_id,
        reason,
    };
    let mut shard = Shard::new(
        shard_id,
        shard_count,
        Rc::new(config.clone()),
        Rc::new(SystemClock),
        mesh,
    );
    shard.trust_clean_logs(clean_logs);
    if config.space_release_bytes_per_s_per_shard > 0 {
        shard.use_releaser(crate::log::space_release::SpaceReleaser::start(
            config.space_release_bytes_per_s_per_shard,
        ));
    }
    let journal = if config.journal_ring_bytes_per_shard > 0 {
        let dir = config
            .data_dir
            .join(crate::log::journal_replay::JOURNAL_DIR);
        match crate::log::shard_journal::ShardJournal::open(
            &dir,
            &format!("shard-{shard_id}"),
            config.journal_ring_bytes_per_shard,
        )
        .await
        {
            Ok(journal) => {
                shard.use_journal(journal.clone());
                Some(journal)
            }
            // No room for a new ring: the logs sync their own files, as
            // with no journal configured, and the next start tries again.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
                ) =>
            {
                tracing::warn!(shard = shard_id, dir = %dir.display(), error = %e, "no room for the journal ring; running without it");
                None
            }
            Err(e) => {
                return Err(fail(format!(
                    "opening the journal in {}: {e}",
                    dir.display()
                )))
            }
        }
    } else {
        None
    };
    let receivers = shard.mesh_mut().take_receivers();
    let shard = Rc::new(shard);
    for (_, receiver) in receivers {
        let shard = shard.clone();
        runtime::spawn_in(TaskClass::Requests, async move {
            while let Some(message) = receiver.recv().await {
                shard.on_mesh_message(message);
            }
        })
        .detach();
    }
    let mut tasks = Vec::new();
    // The links to the controller are cancelled at shutdown rather than
    // awaited: a metadata long poll would hold the exit for seconds.
    let mut links = Vec::new();
    if shard_id == METADATA_SHARD {
        links.push(runtime::spawn_in(
            TaskClass::Replication,
            crate::shard::controller_link::run_session(shard.clone(), config.controllers.clone()),
        ));
        links.push(runtime::spawn_in(
            TaskClass::Replication,
            crate::shard::controller_link::run_metadata(shard.clone(), config.controllers.clone()),
        ));
    }
    // Serve only once the metadata says this broker is a live member: before
    // that it would answer with an empty or stale picture of the cluster.
    let clock = shard.clock().clone();
    let waiting_since = clock.monotonic();
    let mut last_note = waiting_since;
    while !shard.is_serving() && !stop.load(std::sync::atomic::Ordering::Relaxed) {
        runtime::timeout(Duration::from_millis(50), shard.serving().wait_at_least(1)).await;
        let now = clock.monotonic();
        if shard_id == METADATA_SHARD && now.saturating_sub(last_note) >= Duration::from_secs(5) {
            last_note = now;
            tracing::warn!(waited_ms = now.saturating_sub(waiting_since).as_millis() as u64, controllers = ?config.controllers, "still waiting for the controller to register and unfence this broker");
        }
    }
    let main = Listener::bind(config.listen)
        .map_err(|e| fail(format!("binding {}: {e}", config.listen)))?;
    let shard_addr = std::net::SocketAddr::new(config.listen.ip(), config.shard_port(shard_id));
    let own = Listener::bind(shard_addr).map_err(|e| fail(format!("binding {shard_addr}: {e}")))?;
    tasks.extend([
        runtime::spawn_in(
            TaskClass::Requests,
            net::serve_listener(shard.clone(), main, "main"),
        ),
        runtime::spawn_in(
            TaskClass::Requests,
            net::serve_listener(shard.clone(), own, "shard"),
        ),
        runtime::spawn_in(TaskClass::Background, shard.clone().run_maintenance()),
    ]);
    // Cancelled rather than awaited at stop: a cleaner pass may take long,
    // and one cut short leaves only files that the next open removes or
    // finishes; the group timers sleep up to a lag probe interval, and what
    // they would write after the stop began is not needed (a new
    // coordinator reloads from the log).
    let cancelled_at_stop = vec![
        runtime::spawn_in(TaskClass::Cleaner, shard.clone().run_cleaner()),
        runtime::spawn_in(TaskClass::Background, shard.clone().run_group_ticks()),
        runtime::spawn_in(TaskClass::Background, shard.clone().run_txn_ticks()),
        runtime::spawn_in(TaskClass::Background, shard.clone().run_group_lag()),
    ];
    if shard_id == METADATA_SHARD {
        let admin = Listener::bind(config.admin_listen)
            .map_err(|e| fail(format!("binding {}: {e}", config.admin_listen)))?;
        tasks.push(runtime::spawn_in(
            TaskClass::Background,
            net::serve_admin(shard.clone(), admin),
        ));
    }
    tracing::info!(
        shard = shard_id,
        port = config.shard_port(shard_id),
        partitions = shard.replica_count(),
        "shard ready"
    );
    shards::wait_for_stop(&stop, Duration::from_millis(50)).await;
    tracing::info!(shard = shard_id, "stopping: handing leadership over");
    shard
        .hand_over(clock.monotonic() + Duration::from_millis(CONTROLLED_SHUTDOWN_MS_MAX))
        .await;
    tracing::info!(shard = shard_id, "stopping: draining connections");
    shard.stop();
    for link in links {
        link.cancel().await;
    }
    for task in cancelled_at_stop {
        task.cancel().await;
    }
    for task in tasks {
        task.await;
    }
    let closed = shard.close_all_unmarked().await;
    if let Some(journal) = journal {
        // Every log closed synced: nothing in the ring is needed, and a
        // start that found records would rescan the logs they name.
        if let Err(e) = journal.release_all().await {
            tracing::error!(shard = shard_id, error = %e, "emptying the journal failed; the next start replays it and rescans its logs");
        }
    }
    Ok(closed)
}
