//! The broker's configuration: a TOML file (`--config`) overridden by flags,
//! validated once at start with a precise error per bad field. Every field has
//! a unit in its name, a default and, where input can grow, a bound.
//! Several brokers can share a host given distinct `node_id`, `listen` and
//! `data_dir`: every other port derives from `listen` unless set.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::log::{FlushPolicy, LogConfig};

/// Shard `i` listens on `listen.port + SHARD_PORT_OFFSET + i` unless set.
pub const SHARD_PORT_OFFSET: u16 = 1;
/// The admin (metrics) port is `listen.port + ADMIN_PORT_OFFSET` unless set.
pub const ADMIN_PORT_OFFSET: u16 = 64;
/// Without `controller`, the embedded controller listens on
/// `listen.port + EMBEDDED_CONTROLLER_PORT_OFFSET` unless set.
pub const EMBEDDED_CONTROLLER_PORT_OFFSET: u16 = 65;
/// Shards beyond this would collide with the derived admin port.
pub const SHARDS_MAX: usize = (ADMIN_PORT_OFFSET - SHARD_PORT_OFFSET) as usize;

#[derive(Clone, Debug)]
pub struct BrokerConfig {
    /// This broker's id in the cluster. Required (flag or file).
    pub node_id: i32,
    /// Root of topic metadata and partition logs. Required.
    pub data_dir: PathBuf,
    /// Main listener; accepts any request. Default 127.0.0.1:9092.
    pub listen: SocketAddr,
    /// Shards (pinned executors), one per CPU starting at CPU 0. Default: all CPUs.
    pub cores: usize,
    /// First shard port; shard i listens on shard_port_base + i. Default listen port + 1.
    pub shard_port_base: u16,
    /// Admin HTTP listener serving /metrics. Default listen host, port + 64.
    pub admin_listen: SocketAddr,
    /// Host name clients are told to connect to. Default: the listen address's IP.
    pub advertised_host: String,
    /// Largest request frame accepted, checked before allocating. Default 64 MiB.
    pub frame_size_bytes_max: u32,
    /// Open connections per shard listener (main port and shard port each). Default 1024.
    pub connections_per_shard_max: usize,
    /// Requests read ahead of their responses on one connection. Default 64.
    pub in_flight_requests_per_connection_max: usize,
    /// Longest fetch long-poll honoured; longer waits are cut to it. Default 30 s.
    pub fetch_wait_ms_max: u64,
    /// A connection that sends no frame for this long is closed. Default 10 min.
    pub connection_idle_ms_max: u64,
    /// A frame whose bytes do not all arrive within this is dropped with its connection. Default 30 s.
    pub frame_read_ms_max: u64,
    /// Bytes of recent batches each shard keeps in memory for tailing reads. Default 64 MiB.
    pub batch_cache_bytes_max: usize,
    /// Messages queued between two shards before senders wait. Default 1024.
    pub mesh_queue_max: usize,
    /// Microseconds a shard spins before parking when idle; trades CPU for
    /// wake-up latency. Default 0 (park at once), at most 10 000.
    pub idle_spin_us: u64,
    /// Aligned I/O memory each shard sets aside at start for segment tail
    /// chunks and disk reads, registered with io_uring when the memlock limit
    /// allows. Past it, buffers come from the heap, and the pages of every
    /// fresh heap buffer fault in again and are unmapped when freed. Default
    /// 64 MiB, 64 KiB..=`IO_MEMORY_BYTES_PER_SHARD_MAX`.
    pub io_memory_bytes_per_shard: usize,
    /// Threads each shard keeps for blocking file work: creating partition
    /// directories, writing and fsyncing checkpoints, removing files. The
    /// threads mostly wait on the disk; several let the file system commit
    /// many partitions' fsyncs together, which is what makes creating,
    /// opening and closing thousands of partitions fast. Default 64,
    /// 1..=`BLOCKING_THREADS_PER_SHARD_MAX`.
    pub blocking_threads_per_shard: usize,
    /// Size of each shard's journal ring (`DATA_DIR/journal/shard-N.ring`),
    /// made and zeroed once: under `flush.policy=always` a shard's logs
    /// commit through it in one write per round instead of syncing their
    /// segment files each. 0 turns the journal off. Default 256 MiB; 0, or
    /// a multiple of 4 KiB within `JOURNAL_RING_BYTES_MIN..=JOURNAL_RING_BYTES_MAX`.
    pub journal_ring_bytes_per_shard: u64,
    /// How fast each shard gives back the disk space of segment files that
    /// retention (or a follower's reset) removed: their names go at once,
    /// their blocks are freed in synced steps of 4 MiB at most this many
    /// bytes per second (without a pause once 8 GiB wait), so no single
    /// file-system commit has gigabytes to free and discard while
    /// acknowledgements wait on it. 0 frees them all with the unlink.
    /// Default 512 MiB/s.
    pub space_release_bytes_per_s_per_shard: u64,
    /// Controller endpoints (HOST:PORT) of the cluster's quorum. Default
    /// empty: the broker then runs its own one-voter controller in-process.
    pub controllers: Vec<String>,
    /// A leader drops a follower from the ISR that has not caught up for this
    /// long. Default 10 s.
    pub replica_lag_time_max_ms: u64,
    /// Where the embedded controller listens when `controllers` is empty.
    /// Default listen host, port + 65.
    pub embedded_controller_listen: SocketAddr,
    /// Log settings for topics that do not override them.
    pub log: LogConfig,
    /// What each shard's log cleaner (compaction) may use.
    pub cleaner: CleanerConfig,
    /// Consumer group coordination and `__consumer_offsets`.
    pub groups: GroupsConfig,
    /// Transaction coordination and `__transaction_state`.
    pub transactions: TransactionsConfig,
}

