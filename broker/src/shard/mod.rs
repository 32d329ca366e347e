//! One shard: the state a pinned core owns end to end (its partition replicas,
//! their logs, roles and fetch waiters, its batch cache, its copy of the
//! cluster view, its metrics) and the typed operations other shards may ask of
//! it through the mesh. Nothing here is shared across cores. Which replicas a
//! shard holds, and whether it leads them, follows from the controller's
//! metadata: every update is applied to the view, then `reconcile` opens,
//! re-roles or removes replicas to match.
//!
//! One module per concern, all on the one `Shard` whose fields only they see:
//! `mesh` (what shards ask of each other), `produce`, `fetch` (consumers and
//! the leader side of replication), `follower` and `fetcher` (the follower
//! side), `replica` (roles, opening and removing), `reconcile` (metadata to
//! replicas), `admin` (topic admin on shard 0), `controller_link` (shard 0's
//! session with the controller), `maintenance` (periodic log work and ISR
//! checks), `cleaner` (compaction of compacted topics), `groups` and
//! `txn_coordinators` (the consumer group and transaction coordinators of
//! the `__consumer_offsets` and `__transaction_state` partitions the shard
//! leads, both hosted as `hosted` describes). The decisions they act on are pure functions in `crate::replication`, `crate::cluster_view`
//! and `crate::log::compaction`.

mod admin;
mod cleaner;
pub mod controller_link;
mod error;
mod fetch;
pub mod fetcher;
mod follower;
mod group_lag;
pub mod groups;
mod hosted;
mod maintenance;
mod mesh;
mod produce;
mod producer_ids;
mod reconcile;
mod replica;
pub mod txn_coordinators;

