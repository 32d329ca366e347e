//! Starting the shards: one glommio executor pinned per configured core, joined
//! by a full mesh of bounded channels, the only way shards talk to each other.

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use glommio::channels::channel_mesh::{MeshBuilder, Receivers, Senders};
use glommio::channels::shared_channel::ConnectedReceiver;
use glommio::{LocalExecutorBuilder, Placement, PoolPlacement};

/// What a shard's root future receives.
#[derive(Debug)]
pub struct ShardContext<T: Send + 'static> {
    pub shard_id: usize,
    pub shard_count: usize,
    pub mesh: Mesh<T>,
    /// Set (from a signal handler thread) when the process must stop.
    pub stop: Arc<AtomicBool>,
}

/// This shard's ends of the mesh.
#[derive(Debug)]
pub struct Mesh<T: Send + 'static> {
    /// `None` for a shard alone in its broker (`Mesh::solo`).
    senders: Option<Senders<T>>,
    receivers: Option<Receivers<T>>,
}

impl<T: Send + 'static> Mesh<T> {
    /// The mesh of a broker with one shard, which has nobody to talk to: for
    /// a shard started outside `run_shards`, as the simulation starts one.
    pub fn solo() -> Mesh<T> {
        Mesh {
            senders: None,
            receivers: None,
        }
    }

    /// Sends to shard `to` (never this shard), waiting while its queue is full.
    pub async fn send(&self, to: usize, message: T) -> Result<(), T> {
        self.senders
            .as_ref()
            .unwrap_or_else(|| panic!("a shard alone in its broker sent to shard {to}"))
            .send_to(to, message)
            .await
            .map_err(|e| match e {
                glommio::GlommioError::Closed(glommio::ResourceType::Channel(m)) => m,
                glommio::GlommioError::WouldBlock(glommio::ResourceType::Channel(m)) => m,
                other => panic!("mesh send failed: {other}"),
            })
    }

    /// The receivers from every other shard; callable once.
    pub fn take_receivers(&mut self) -> Vec<(usize, MeshReceiver<T>)> {
        if self.senders.is_none() {
            return Vec::new();
        }
        let mut receivers = self.receivers.take().expect("receivers taken once");
        receivers
            .streams()
            .into_iter()
            .map(|(from, r)| (from, MeshReceiver { inner: r }))
            .collect()
    }
}

#[derive(Debug)]
pub struct MeshReceiver<T: Send + 'static> {
    inner: ConnectedReceiver<T>,
}

impl<T: Send + 'static> MeshReceiver<T> {
    /// The next message, `None` once the sending shard has gone.
    pub async fn recv(&self) -> Option<T> {
        self.inner.recv().await
    }
}

/// io_uring rings each shard's executor registers its I/O memory with
/// (glommio's main, latency and poll rings); the kernel charges every
/// registration against the memlock limit.
const RINGS_PER_SHARD: u64 = 3;

/// CAP_IPC_LOCK's bit in the capability sets of `/proc/self/status`.
const CAP_IPC_LOCK_BIT: u32 = 14;

/// Whether this process may lock memory past its limit: its effective
/// capabilities hold CAP_IPC_LOCK (root usually, not in every container).
fn may_lock_past_the_limit() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK_BIT) != 0)
}

/// Each shard's I/O memory is a pool either way; io_uring only uses it as
/// registered buffers (fixed writes, no page pinning per I/O) when the
/// memlock limit covers every ring's registration. glommio then says so in
/// a log line nobody reads; this says what to change. The limit is the
/// user's across processes, so several brokers of one user share it.
fn warn_if_io_memory_stays_unregistered(io_memory_bytes: usize, shard_count: usize) {
    if may_lock_past_the_limit() {
        return;
    }
    let needed = io_memory_bytes as u64 * RINGS_PER_SHARD * shard_count as u64;
    match nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK) {
        Ok((soft, _)) if soft < needed => tracing::warn!(
            memlock_limit_bytes = soft,
            needed_bytes = needed,
            "the memlock limit is below the shards' I/O memory: some shards' buffers may stay unregistered (raise `ulimit -l`, or lower io_memory_bytes_per_shard)"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot read the memlock limit"),
    }
}