/// Transactions: the internal topic that holds transaction state. Read when
/// `__transaction_state` is first created (on the first FindCoordinator for
/// a transactional id) and by every transaction coordinator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionsConfig {
    /// Partitions of `__transaction_state`, fixed at its creation. Default
    /// 50, within `1..=OFFSETS_TOPIC_PARTITIONS_MAX`.
    pub state_topic_partitions: u32,
    /// Replication factor, lowered to the live brokers at creation. Default 3.
    pub state_topic_replication_factor: u16,
    /// Segment size of `__transaction_state`. Default 100 MiB.
    pub state_topic_segment_bytes: u64,
    /// A transactional id with no transaction for this long is forgotten
    /// (Kafka's `transactional.id.expiration.ms`). Default 7 days.
    pub id_expiration_ms: i64,
    /// How long a coordinator's write waits to be replicated before the
    /// request fails with REQUEST_TIMED_OUT. Default 5 s.
    pub write_timeout_ms: u64,
}

impl Default for TransactionsConfig {
    fn default() -> TransactionsConfig {
        TransactionsConfig {
            state_topic_partitions: 50,
            state_topic_replication_factor: 3,
            state_topic_segment_bytes: 100 << 20,
            id_expiration_ms: crate::txn::TXN_ID_EXPIRATION_MS_DEFAULT,
            write_timeout_ms: 5_000,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileTransactionsConfig {
    pub state_topic_partitions: Option<u32>,
    pub state_topic_replication_factor: Option<u16>,
    pub state_topic_segment_bytes: Option<u64>,
    pub id_expiration_ms: Option<i64>,
    pub write_timeout_ms: Option<u64>,
}

fn transactions_config(file: FileTransactionsConfig) -> TransactionsConfig {
    let d = TransactionsConfig::default();
    TransactionsConfig {
        state_topic_partitions: file
            .state_topic_partitions
            .unwrap_or(d.state_topic_partitions),
        state_topic_replication_factor: file
            .state_topic_replication_factor
            .unwrap_or(d.state_topic_replication_factor),
        state_topic_segment_bytes: file
            .state_topic_segment_bytes
            .unwrap_or(d.state_topic_segment_bytes),
        id_expiration_ms: file.id_expiration_ms.unwrap_or(d.id_expiration_ms),
        write_timeout_ms: file.write_timeout_ms.unwrap_or(d.write_timeout_ms),
    }
}

/// Consumer groups: the internal topic that holds them and how commits are
/// kept. Read when `__consumer_offsets` is first created (on the first
/// FindCoordinator) and by every coordinator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupsConfig {
    /// Partitions of `__consumer_offsets`, fixed at its creation: groups
    /// spread over them by CRC-32C of the group id. Default 50, within
    /// `1..=OFFSETS_TOPIC_PARTITIONS_MAX`.
    pub offsets_topic_partitions: u32,
    /// Replication factor of `__consumer_offsets`, lowered to the number of
    /// live brokers at creation. Default 3.
    pub offsets_topic_replication_factor: u16,
    /// Segment size of `__consumer_offsets` (kept small so compaction keeps
    /// loading fast). Default 100 MiB.
    pub offsets_topic_segment_bytes: u64,
    /// Offsets of a group without members are deleted this long after its
    /// last commit. Default 7 days (10080 minutes).
    pub offsets_retention_minutes: u64,
    /// How long a commit (or any group change) waits to be replicated before
    /// the request fails with REQUEST_TIMED_OUT. Default 5 s.
    pub offsets_commit_timeout_ms: u64,
    /// How often coordinators probe their groups' lag for `/metrics` (one
    /// consumer fetch per committed partition). Default 10 s, at least 100 ms.
    pub lag_probe_interval_ms: u64,
}

pub const OFFSETS_TOPIC_PARTITIONS_MAX: u32 = 1000;

impl Default for GroupsConfig {
    fn default() -> GroupsConfig {
        GroupsConfig {
            offsets_topic_partitions: 50,
            offsets_topic_replication_factor: 3,
            offsets_topic_segment_bytes: 100 << 20,
            offsets_retention_minutes: 7 * 24 * 60,
            offsets_commit_timeout_ms: 5_000,
            lag_probe_interval_ms: 10_000,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileGroupsConfig {
    pub offsets_topic_partitions: Option<u32>,
    pub offsets_topic_replication_factor: Option<u16>,
    pub offsets_topic_segment_bytes: Option<u64>,
    pub offsets_retention_minutes: Option<u64>,
    pub offsets_commit_timeout_ms: Option<u64>,
    pub lag_probe_interval_ms: Option<u64>,
}

fn groups_config(file: FileGroupsConfig) -> GroupsConfig {
    let d = GroupsConfig::default();
    GroupsConfig {
        offsets_topic_partitions: file
            .offsets_topic_partitions
            .unwrap_or(d.offsets_topic_partitions),
        offsets_topic_replication_factor: file
            .offsets_topic_replication_factor
            .unwrap_or(d.offsets_topic_replication_factor),
        offsets_topic_segment_bytes: file
            .offsets_topic_segment_bytes
            .unwrap_or(d.offsets_topic_segment_bytes),
        offsets_retention_minutes: file
            .offsets_retention_minutes
            .unwrap_or(d.offsets_retention_minutes),
        offsets_commit_timeout_ms: file
            .offsets_commit_timeout_ms
            .unwrap_or(d.offsets_commit_timeout_ms),
        lag_probe_interval_ms: file
            .lag_probe_interval_ms
            .unwrap_or(d.lag_probe_interval_ms),
    }
}

/// Bounds of each shard's log cleaner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CleanerConfig {
    /// Memory for one pass's key map (about 40 bytes per distinct key); a
    /// pass covers as many keys as fit and the next goes on. Default 32 MiB,
    /// within `CLEANER_MEMORY_BYTES_MIN..=CLEANER_MEMORY_BYTES_MAX`.
    pub memory_bytes: usize,
    /// Bytes read plus written per second by one shard's cleaner; 0 for no
    /// bound. Default 8 MiB/s: on the reference 2-core machine a cleaner at
    /// 24 MiB/s per shard already multiplied produce latency (docs/performance.md).
    pub io_bytes_per_sec_max: u64,
    /// Pause between two rounds over the shard's compacted partitions.
    /// Default 15 s.
    pub backoff_ms: u64,
}

pub const CLEANER_MEMORY_BYTES_MIN: usize = 64 << 10;
pub const CLEANER_MEMORY_BYTES_MAX: usize = 16 << 30;
/// Bounds of `io_memory_bytes_per_shard`: glommio's own floor, and a ceiling
/// that keeps a typo from pinning the host's memory.
pub const IO_MEMORY_BYTES_PER_SHARD_MIN: usize = 64 << 10;
pub const IO_MEMORY_BYTES_PER_SHARD_MAX: usize = 16 << 30;
/// Ceiling of `blocking_threads_per_shard`: past it more threads only queue
/// on the same disk.
pub const BLOCKING_THREADS_PER_SHARD_MAX: usize = 256;

impl Default for CleanerConfig {
    fn default() -> CleanerConfig {
        CleanerConfig {
            memory_bytes: 32 << 20,
            io_bytes_per_sec_max: 8 << 20,
            backoff_ms: 15_000,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileCleanerConfig {
    pub memory_bytes: Option<usize>,
    pub io_bytes_per_sec_max: Option<u64>,
    pub backoff_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config: {field}: {reason}")]
pub struct ConfigError {
    pub field: &'static str,
    pub reason: String,
}

fn bad<T>(field: &'static str, reason: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError {
        field,
        reason: reason.into(),
    })
}

/// The TOML file's shape: every field optional, unknown fields refused.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub node_id: Option<i32>,
    pub data_dir: Option<PathBuf>,
    pub listen: Option<String>,
    pub cores: Option<usize>,
    pub shard_port_base: Option<u16>,
    pub admin_listen: Option<String>,
    pub advertised_host: Option<String>,
    pub frame_size_bytes_max: Option<u32>,
    pub connections_per_shard_max: Option<usize>,
    pub in_flight_requests_per_connection_max: Option<usize>,
    pub fetch_wait_ms_max: Option<u64>,
    pub connection_idle_ms_max: Option<u64>,
    pub frame_read_ms_max: Option<u64>,
    pub batch_cache_bytes_max: Option<usize>,
    pub mesh_queue_max: Option<usize>,
    pub idle_spin_us: Option<u64>,
    pub io_memory_bytes_per_shard: Option<usize>,
    pub blocking_threads_per_shard: Option<usize>,
    pub journal_ring_bytes_per_shard: Option<u64>,
    pub space_release_bytes_per_s_per_shard: Option<u64>,
    /// Comma-separated controller endpoints.
    pub controller: Option<String>,
    pub embedded_controller_listen: Option<String>,
    pub replica_lag_time_max_ms: Option<u64>,
    pub log: Option<FileLogConfig>,
    pub cleaner: Option<FileCleanerConfig>,
    pub groups: Option<FileGroupsConfig>,
    pub transactions: Option<FileTransactionsConfig>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileLogConfig {
    pub segment_size_bytes: Option<u64>,
    pub segment_age_ms: Option<i64>,
    pub index_interval_bytes: Option<u32>,
    pub retention_ms: Option<i64>,
    pub retention_bytes: Option<u64>,
    pub flush_policy: Option<String>,
    pub batch_bytes_max: Option<usize>,
    pub producer_id_expiration_ms: Option<i64>,
}

impl FileConfig {
    pub fn read(path: &Path) -> Result<FileConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .or_else(|e| bad("config", format!("cannot read {}: {e}", path.display())))?;
        toml::from_str(&text).or_else(|e| bad("config", format!("{}: {e}", path.display())))
    }

    /// Fields set in `overrides` win over those in `self`.
    pub fn merge(self, overrides: FileConfig) -> FileConfig {
        FileConfig {
            node_id: overrides.node_id.or(self.node_id),
            data_dir: overrides.data_dir.or(self.data_dir),
            listen: overrides.listen.or(self.listen),
            cores: overrides.cores.or(self.cores),
            shard_port_base: overrides.shard_port_base.or(self.shard_port_base),
            admin_listen: overrides.admin_listen.or(self.admin_listen),
            advertised_host: overrides.advertised_host.or(self.advertised_host),
            frame_size_bytes_max: overrides.frame_size_bytes_max.or(self.frame_size_bytes_max),
            connections_per_shard_max: overrides
                .connections_per_shard_max
                .or(self.connections_per_shard_max),
            in_flight_requests_per_connection_max: overrides
                .in_flight_requests_per_connection_max
                .or(self.in_flight_requests_per_connection_max),
            fetch_wait_ms_max: overrides.fetch_wait_ms_max.or(self.fetch_wait_ms_max),
            connection_idle_ms_max: overrides
                .connection_idle_ms_max
                .or(self.connection_idle_ms_max),
            frame_read_ms_max: overrides.frame_read_ms_max.or(self.frame_read_ms_max),
            batch_cache_bytes_max: overrides
                .batch_cache_bytes_max
                .or(self.batch_cache_bytes_max),
            mesh_queue_max: overrides.mesh_queue_max.or(self.mesh_queue_max),
            idle_spin_us: overrides.idle_spin_us.or(self.idle_spin_us),
            io_memory_bytes_per_shard: overrides
                .io_memory_bytes_per_shard
                .or(self.io_memory_bytes_per_shard),
            blocking_threads_per_shard: overrides
                .blocking_threads_per_shard
                .or(self.blocking_threads_per_shard),
            journal_ring_bytes_per_shard: overrides
                .journal_ring_bytes_per_shard
                .or(self.journal_ring_bytes_per_shard),
            space_release_bytes_per_s_per_shard: overrides
                .space_release_bytes_per_s_per_shard
                .or(self.space_release_bytes_per_s_per_shard),
            controller: overrides.controller.or(self.controller),
            embedded_controller_listen: overrides
                .embedded_controller_listen
                .or(self.embedded_controller_listen),
            replica_lag_time_max_ms: overrides
                .replica_lag_time_max_ms
                .or(self.replica_lag_time_max_ms),
            log: overrides.log.or(self.log),
            cleaner: overrides.cleaner.or(self.cleaner),
            groups: overrides.groups.or(self.groups),
            transactions: overrides.transactions.or(self.transactions),
        }
    }
}

fn resolve(field: &'static str, text: &str) -> Result<SocketAddr, ConfigError> {
    let mut addrs = text
        .to_socket_addrs()
        .or_else(|e| bad(field, format!("{text:?} is not HOST:PORT: {e}")))?;
    addrs
        .next()
        .map_or_else(|| bad(field, format!("{text:?} resolves to nothing")), Ok)
}

impl BrokerConfig {
    pub fn from_file_config(file: FileConfig) -> Result<BrokerConfig, ConfigError> {
        let Some(node_id) = file.node_id else {
            return bad("node_id", "required (--node-id)");
        };
        if node_id < 0 {
            return bad("node_id", "must be >= 0");
        }
        let Some(data_dir) = file.data_dir else {
            return bad("data_dir", "required (--data-dir)");
        };
        let listen = resolve("listen", file.listen.as_deref().unwrap_or("127.0.0.1:9092"))?;
        let cpus = crate::runtime::shards::available_cpus();
        let cores = file.cores.unwrap_or(cpus);
        if cores == 0 || cores > cpus || cores > SHARDS_MAX {
            return bad(
                "cores",
                format!("{cores} is outside 1..={}", cpus.min(SHARDS_MAX)),
            );
        }
        let shard_port_base = match file.shard_port_base {
            Some(port) => port,
            None => listen.port().checked_add(SHARD_PORT_OFFSET).map_or_else(
                || {
                    bad(
                        "shard_port_base",
                        "listen port too high to derive shard ports",
                    )
                },
                Ok,
            )?,
        };
        if usize::from(shard_port_base) + cores > 65_536 {
            return bad("shard_port_base", "shard ports would pass 65535");
        }
        let admin_listen = match &file.admin_listen {
            Some(text) => resolve("admin_listen", text)?,
            None => SocketAddr::new(
                listen.ip(),
                listen.port().checked_add(ADMIN_PORT_OFFSET).map_or_else(
                    || {
                        bad(
                            "admin_listen",
                            "listen port too high to derive the admin port",
                        )
                    },
                    Ok,
                )?,
            ),
        };
        let embedded_controller_listen = match &file.embedded_controller_listen {
            Some(text) => resolve("embedded_controller_listen", text)?,
            None => SocketAddr::new(
                listen.ip(),
                listen
                    .port()
                    .checked_add(EMBEDDED_CONTROLLER_PORT_OFFSET)
                    .map_or_else(
                        || {
                            bad(
                                "embedded_controller_listen",
                                "listen port too high to derive the controller port",
                            )
                        },
                        Ok,
                    )?,
            ),
        };
        let advertised_host = file
            .advertised_host
            .unwrap_or_else(|| listen.ip().to_string());
        let config = BrokerConfig {
            node_id,
            data_dir,
            listen,
            cores,
            shard_port_base,
            admin_listen,
            advertised_host,
            frame_size_bytes_max: file
                .frame_size_bytes_max
                .unwrap_or(protocol::frame::FRAME_SIZE_BYTES_MAX_DEFAULT),
            connections_per_shard_max: file.connections_per_shard_max.unwrap_or(1024),
            in_flight_requests_per_connection_max: file
                .in_flight_requests_per_connection_max
                .unwrap_or(64),
            fetch_wait_ms_max: file.fetch_wait_ms_max.unwrap_or(30_000),
            connection_idle_ms_max: file.connection_idle_ms_max.unwrap_or(600_000),
            frame_read_ms_max: file.frame_read_ms_max.unwrap_or(30_000),
            batch_cache_bytes_max: file.batch_cache_bytes_max.unwrap_or(64 << 20),
            mesh_queue_max: file.mesh_queue_max.unwrap_or(1024),
            idle_spin_us: file.idle_spin_us.unwrap_or(0),
            io_memory_bytes_per_shard: file.io_memory_bytes_per_shard.unwrap_or(64 << 20),
            blocking_threads_per_shard: file.blocking_threads_per_shard.unwrap_or(64),
            journal_ring_bytes_per_shard: file
                .journal_ring_bytes_per_shard
                .unwrap_or(crate::log::shard_journal::JOURNAL_RING_BYTES_DEFAULT),
            space_release_bytes_per_s_per_shard: file
                .space_release_bytes_per_s_per_shard
                .unwrap_or(512 << 20),
            controllers: parse_controllers(file.controller.as_deref())?,
            embedded_controller_listen,
            replica_lag_time_max_ms: file.replica_lag_time_max_ms.unwrap_or(10_000),
            log: log_config(file.log.unwrap_or_default())?,
            cleaner: cleaner_config(file.cleaner.unwrap_or_default()),
            groups: groups_config(file.groups.unwrap_or_default()),
            transactions: transactions_config(file.transactions.unwrap_or_default()),
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if !(IO_MEMORY_BYTES_PER_SHARD_MIN..=IO_MEMORY_BYTES_PER_SHARD_MAX)
            .contains(&self.io_memory_bytes_per_shard)
        {
            return bad(
                "io_memory_bytes_per_shard",
                format!(
                    "must be within {IO_MEMORY_BYTES_PER_SHARD_MIN}..={IO_MEMORY_BYTES_PER_SHARD_MAX}"
                ),
            );
        }
        let ring_bytes = self.journal_ring_bytes_per_shard;
        if ring_bytes != 0
            && (!(crate::log::journal::JOURNAL_RING_BYTES_MIN
                ..=crate::log::shard_journal::JOURNAL_RING_BYTES_MAX)
                .contains(&ring_bytes)
                || !ring_bytes.is_multiple_of(crate::log::journal::JOURNAL_BLOCK_BYTES))
        {
            return bad(
                "journal_ring_bytes_per_shard",
                format!(
                    "must be 0 (no journal) or a multiple of 4096 within {}..={}",
                    crate::log::journal::JOURNAL_RING_BYTES_MIN,
                    crate::log::shard_journal::JOURNAL_RING_BYTES_MAX
                ),
            );
        }
        if !(1..=BLOCKING_THREADS_PER_SHARD_MAX).contains(&self.blocking_threads_per_shard) {
            return bad(
                "blocking_threads_per_shard",
                format!("must be within 1..={BLOCKING_THREADS_PER_SHARD_MAX}"),
            );
        }
        if !(CLEANER_MEMORY_BYTES_MIN..=CLEANER_MEMORY_BYTES_MAX)
            .contains(&self.cleaner.memory_bytes)
        {
            return bad(
                "cleaner.memory_bytes",
                format!("must be within {CLEANER_MEMORY_BYTES_MIN}..={CLEANER_MEMORY_BYTES_MAX}"),
            );
        }
        if self.cleaner.backoff_ms == 0 {
            return bad("cleaner.backoff_ms", "must be positive");
        }
        let g = &self.groups;
        if !(1..=OFFSETS_TOPIC_PARTITIONS_MAX).contains(&g.offsets_topic_partitions) {
            return bad(
                "groups.offsets_topic_partitions",
                format!("must be within 1..={OFFSETS_TOPIC_PARTITIONS_MAX}"),
            );
        }
        if g.offsets_topic_replication_factor == 0 {
            return bad(
                "groups.offsets_topic_replication_factor",
                "must be positive",
            );
        }
        if g.offsets_topic_segment_bytes < 1 << 20 {
            return bad(
                "groups.offsets_topic_segment_bytes",
                "must be at least 1 MiB",
            );
        }
        if g.lag_probe_interval_ms < 100 {
            return bad("groups.lag_probe_interval_ms", "must be at least 100");
        }
        if g.offsets_retention_minutes == 0 || g.offsets_commit_timeout_ms == 0 {
            return bad(
                "groups",
                "offsets_retention_minutes and offsets_commit_timeout_ms must be positive",
            );
        }
        let t = &self.transactions;
        if !(1..=OFFSETS_TOPIC_PARTITIONS_MAX).contains(&t.state_topic_partitions) {
            return bad(
                "transactions.state_topic_partitions",
                format!("must be within 1..={OFFSETS_TOPIC_PARTITIONS_MAX}"),
            );
        }
        if t.state_topic_replication_factor == 0 {
            return bad(
                "transactions.state_topic_replication_factor",
                "must be positive",
            );
        }
        if t.state_topic_segment_bytes < 1 << 20 {
            return bad(
                "transactions.state_topic_segment_bytes",
                "must be at least 1 MiB",
            );
        }
        if t.id_expiration_ms < 60_000 || t.write_timeout_ms == 0 {
            return bad(
                "transactions",
                "id_expiration_ms must be at least 60000 and write_timeout_ms positive",
            );
        }
        if self.frame_size_bytes_max < 1024 || self.frame_size_bytes_max > 1 << 30 {
            return bad("frame_size_bytes_max", "must be within 1 KiB..=1 GiB");
        }
        if (self.frame_size_bytes_max as usize) < self.log.batch_bytes_max {
            return bad(
                "frame_size_bytes_max",
                "must hold at least one batch of log.batch_bytes_max",
            );
        }
        for (field, value) in [
            ("connections_per_shard_max", self.connections_per_shard_max),
            (
                "in_flight_requests_per_connection_max",
                self.in_flight_requests_per_connection_max,
            ),
            ("mesh_queue_max", self.mesh_queue_max),
        ] {
            if value == 0 {
                return bad(field, "must be positive");
            }
        }
        for (field, value) in [
            ("fetch_wait_ms_max", self.fetch_wait_ms_max),
            ("connection_idle_ms_max", self.connection_idle_ms_max),
            ("frame_read_ms_max", self.frame_read_ms_max),
            ("replica_lag_time_max_ms", self.replica_lag_time_max_ms),
        ] {
            if value == 0 {
                return bad(field, "must be positive");
            }
        }
        Ok(())
    }

    /// Shard `shard`'s port.
    pub fn shard_port(&self, shard: usize) -> u16 {
        self.shard_port_base + shard as u16
    }
}

fn parse_controllers(text: Option<&str>) -> Result<Vec<String>, ConfigError> {
    let Some(text) = text else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for endpoint in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        resolve("controller", endpoint)?;
        out.push(endpoint.to_owned());
    }
    Ok(out)
}

fn cleaner_config(file: FileCleanerConfig) -> CleanerConfig {
    let defaults = CleanerConfig::default();
    CleanerConfig {
        memory_bytes: file.memory_bytes.unwrap_or(defaults.memory_bytes),
        io_bytes_per_sec_max: file
            .io_bytes_per_sec_max
            .unwrap_or(defaults.io_bytes_per_sec_max),
        backoff_ms: file.backoff_ms.unwrap_or(defaults.backoff_ms),
    }
}

fn log_config(file: FileLogConfig) -> Result<LogConfig, ConfigError> {
    let defaults = LogConfig::default();
    let flush_policy = match file.flush_policy {
        None => defaults.flush_policy,
        Some(text) => text
            .parse::<FlushPolicy>()
            .or_else(|e| bad("log.flush_policy", e))?,
    };
    let config = LogConfig {
        segment_size_bytes: file
            .segment_size_bytes
            .unwrap_or(defaults.segment_size_bytes),
        segment_age_ms: file.segment_age_ms.unwrap_or(defaults.segment_age_ms),
        index_interval_bytes: file
            .index_interval_bytes
            .unwrap_or(defaults.index_interval_bytes),
        retention_ms: file
            .retention_ms
            .map(Some)
            .unwrap_or(defaults.retention_ms)
            .filter(|ms| *ms >= 0),
        retention_bytes: file.retention_bytes.or(defaults.retention_bytes),
        flush_policy,
        batch_bytes_max: file.batch_bytes_max.unwrap_or(defaults.batch_bytes_max),
        producer_id_expiration_ms: file
            .producer_id_expiration_ms
            .unwrap_or(defaults.producer_id_expiration_ms),
        ..defaults
    };
    config.validate().or_else(|e| bad("log", e.to_string()))?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> FileConfig {
        FileConfig {
            node_id: Some(1),
            data_dir: Some("/tmp/x".into()),
            cores: Some(1),
            ..FileConfig::default()
        }
    }

    #[test]
    fn ports_derive_from_listen() {
        let config = BrokerConfig::from_file_config(FileConfig {
            listen: Some("127.0.0.1:9192".into()),
            ..base()
        })
        .unwrap();
        assert_eq!(config.shard_port(0), 9193);
        assert_eq!(config.admin_listen.port(), 9256);
        assert_eq!(config.embedded_controller_listen.port(), 9257);
        assert_eq!(config.advertised_host, "127.0.0.1");
    }

    #[test]
    fn bad_fields_are_named() {
        let e = BrokerConfig::from_file_config(FileConfig {
            node_id: None,
            ..base()
        })
        .unwrap_err();
        assert_eq!(e.field, "node_id");
        let e = BrokerConfig::from_file_config(FileConfig {
            cores: Some(10_000),
            ..base()
        })
        .unwrap_err();
        assert_eq!(e.field, "cores");
        let e = BrokerConfig::from_file_config(FileConfig {
            listen: Some("nonsense".into()),
            ..base()
        })
        .unwrap_err();
        assert_eq!(e.field, "listen");
        let log = FileLogConfig {
            flush_policy: Some("sometimes".into()),
            ..FileLogConfig::default()
        };
        let e = BrokerConfig::from_file_config(FileConfig {
            log: Some(log),
            ..base()
        })
        .unwrap_err();
        assert_eq!(e.field, "log.flush_policy");
        let e = toml::from_str::<FileConfig>("nod_id = 3").unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
    }

    #[test]
    fn flags_override_file() {
        let file = FileConfig {
            listen: Some("127.0.0.1:1000".into()),
            ..base()
        };
        let merged = file.merge(FileConfig {
            listen: Some("127.0.0.1:2000".into()),
            ..FileConfig::default()
        });
        assert_eq!(merged.listen.as_deref(), Some("127.0.0.1:2000"));
        assert_eq!(merged.node_id, Some(1));
    }
}