use std::cell::{Cell, Ref, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::Duration;

use protocol::{ErrorCode, LeaderEpoch};

use crate::batch_cache::BatchCache;
use crate::clock::Clock;
use crate::cluster_view::ClusterView;
use crate::config::BrokerConfig;
use crate::log::LogError;
use crate::metrics::ShardMetrics;
use crate::partition::PartitionKey;
use crate::runtime::shards::Mesh;
use crate::runtime::{self, OneshotSender, SerialGate, Watermark};
use protocol::BrokerId;

pub use error::OpError;
pub use groups::{GroupAnswer, GroupOp};
pub use maintenance::ineligible_for_isr;
pub use mesh::{
    FetchOutcome, FetchReader, Isolation, MeshBody, MeshMessage, PartitionDetail, ProduceOutcome,
    ShardOp, ShardReply, TopicOutcome, UNKNOWN_OFFSET,
};
pub use reconcile::{desired_replicas, DesiredReplica};
pub use replica::Replica;
pub use txn_coordinators::{TxnAnswer, TxnOp};

pub use crate::replication::leader::FollowerFetch as ReplicaFetch;
pub use crate::replication::role::Role;

/// The shard that talks to the controller and forwards topic admin.
pub const METADATA_SHARD: usize = 0;
/// How long a forwarded topic creation, deletion or config change waits for
/// every shard of this broker to serve it before answering REQUEST_TIMED_OUT
/// (the change goes on). Below clients' usual 30 s request timeout; a topic
/// of 10 000 partitions takes a few seconds on one disk.
pub const TOPIC_PROPAGATION_MS_MAX: u64 = 20_000;
/// The file in a partition directory naming the topic id it belongs to, so a
/// re-created topic of the same name never adopts an old topic's data.
pub const TOPIC_ID_FILE: &str = "topic.id";
/// How often leaders check whether their ISR should change.
pub const ISR_CHECK_MS: u64 = 100;
/// How often the logs with work queued (appends since their last
/// maintenance, a high watermark behind) do their periodic work.
pub const LOG_MAINTENANCE_MS: u64 = 5;
/// A log whose maintenance fails (a full or failing disk) is tried again
/// after doubling delays from `LOG_MAINTENANCE_MS` up to this, so thousands
/// of partitions on a full disk do not retry every tick.
pub const MAINTENANCE_RETRY_MS_MAX: u64 = 1_000;
/// While a log's maintenance keeps failing, at most one warning this often,
/// with the count of failures since the last.
pub const MAINTENANCE_WARN_INTERVAL_MS: u64 = 10_000;
/// How often every replica is looked at for work nobody queued: a
/// recovery-point checkpoint due (every 10 s at most, so a second's delay
/// is nothing), bytes left to write or sync, a leader's high watermark
/// behind. An idle replica costs a look a second instead of one per tick.
/// Producer expiry waits for the retention pass, which maintains every
/// replica.
pub const LOG_IDLE_SCAN_MS: u64 = 1_000;
/// How often retention runs.
pub const RETENTION_CHECK_MS: u64 = 5_000;
/// A transaction open this long in a partition is aborted by its leader:
/// longer than any transaction timeout a coordinator allows (15 min), so
/// only transactions no coordinator will end are.
pub const TXN_HANGING_MS: i64 = 20 * 60 * 1000;

/// Topics only the broker's coordinators write: clients cannot create,
/// delete, reconfigure or produce to them.
pub fn is_internal_topic(name: &str) -> bool {
    name == crate::group::OFFSETS_TOPIC || name == crate::txn::TXN_STATE_TOPIC
}

#[derive(Debug)]
pub struct Shard {
    id: usize,
    count: usize,
    config: Rc<BrokerConfig>,
    clock: Rc<dyn Clock>,
    view: RefCell<ClusterView>,
    /// Ordered, so every pass over the replicas (maintenance, close) takes
    /// them in the same order each run and a simulated seed replays exactly.
    replicas: RefCell<BTreeMap<PartitionKey, Rc<Replica>>>,
    /// Replicas with log work for the next maintenance tick, in the order
    /// they got it (`queue_maintenance`); idle ones are found by a slower
    /// scan, so a tick costs what is active, not what exists.
    maintenance_queue: RefCell<Vec<(PartitionKey, Rc<Replica>)>>,
    /// Saves every replica's epoch history (`replica::EpochWriter`).
    epoch_writer: Rc<replica::EpochWriter>,
    cache: RefCell<BatchCache>,
    metrics: ShardMetrics,
    mesh: Mesh<MeshMessage>,
    pending: RefCell<HashMap<u64, OneshotSender<ShardReply>>>,
    /// Fetch long polls other shards asked of this one, by (shard, request
    /// id): raised to 1 when the asker cancels.
    remote_waits: RefCell<HashMap<(usize, u64), Rc<Watermark>>>,
    next_request_id: Cell<u64>,
    admin_gate: SerialGate,
    /// Serialises applying metadata and reconciling replicas.
    apply_gate: SerialGate,
    /// Directory names of logs the last clean shutdown closed, not opened
    /// yet in this run (`trust_clean_logs`).
    clean_logs: RefCell<std::collections::HashSet<String>>,
    /// The view version whose replicas are all reconciled (on shard 0: on
    /// every shard).
    reconciled_version: Cell<u64>,
    /// The registration epoch and the first view version that showed it:
    /// the broker is caught up once that version is reconciled.
    registration_seen: Cell<Option<(u64, u64)>>,
    /// This broker's registration epoch: on shard 0 as the session learns
    /// it, on every other shard as shard 0 passes it with each metadata
    /// update; 0 before the first registration.
    broker_epoch: Cell<u64>,
    /// The controller that last answered, tried first by admin forwarding.
    controller_hint: RefCell<Option<String>>,
    /// 1 once the metadata shows this broker registered and unfenced: the
    /// shard then opens its listeners.
    serving: Watermark,
    /// Set on a stop signal, before `stopping`: the broker hands its
    /// leadership over while it still serves.
    shutting_down: Cell<bool>,
    /// Leader shard endpoints this shard runs a follower fetcher for.
    fetchers: RefCell<std::collections::HashSet<String>>,
    /// Group coordinators, by the `__consumer_offsets` partition they serve.
    coordinators: hosted::Slots<crate::group::coordinator::GroupCoordinator>,
    /// Transaction coordinators, by the `__transaction_state` partition
    /// they serve.
    txn_coordinators: hosted::Slots<crate::txn::coordinator::TxnCoordinator>,
    /// The lag of this shard's groups, as last probed.
    group_lag: RefCell<HashMap<group_lag::LagKey, group_lag::LagSample>>,
    /// On shard 0: what is left of this broker's block of producer ids.
    producer_ids: producer_ids::ProducerIdBlock,
    /// On shard 0: one block request to the controller at a time.
    producer_id_gate: SerialGate,
    stopping: Cell<bool>,
    /// The journal this shard's logs commit through under `always`
    /// (`use_journal`), if the broker keeps one.
    journal: Option<Rc<crate::log::shard_journal::ShardJournal>>,
    /// Frees removed segment files' blocks in paced steps for every log
    /// this shard opens (`use_releaser`), if the broker paces it.
    releaser: Option<Rc<crate::log::space_release::SpaceReleaser>>,
}

impl Shard {
    pub fn new(
        id: usize,
        count: usize,
        config: Rc<BrokerConfig>,
        clock: Rc<dyn Clock>,
        mesh: Mesh<MeshMessage>,
    ) -> Shard {
        let cache = BatchCache::new(config.batch_cache_bytes_max);
        Shard {
            id,
            count,
            config,
            clock,
            view: RefCell::new(ClusterView::default()),
            replicas: RefCell::new(BTreeMap::new()),
            maintenance_queue: RefCell::new(Vec::new()),
            epoch_writer: Rc::default(),
            cache: RefCell::new(cache),
            metrics: ShardMetrics::default(),
            mesh,
            pending: RefCell::new(HashMap::new()),
            remote_waits: RefCell::new(HashMap::new()),
            next_request_id: Cell::new(0),
            admin_gate: SerialGate::new(),
            apply_gate: SerialGate::new(),
            reconciled_version: Cell::new(0),
            clean_logs: RefCell::default(),
            registration_seen: Cell::new(None),
            broker_epoch: Cell::new(0),
            controller_hint: RefCell::new(None),
            serving: Watermark::new(0),
            shutting_down: Cell::new(false),
            fetchers: RefCell::new(std::collections::HashSet::new()),
            coordinators: hosted::Slots::default(),
            txn_coordinators: hosted::Slots::default(),
            group_lag: RefCell::new(HashMap::new()),
            producer_ids: producer_ids::ProducerIdBlock::default(),
            producer_id_gate: SerialGate::new(),
            stopping: Cell::new(false),
            journal: None,
            releaser: None,
        }
    }

    /// Before any replica opens: every log this shard opens from now on
    /// commits through `journal` under `always`.
    pub fn use_journal(&mut self, journal: Rc<crate::log::shard_journal::ShardJournal>) {
        self.journal = Some(journal);
    }

    /// Before any replica opens: every log this shard opens from now on
    /// leaves the space of the segment files it removes to `releaser`.
    pub fn use_releaser(&mut self, releaser: Rc<crate::log::space_release::SpaceReleaser>) {
        self.releaser = Some(releaser);
    }

    pub fn id(&self) -> usize {
        self.id
    }

    /// How many shards this broker runs.
    pub fn count(&self) -> usize {
        self.count
    }

    pub fn clock(&self) -> &Rc<dyn Clock> {
        &self.clock
    }

    /// Milliseconds on the monotonic clock, for a follower's lag (as an
    /// acks=all deadline reads `monotonic`): a wall-clock jump back would
    /// otherwise keep a dead follower in the ISR (stalling acks=all) for as
    /// long as the jump, and one forward would empty the ISR (and time out
    /// every waiting write).
    pub(super) fn monotonic_ms(&self) -> u64 {
        u64::try_from(self.clock.monotonic().as_millis()).unwrap_or(u64::MAX)
    }

    pub fn config(&self) -> &Rc<BrokerConfig> {
        &self.config
    }

    /// This shard's copy of the cluster metadata.
    pub fn view(&self) -> Ref<'_, ClusterView> {
        self.view.borrow()
    }

    pub fn metrics(&self) -> &ShardMetrics {
        &self.metrics
    }

    /// This broker's registration epoch as this shard knows it (0 before the
    /// first registration).
    pub fn broker_epoch(&self) -> u64 {
        self.broker_epoch.get()
    }

    /// Records the registration epoch the controller session obtained.
    pub fn set_broker_epoch(&self, epoch: u64) {
        self.broker_epoch.set(epoch);
    }

    /// The replica of `key` this shard holds, if any.
    pub fn replica_of(&self, key: &PartitionKey) -> Option<Rc<Replica>> {
        self.replicas.borrow().get(key).cloned()
    }

    pub fn replica_count(&self) -> usize {
        self.replicas.borrow().len()
    }

    /// Raised to 1 once the metadata shows this broker registered and
    /// unfenced.
    pub fn serving(&self) -> &Watermark {
        &self.serving
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.get()
    }

    /// Tells every loop of this shard (listeners, fetchers, maintenance,
    /// the controller session) to end.
    pub fn stop(&self) {
        self.stopping.set(true);
    }

    pub fn mesh_mut(&mut self) -> &mut Mesh<MeshMessage> {
        &mut self.mesh
    }

    pub fn broker_id(&self) -> BrokerId {
        BrokerId(u32::try_from(self.config.node_id).expect("node id validated >= 0"))
    }

    /// Whether the metadata holds this broker's current registration and
    /// this shard serves the metadata it holds.
    pub fn has_caught_up(&self) -> bool {
        let epoch = self.broker_epoch.get();
        let seen_at = match self.registration_seen.get() {
            Some((seen_epoch, version)) if seen_epoch == epoch => version,
            _ => {
                let view = self.view.borrow();
                if !view.knows_registration(self.broker_id(), epoch) {
                    return false;
                }
                self.registration_seen.set(Some((epoch, view.version.0)));
                view.version.0
            }
        };
        // Not the latest version: shard 0 installs each update before the
        // other shards apply it, so under steady metadata churn the latest
        // would never be reconciled when asked. On shard 0, reconciled means
        // every shard opened its replicas.
        self.reconciled_version.get() >= seen_at
    }

    pub fn is_serving(&self) -> bool {
        self.serving.get() > 0
    }

    /// The shard of this broker holding a partition's replica.
    pub fn owner(&self, topic: &str, partition: i32) -> Result<usize, OpError> {
        self.view
            .borrow()
            .placement(self.broker_id(), topic, partition)
            .map(|p| p.shard)
            .map_err(|e| OpError::new(e.code, e.message))
    }

    fn replica(&self, key: &PartitionKey) -> Result<Rc<Replica>, OpError> {
        self.replicas.borrow().get(key).cloned().ok_or_else(|| {
            OpError::new(
                ErrorCode::UnknownTopicOrPartition,
                format!("{}-{} is not hosted here", key.topic, key.partition),
            )
        })
    }

    /// The replica, if this broker leads it: clients produce to and fetch
    /// from leaders only.
    /// Returns the replica and its leader epoch.
    fn leader_replica(&self, key: &PartitionKey) -> Result<(Rc<Replica>, LeaderEpoch), OpError> {
        let replica = self.replica(key)?;
        let (leader, leader_epoch) = {
            let role = replica.role();
            (role.leader, role.leader_epoch)
        };
        if !leader {
            return Err(OpError::new(
                ErrorCode::NotLeaderOrFollower,
                format!(
                    "broker {} does not lead {}-{}",
                    self.config.node_id, key.topic, key.partition
                ),
            ));
        }
        Ok((replica, leader_epoch))
    }

    /// Controlled shutdown, on every shard: keep serving until the metadata
    /// shows this broker fenced (its partitions led elsewhere) or `deadline`
    /// (on the monotonic clock).
    /// Shard 0 asks the controller for it.
    pub async fn hand_over(&self, deadline: Duration) {
        self.shutting_down.set(true);
        if self.id == METADATA_SHARD {
            controller_link::request_shutdown(self, deadline).await;
        }
        let me = self.broker_id();
        while self.clock.monotonic() < deadline {
            let fenced = self.view.borrow().brokers.get(&me).is_none_or(|b| b.fenced);
            if fenced {
                return;
            }
            runtime::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A log error as the wire reports it, counted when it is the disk's fault.
    fn log_error(&self, e: LogError) -> OpError {
        if matches!(e, LogError::Io { .. } | LogError::Corrupt { .. }) {
            self.metrics.on_storage_error();
        }
        e.into()
    }

    /// The replicas held now, as owned handles: a loop over them may await
    /// while replicas are added or removed.
    fn replica_list(&self) -> Vec<(PartitionKey, Rc<Replica>)> {
        self.replicas_where(|_| true)
    }

    /// As `replica_list`, only the replicas `keep` selects.
    fn replicas_where(&self, keep: impl Fn(&Replica) -> bool) -> Vec<(PartitionKey, Rc<Replica>)> {
        self.replicas
            .borrow()
            .iter()
            .filter(|(_, r)| keep(r))
            .map(|(k, r)| (k.clone(), r.clone()))
            .collect()
    }

    /// Flushes and closes every log (graceful shutdown), each leaving its
    /// own clean-shutdown marker.
    pub async fn close_all(self: &Rc<Self>) {
        self.close_logs(true).await;
    }

    /// As `close_all` without the per-log markers, for the broker's own
    /// shutdown: returns the directory names of the logs closed cleanly,
    /// which the broker records in one file of the data dir
    /// (`log::write_clean_logs`) once every shard is done.
    pub async fn close_all_unmarked(self: &Rc<Self>) -> Vec<String> {
        self.close_logs(false).await
    }

    /// Closing is mostly waiting on fsyncs, so logs close
    /// `REPLICA_OPENS_IN_FLIGHT_MAX` at a time and the file system commits
    /// their syncs together.
    async fn close_logs(self: &Rc<Self>, marked: bool) -> Vec<String> {
        let replicas = self.replica_list();
        let mut closed = Vec::with_capacity(replicas.len());
        for group in replicas.chunks(reconcile::REPLICA_OPENS_IN_FLIGHT_MAX) {
            let closes: Vec<_> = group
                .iter()
                .map(|(key, replica)| {
                    let (key, replica) = (key.clone(), replica.clone());
                    runtime::spawn(async move {
                        let result = if marked {
                            replica.log.close().await.map(|()| false)
                        } else {
                            replica.log.close_unmarked().await
                        };
                        replica.epoch_saver.flushed().await;
                        match result {
                            // Only a log this close sealed is recorded clean.
                            Ok(sealed) => sealed
                                .then(|| replica.log.dir().file_name())
                                .flatten()
                                .map(|name| name.to_string_lossy().into_owned()),
                            Err(e) => {
                                tracing::error!(error = %e, topic = %key.topic, partition = key.partition, "closing log failed");
                                None
                            }
                        }
                    })
                })
                .collect();
            for close in closes {
                closed.extend(close.await);
            }
        }
        closed
    }

    /// Before any replica opens: the logs the last shutdown closed cleanly
    /// (`log::take_clean_logs`), which open without a rescan, each once.
    pub fn trust_clean_logs(&self, names: std::collections::HashSet<String>) {
        *self.clean_logs.borrow_mut() = names;
    }

    pub fn render_metrics(&self) -> String {
        let mut partitions: BTreeMap<PartitionKey, i64> = BTreeMap::new();
        let mut log = crate::log::LogStats::default();
        for (key, replica) in self.replicas.borrow().iter() {
            partitions.insert(key.clone(), replica.log.log_end_offset().0);
            log += replica.log.stats();
        }
        self.metrics.render(
            self.id,
            &partitions,
            crate::metrics::StorageStats {
                log,
                journal: self
                    .journal
                    .as_ref()
                    .map(|journal| journal.stats())
                    .unwrap_or_default(),
                release: self
                    .releaser
                    .as_ref()
                    .map(|releaser| releaser.stats())
                    .unwrap_or_default(),
            },
            &self.cleaner_gauges(),
            &self.group_gauges(),
            self.cache.borrow().size_bytes(),
        )
    }
}