/// How each shard's executor is set up.
#[derive(Clone, Copy, Debug)]
pub struct ExecutorOptions {
    /// Bound of each shard-to-shard queue.
    pub mesh_queue_max: usize,
    /// How long an idle shard spins before parking.
    pub idle_spin: Duration,
    /// Aligned I/O memory set aside per shard.
    pub io_memory_bytes: usize,
    /// Threads per shard for blocking file work (`runtime::blocking`).
    pub blocking_threads: usize,
}

/// Runs `root` on `cpus.len()` executors, shard `i` pinned to `cpus[i]`, and
/// returns their outputs once all have finished.
pub fn run_shards<T, F, Fut, R>(
    cpus: &[usize],
    options: ExecutorOptions,
    stop: Arc<AtomicBool>,
    root: F,
) -> io::Result<Vec<R>>
where
    T: Send + 'static,
    F: Fn(ShardContext<T>) -> Fut + Send + Sync + Clone + 'static,
    Fut: Future<Output = R> + 'static,
    R: Send + 'static,
{
    assert!(options.blocking_threads >= 1);
    let ExecutorOptions {
        mesh_queue_max,
        idle_spin,
        io_memory_bytes,
        blocking_threads,
    } = options;
    let shard_count = cpus.len();
    warn_if_io_memory_stays_unregistered(io_memory_bytes, shard_count);
    let nudger = super::nudge::Nudger::start(shard_count)?;
    let mesh = MeshBuilder::<T, _>::full(shard_count, mesh_queue_max);
    let mut handles = Vec::with_capacity(shard_count);
    for (shard_id, &cpu) in cpus.iter().enumerate() {
        let (mesh, root, stop) = (mesh.clone(), root.clone(), stop.clone());
        let nudges = nudger.registry();
        let handle = LocalExecutorBuilder::new(Placement::Fixed(cpu))
            .name(&format!("shard-{shard_id}"))
            .io_memory(io_memory_bytes)
            // Unpinned: these threads sleep in fsync and mkdir, and the
            // scheduler may run them on whichever core is idle.
            .blocking_thread_pool_placement(PoolPlacement::Unbound(blocking_threads))
            // Spinning before parking cuts wake-up latency but burns the core;
            // off by default so a broker sharing cores with clients does not starve them.
            .spin_before_park(idle_spin)
            .spawn(move || async move {
                let _nudged = super::nudge::Nudger::register_current(&nudges, shard_id);
                let (senders, receivers) = mesh.join().await.expect("mesh join");
                root(ShardContext {
                    shard_id,
                    shard_count,
                    mesh: Mesh {
                        senders: Some(senders),
                        receivers: Some(receivers),
                    },
                    stop,
                })
                .await
            })
            .map_err(|e| io::Error::other(e.to_string()))?;
        handles.push(handle);
    }
    let outputs = handles
        .into_iter()
        .map(|h| h.join().map_err(|e| io::Error::other(e.to_string())))
        .collect();
    drop(nudger);
    outputs
}

/// Registers SIGTERM and SIGINT to set `stop`.
pub fn stop_on_signals(stop: &Arc<AtomicBool>) -> io::Result<()> {
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())?;
    Ok(())
}

/// Resolves once `stop` is set, checking every `poll`.
pub async fn wait_for_stop(stop: &AtomicBool, poll: Duration) {
    while !stop.load(Ordering::Relaxed) {
        super::sleep(poll).await;
    }
}

/// Number of CPUs this process may run on (its affinity mask, and a cgroup
/// CPU quota where one is set).
pub fn available_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The CPUs of this thread's affinity mask, lowest first: what `taskset` or
/// a container's cpuset left the process, asked before any shard is
/// pinned. Shards are pinned to these, so a broker started on CPUs 2-3
/// runs its shards there, not on CPUs 0-1 that it was kept off (or that a
/// cpuset refuses it).
pub fn allowed_cpus() -> Vec<usize> {
    core_affinity::get_core_ids()
        .map(|ids| ids.into_iter().map(|core| core.id).collect::<Vec<_>>())
        .filter(|ids| !ids.is_empty())
        .unwrap_or_else(|| (0..available_cpus()).collect())
}
