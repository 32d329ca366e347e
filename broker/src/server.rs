//! Running a broker: start one shard per configured core, open the partitions
//! each owns, serve the main port (every shard, SO_REUSEPORT), each shard's own
//! port, and the admin port (shard 0); on SIGTERM/SIGINT stop accepting, finish
//! in-flight requests, flush and close every log.

use std::rc::Rc;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::SystemClock;
use crate::cluster_view::{ClusterView, MetadataStore};
use crate::config::BrokerConfig;
use crate::net;
use crate::runtime::net::Listener;
use crate::runtime::shards::{self, ShardContext};
use crate::runtime::{self};
use crate::shard::{MeshMessage, Shard, METADATA_SHARD};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("data dir {path}: {source}")]
    DataDir {
        path: String,
        source: std::io::Error,
    },
    #[error("data dir {0} is in use by another broker")]
    DataDirLocked(String),
    #[error("topic metadata: {0}")]
    Metadata(std::io::Error),
    #[error("shard {shard}: {reason}")]
    Shard { shard: usize, reason: String },
    #[error("starting shards: {0}")]
    Start(std::io::Error),
}

/// Runs the broker until a stop signal; returns once every shard closed cleanly.
pub fn run(config: BrokerConfig) -> Result<(), ServerError> {
    let dir = config.data_dir.display().to_string();
    std::fs::create_dir_all(&config.data_dir).map_err(|source| ServerError::DataDir {
        path: dir.clone(),
        source,
    })?;
    let lock = std::fs::File::create(config.data_dir.join("broker.lock")).map_err(|source| {
        ServerError::DataDir {
            path: dir.clone(),
            source,
        }
    })?;
    if lock.try_lock().is_err() {
        return Err(ServerError::DataDirLocked(dir));
    }
    let view = MetadataStore::new(&config.data_dir)
        .load()
        .map_err(ServerError::Metadata)?;
    let stop = Arc::new(AtomicBool::new(false));
    shards::stop_on_signals(&stop).map_err(ServerError::Start)?;
    let cpus: Vec<usize> = (0..config.cores).collect();
    let mesh_queue_max = config.mesh_queue_max;
    tracing::info!(node_id = config.node_id, listen = %config.listen, shards = config.cores, data_dir = %dir, topics = view.topics.len(), "starting broker");
    let idle_spin = Duration::from_micros(config.idle_spin_us);
    let results = shards::run_shards(&cpus, mesh_queue_max, idle_spin, stop, move |ctx| {
        let (config, view) = (config.clone(), view.clone());
        async move { run_shard(ctx, config, view).await }
    })
    .map_err(ServerError::Start)?;
    drop(lock);
    results
        .into_iter()
        .collect::<Result<Vec<()>, ServerError>>()?;
    tracing::info!("broker stopped cleanly");
    Ok(())
}

async fn run_shard(
    ctx: ShardContext<MeshMessage>,
    config: BrokerConfig,
    view: ClusterView,
) -> Result<(), ServerError> {
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
    let topics: Vec<_> = view.topics.values().cloned().collect();
    let mut shard = Shard::new(
        shard_id,
        shard_count,
        Rc::new(config.clone()),
        Rc::new(SystemClock),
        view,
        mesh,
    );
    let receivers = shard.mesh_mut().take_receivers();
    let shard = Rc::new(shard);
    for (_, receiver) in receivers {
        let shard = shard.clone();
        runtime::spawn(async move {
            while let Some(message) = receiver.recv().await {
                shard.on_mesh_message(message);
            }
        })
        .detach();
    }
    shard
        .open_owned(&topics)
        .await
        .map_err(|e| fail(format!("opening partitions: {e}")))?;
    let main = Listener::bind(config.listen)
        .map_err(|e| fail(format!("binding {}: {e}", config.listen)))?;
    let shard_addr = std::net::SocketAddr::new(config.listen.ip(), config.shard_port(shard_id));
    let own = Listener::bind(shard_addr).map_err(|e| fail(format!("binding {shard_addr}: {e}")))?;
    let mut tasks = vec![
        runtime::spawn(net::serve_listener(shard.clone(), main, "main")),
        runtime::spawn(net::serve_listener(shard.clone(), own, "shard")),
        runtime::spawn(shard.clone().run_maintenance()),
    ];
    if shard_id == METADATA_SHARD && !config.controllers.is_empty() {
        tasks.push(runtime::spawn(crate::controller_link::run(
            shard.clone(),
            config.controllers.clone(),
        )));
    }
    if shard_id == METADATA_SHARD {
        let admin = Listener::bind(config.admin_listen)
            .map_err(|e| fail(format!("binding {}: {e}", config.admin_listen)))?;
        tasks.push(runtime::spawn(net::serve_admin(shard.clone(), admin)));
    }
    tracing::info!(
        shard = shard_id,
        port = config.shard_port(shard_id),
        partitions = shard.replicas.borrow().len(),
        "shard ready"
    );
    shards::wait_for_stop(&stop, Duration::from_millis(50)).await;
    tracing::info!(shard = shard_id, "stopping: draining connections");
    shard.stopping.set(true);
    for task in tasks {
        task.await;
    }
    shard.close_all().await;
    Ok(())
}
