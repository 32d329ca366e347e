//! One shard: the state a pinned core owns end to end (its partition replicas,
//! their logs, roles and fetch waiters, its batch cache, its copy of the
//! cluster view, its metrics) and the typed operations other shards may ask of
//! it through the mesh. Nothing here is shared across cores. Which replicas a
//! shard holds, and whether it leads them, follows from the controller's
//! metadata: every update is applied to the view, then `reconcile` opens,
//! re-roles or removes replicas to match.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol::{ErrorCode, LeaderEpoch, Offset};

use crate::batch_cache::BatchCache;
use crate::clock::Clock;
use crate::replication::epochs::EpochHistory;
use crate::replication::leader::LeaderState;
use controller::messages::MetadataUpdate;
use controller::BrokerId;

use crate::cluster_view::{partition_dir, topic_log_config, ClusterView, TopicSpec, ViewError};
use crate::config::BrokerConfig;
use crate::log::{LogError, PartitionLog};
use crate::metrics::ShardMetrics;
use crate::runtime::shards::Mesh;
use crate::runtime::{self, oneshot, OneshotSender, SerialGate, Watermark};

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionKey {
    pub topic: String,
    pub partition: i32,
}

/// A failed partition operation, as the wire reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpError {
    pub code: ErrorCode,
    pub message: String,
}

impl OpError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> OpError {
        OpError {
            code,
            message: message.into(),
        }
    }
}

impl From<LogError> for OpError {
    fn from(e: LogError) -> OpError {
        let code = match &e {
            LogError::InvalidBatch(protocol::BatchError::TooLarge { .. }) => {
                ErrorCode::MessageTooLarge
            }
            LogError::InvalidBatch(protocol::BatchError::UnsupportedCodec(_)) => {
                ErrorCode::UnsupportedCompression
            }
            LogError::InvalidBatch(_) => ErrorCode::CorruptMessage,
            LogError::OffsetOutOfRange { .. } => ErrorCode::OffsetOutOfRange,
            LogError::StaleLeaderEpoch { .. } => ErrorCode::StaleLeaderEpoch,
            LogError::NonContiguousReplica { .. } => ErrorCode::InvalidRequest,
            LogError::Io { .. } | LogError::Corrupt { .. } | LogError::Config(_) => {
                ErrorCode::StorageError
            }
            LogError::Closed => ErrorCode::ShuttingDown,
            // Only a replica that stopped leading is truncated under a reader.
            LogError::Changed => ErrorCode::NotLeaderOrFollower,
        };
        OpError::new(code, e.to_string())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProduceOutcome {
    pub base_offset: Offset,
    pub log_start_offset: Offset,
    pub log_end_offset: Offset,
}

#[derive(Clone, Debug, Default)]
pub struct FetchOutcome {
    pub error: Option<OpError>,
    pub high_watermark: i64,
    pub log_start_offset: i64,
    pub log_end_offset: i64,
    pub records: Chunks,
    /// For a follower whose log diverges: (leader epoch, its end offset).
    pub diverging: Option<(i32, i64)>,
}

pub use crate::replication::leader::FollowerFetch as ReplicaFetch;
pub use crate::replication::role::Role;

/// Stored bytes as a list of shared slices, so cached batches reach the socket
/// without being copied.
#[derive(Clone, Debug, Default)]
pub struct Chunks {
    parts: Vec<Bytes>,
    len: usize,
}

impl Chunks {
    pub fn push(&mut self, part: Bytes) {
        self.len += part.len();
        self.parts.push(part);
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn clear(&mut self) {
        self.parts.clear();
        self.len = 0;
    }

    pub fn into_parts(self) -> Vec<Bytes> {
        self.parts
    }
}

impl From<Vec<u8>> for Chunks {
    fn from(bytes: Vec<u8>) -> Chunks {
        let mut chunks = Chunks::default();
        if !bytes.is_empty() {
            chunks.push(Bytes::from(bytes));
        }
        chunks
    }
}

#[derive(Clone, Debug, Default)]
pub struct PartitionDetail {
    pub error: Option<OpError>,
    pub log_start_offset: i64,
    pub log_end_offset: i64,
    pub high_watermark: i64,
    pub size_bytes: u64,
}

/// Result of one topic in an admin request.
#[derive(Clone, Debug)]
pub struct TopicOutcome {
    pub name: String,
    pub error: Option<OpError>,
}

/// Work one shard asks of another. All data is owned so it can cross cores.
#[derive(Debug)]
pub enum ShardOp {
    Produce {
        key: PartitionKey,
        batch: Bytes,
        acks: i16,
        /// How long acks=all waits for the ISR.
        timeout_ms: u64,
    },
    Fetch {
        key: PartitionKey,
        offset: i64,
        max_bytes: usize,
        wait_ms: u64,
        /// Set when a follower fetches.
        replica: Option<ReplicaFetch>,
    },
    /// To shard 0, which forwards it to the controller.
    AlterIsr(controller::messages::AlterIsr),
    ListOffset {
        key: PartitionKey,
        timestamp_ms: i64,
    },
    Describe {
        key: PartitionKey,
    },
    /// To shard 0, which forwards it to the controller.
    CreateTopics(Vec<TopicSpec>),
    /// To shard 0, which forwards it to the controller.
    DeleteTopics(Vec<String>),
    /// From shard 0 to every shard: a controller update, and this broker's
    /// current registration epoch (0 before the first).
    ApplyMetadata {
        update: MetadataUpdate,
        broker_epoch: u64,
    },
    RenderMetrics,
}

#[derive(Debug)]
pub enum ShardReply {
    Produce(Result<ProduceOutcome, OpError>),
    Fetch(FetchOutcome),
    ListOffset(Result<i64, OpError>),
    Describe(PartitionDetail),
    Admin(Vec<TopicOutcome>),
    AlterIsr(Result<(Vec<u32>, i32), OpError>),
    Applied,
    Metrics(String),
}

/// A message on the mesh.
#[derive(Debug)]
pub struct MeshMessage {
    pub from: usize,
    pub id: u64,
    pub body: MeshBody,
}

#[derive(Debug)]
pub enum MeshBody {
    Request(ShardOp),
    Reply(ShardReply),
    /// The requester no longer wants the answer to request `id`: a fetch
    /// long poll stops waiting at once instead of at its deadline.
    Cancel,
}

/// A partition replica this shard owns.
#[derive(Debug)]
pub struct Replica {
    pub topic_id: u64,
    pub log: Rc<PartitionLog>,
    /// The log end offset, for follower fetch long-polls to wait on.
    pub log_end: Watermark,
    /// Offsets below it are on every in-sync replica; consumers read only
    /// below it and wait on it.
    pub high_watermark: Watermark,
    pub role: RefCell<Role>,
    /// While leading: the followers' progress.
    pub leader_state: RefCell<Option<LeaderState>>,
    pub epochs: RefCell<EpochHistory>,
    /// An AlterIsr for this partition is on its way; no second one meanwhile.
    pub alter_isr_in_flight: Cell<bool>,
    /// Counts role changes: work that awaited (a follower's cut, an acks=all
    /// wait) checks it did not change meanwhile, and waits on it to learn
    /// of a change at once.
    pub role_version: Watermark,
}

impl Replica {
    /// Whether this broker still leads the partition at `leader_epoch`.
    pub fn leads_at(&self, leader_epoch: i32) -> bool {
        let role = self.role.borrow();
        role.leader && role.leader_epoch == leader_epoch
    }
}

/// The shard that talks to the controller and forwards topic admin.
pub const METADATA_SHARD: usize = 0;
/// How long a forwarded topic creation or deletion waits for the broker's own
/// metadata to show it before answering.
pub const TOPIC_PROPAGATION_MS_MAX: u64 = 5_000;
/// The file in a partition directory naming the topic id it belongs to, so a
/// re-created topic of the same name never adopts an old topic's data.
pub const TOPIC_ID_FILE: &str = "topic.id";
/// How often leaders check whether their ISR should change.
pub const ISR_CHECK_MS: u64 = 100;
/// Topic config: in-sync replicas acks=all needs.
pub const MIN_INSYNC_REPLICAS: &str = "min.insync.replicas";
/// How often each replica's log does its periodic work.
pub const LOG_MAINTENANCE_MS: u64 = 5;
/// How often retention runs.
pub const RETENTION_CHECK_MS: u64 = 5_000;

#[derive(Debug)]
pub struct Shard {
    pub id: usize,
    pub count: usize,
    pub config: Rc<BrokerConfig>,
    pub clock: Rc<dyn Clock>,
    pub view: RefCell<ClusterView>,
    pub replicas: RefCell<HashMap<PartitionKey, Rc<Replica>>>,
    pub cache: RefCell<BatchCache>,
    pub metrics: ShardMetrics,
    mesh: Mesh<MeshMessage>,
    pending: RefCell<HashMap<u64, OneshotSender<ShardReply>>>,
    /// Fetch long polls other shards asked of this one, by (shard, request
    /// id): raised to 1 when the asker cancels.
    remote_waits: RefCell<HashMap<(usize, u64), Rc<Watermark>>>,
    next_request_id: Cell<u64>,
    admin_gate: SerialGate,
    /// Serialises applying metadata and reconciling replicas.
    apply_gate: SerialGate,
    /// The view version whose replicas are all reconciled.
    reconciled_version: Cell<u64>,
    /// This broker's registration epoch: on shard 0 as the session learns
    /// it, on every other shard as shard 0 passes it with each metadata
    /// update; 0 before the first registration.
    pub broker_epoch: Cell<u64>,
    /// The controller that last answered, tried first by admin forwarding.
    pub controller_hint: RefCell<Option<String>>,
    /// 1 once the metadata shows this broker registered and unfenced: the
    /// shard then opens its listeners.
    pub serving: Watermark,
    /// Set on a stop signal, before `stopping`: the broker hands its
    /// leadership over while it still serves.
    pub shutting_down: Cell<bool>,
    /// Leader shard endpoints this shard runs a follower fetcher for.
    pub fetchers: RefCell<std::collections::HashSet<String>>,
    pub stopping: Cell<bool>,
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
            replicas: RefCell::new(HashMap::new()),
            cache: RefCell::new(cache),
            metrics: ShardMetrics::default(),
            mesh,
            pending: RefCell::new(HashMap::new()),
            remote_waits: RefCell::new(HashMap::new()),
            next_request_id: Cell::new(0),
            admin_gate: SerialGate::new(),
            apply_gate: SerialGate::new(),
            reconciled_version: Cell::new(0),
            broker_epoch: Cell::new(0),
            controller_hint: RefCell::new(None),
            serving: Watermark::new(0),
            shutting_down: Cell::new(false),
            fetchers: RefCell::new(std::collections::HashSet::new()),
            stopping: Cell::new(false),
        }
    }

    pub fn mesh_mut(&mut self) -> &mut Mesh<MeshMessage> {
        &mut self.mesh
    }

    pub fn broker_id(&self) -> BrokerId {
        BrokerId(u32::try_from(self.config.node_id).expect("node id validated >= 0"))
    }

    /// Whether the metadata holds this broker's current registration.
    pub fn has_caught_up(&self) -> bool {
        self.view
            .borrow()
            .knows_registration(self.broker_id(), self.broker_epoch.get())
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
    fn leader_replica(&self, key: &PartitionKey) -> Result<(Rc<Replica>, i32), OpError> {
        let replica = self.replica(key)?;
        let (leader, leader_epoch) = {
            let role = replica.role.borrow();
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

    /// Runs `op` on shard `to`: directly when it is this shard, else through
    /// the mesh. Dropping the returned future before it completes cancels a
    /// fetch long poll on the other shard too.
    pub async fn call(self: &Rc<Self>, to: usize, op: ShardOp) -> ShardReply {
        if to == self.id {
            return self.execute(op).await;
        }
        let id = self.next_request_id.get();
        self.next_request_id.set(id + 1);
        let (sender, receiver) = oneshot();
        self.pending.borrow_mut().insert(id, sender);
        let mut guard = PendingCall {
            shard: self,
            to,
            id,
            cancel_on_drop: matches!(&op, ShardOp::Fetch { wait_ms, .. } if *wait_ms > 0),
            answered: false,
        };
        if self
            .mesh
            .send(
                to,
                MeshMessage {
                    from: self.id,
                    id,
                    body: MeshBody::Request(op),
                },
            )
            .await
            .is_err()
        {
            guard.answered = true;
            self.pending.borrow_mut().remove(&id);
            return ShardReply::Admin(vec![]);
        }
        let reply = receiver.await.expect("every mesh request is answered");
        guard.answered = true;
        reply
    }

    /// Handles one message from another shard.
    pub fn on_mesh_message(self: &Rc<Self>, message: MeshMessage) {
        let (from, id) = (message.from, message.id);
        match message.body {
            MeshBody::Reply(reply) => {
                let sender = self.pending.borrow_mut().remove(&id);
                if let Some(sender) = sender {
                    sender.send(reply);
                }
            }
            MeshBody::Cancel => {
                if let Some(flag) = self.remote_waits.borrow().get(&(from, id)) {
                    flag.advance(1);
                }
            }
            MeshBody::Request(op) => {
                let shard = self.clone();
                runtime::spawn(async move {
                    let reply = match op {
                        ShardOp::Fetch {
                            key,
                            offset,
                            max_bytes,
                            wait_ms,
                            replica,
                        } if wait_ms > 0 => {
                            let cancel = Rc::new(Watermark::new(0));
                            shard
                                .remote_waits
                                .borrow_mut()
                                .insert((from, id), cancel.clone());
                            let outcome = shard
                                .fetch_local(
                                    &key,
                                    offset,
                                    max_bytes,
                                    wait_ms,
                                    replica,
                                    Some(&cancel),
                                )
                                .await;
                            shard.remote_waits.borrow_mut().remove(&(from, id));
                            ShardReply::Fetch(outcome)
                        }
                        op => shard.execute(op).await,
                    };
                    let _ = shard
                        .mesh
                        .send(
                            from,
                            MeshMessage {
                                from: shard.id,
                                id,
                                body: MeshBody::Reply(reply),
                            },
                        )
                        .await;
                })
                .detach();
            }
        }
    }

    pub async fn execute(self: &Rc<Self>, op: ShardOp) -> ShardReply {
        match op {
            ShardOp::Produce {
                key,
                batch,
                acks,
                timeout_ms,
            } => ShardReply::Produce(self.produce_local(key, batch, acks, timeout_ms).await),
            ShardOp::Fetch {
                key,
                offset,
                max_bytes,
                wait_ms,
                replica,
            } => ShardReply::Fetch(
                self.fetch_local(&key, offset, max_bytes, wait_ms, replica, None)
                    .await,
            ),
            ShardOp::AlterIsr(request) => {
                ShardReply::AlterIsr(crate::controller_link::alter_isr(self, request).await)
            }
            ShardOp::ListOffset { key, timestamp_ms } => {
                ShardReply::ListOffset(self.list_offset_local(&key, timestamp_ms).await)
            }
            ShardOp::Describe { key } => ShardReply::Describe(self.describe_local(&key)),
            ShardOp::CreateTopics(specs) => ShardReply::Admin(self.create_topics(specs).await),
            ShardOp::DeleteTopics(names) => ShardReply::Admin(self.delete_topics(names).await),
            ShardOp::ApplyMetadata {
                update,
                broker_epoch,
            } => {
                self.apply_metadata(update, broker_epoch).await;
                ShardReply::Applied
            }
            ShardOp::RenderMetrics => ShardReply::Metrics(self.render_metrics()),
        }
    }

    async fn produce_local(
        &self,
        key: PartitionKey,
        batch: Bytes,
        acks: i16,
        timeout_ms: u64,
    ) -> Result<ProduceOutcome, OpError> {
        let (replica, leader_epoch) = self.leader_replica(&key)?;
        if self.stopping.get() {
            return Err(OpError::new(
                ErrorCode::ShuttingDown,
                "broker is shutting down",
            ));
        }
        let (isr_size, min_insync) = {
            let role = replica.role.borrow();
            (role.isr.len(), role.min_insync)
        };
        if acks == -1 && isr_size < min_insync {
            return Err(OpError::new(
                ErrorCode::NotEnoughReplicas,
                format!(
                    "{}-{} has {} in-sync replicas, fewer than min.insync.replicas {}",
                    key.topic, key.partition, isr_size, min_insync
                ),
            ));
        }
        let epoch = LeaderEpoch(leader_epoch);
        let info = replica.log.append(&batch, epoch).await?;
        self.note_epoch(&replica, leader_epoch, info.base_offset.0);
        self.cache
            .borrow_mut()
            .insert(&key, info.base_offset, info.log_end_offset, epoch, batch);
        replica.log_end.advance(info.log_end_offset.0);
        self.update_high_watermark(&replica);
        self.metrics
            .on_append(info.log_end_offset.0 - info.base_offset.0);
        // acks=1 and acks=all are answered only once the records are stable
        // under the flush policy (at least written to the file), so a crash of
        // this process right after the answer cannot lose them.
        if acks != 0 {
            if let Err(e) = replica.log.wait_for_ack(info.log_end_offset).await {
                return Err(if !replica.leads_at(leader_epoch) {
                    OpError::new(
                        ErrorCode::NotLeaderOrFollower,
                        format!(
                            "leadership of {}-{} moved before the write was durable",
                            key.topic, key.partition
                        ),
                    )
                } else {
                    e.into()
                });
            }
            self.update_high_watermark(&replica);
        }
        if acks == -1 {
            self.wait_committed(
                &key,
                &replica,
                leader_epoch,
                info.log_end_offset.0,
                timeout_ms,
            )
            .await?;
        }
        Ok(ProduceOutcome {
            base_offset: info.base_offset,
            log_start_offset: replica.log.log_start_offset(),
            log_end_offset: info.log_end_offset,
        })
    }

    /// acks=all: waits until the high watermark passes `end`, that is until
    /// every in-sync replica holds the records stably, and answers by
    /// `replication::ack::decide` as things stand then: fails at once if this
    /// broker stops leading at that epoch, refuses if the ISR shrank below
    /// `min.insync.replicas`, and times out after `timeout_ms` (the records
    /// stay in the log; they may still commit).
    async fn wait_committed(
        &self,
        key: &PartitionKey,
        replica: &Replica,
        leader_epoch: i32,
        end: i64,
        timeout_ms: u64,
    ) -> Result<(), OpError> {
        use crate::replication::ack::{decide, AckDecision, AckView};
        let deadline = self.clock.now_ms().saturating_add(timeout_ms as i64);
        loop {
            let decision = {
                let role = replica.role.borrow();
                decide(AckView {
                    leads_at_append_epoch: role.leader && role.leader_epoch == leader_epoch,
                    high_watermark: replica.high_watermark.get(),
                    batch_end: end,
                    isr_len: role.isr.len(),
                    min_insync: role.min_insync,
                })
            };
            match decision {
                AckDecision::Committed => return Ok(()),
                AckDecision::NotLeader => {
                    return Err(OpError::new(
                        ErrorCode::NotLeaderOrFollower,
                        format!(
                            "leadership of {}-{} moved before the write was replicated",
                            key.topic, key.partition
                        ),
                    ))
                }
                AckDecision::NotEnoughReplicasAfterAppend => {
                    let role = replica.role.borrow();
                    return Err(OpError::new(
                        ErrorCode::NotEnoughReplicasAfterAppend,
                        format!(
                            "{}-{}: written, but the ISR shrank to {} below min.insync.replicas {}",
                            key.topic,
                            key.partition,
                            role.isr.len(),
                            role.min_insync
                        ),
                    ));
                }
                AckDecision::Wait => {}
            }
            let now_ms = self.clock.now_ms();
            if now_ms >= deadline {
                return Err(OpError::new(
                    ErrorCode::RequestTimedOut,
                    format!(
                        "{}-{}: in-sync replicas did not confirm offset {} within {timeout_ms} ms",
                        key.topic,
                        key.partition,
                        end - 1
                    ),
                ));
            }
            let wait_ms = (deadline - now_ms).clamp(1, ISR_CHECK_MS as i64) as u64;
            let version = replica.role_version.get();
            runtime::timeout(
                Duration::from_millis(wait_ms),
                futures_lite::future::or(
                    replica.high_watermark.wait_at_least(end),
                    replica.role_version.wait_at_least(version + 1),
                ),
            )
            .await;
        }
    }

    /// Records that `epoch` starts at `start` if it is new, durably.
    fn note_epoch(&self, replica: &Replica, epoch: i32, start: i64) {
        let changed = replica.epochs.borrow_mut().assign(epoch, start);
        if changed {
            if let Err(e) = replica.epochs.borrow().save(replica.log.dir()) {
                self.metrics.on_storage_error();
                tracing::warn!(error = %e, dir = %replica.log.dir().display(), "saving the leader epoch history failed");
            }
        }
    }

    /// A leader's high watermark from its ISR's progress and its own stable
    /// offset; wakes consumers.
    fn update_high_watermark(&self, replica: &Replica) {
        let end = replica.log.stable_offset().0;
        let hw = match replica.leader_state.borrow_mut().as_mut() {
            Some(state) => state.update_high_watermark(&replica.role.borrow().isr, end),
            None => return,
        };
        replica.high_watermark.advance(hw);
    }

    async fn fetch_local(
        &self,
        key: &PartitionKey,
        offset: i64,
        max_bytes: usize,
        wait_ms: u64,
        follower: Option<ReplicaFetch>,
        cancel: Option<&Watermark>,
    ) -> FetchOutcome {
        let failed = |e: OpError| FetchOutcome {
            error: Some(e),
            high_watermark: -1,
            log_start_offset: -1,
            log_end_offset: -1,
            ..FetchOutcome::default()
        };
        let (replica, leader_epoch) = match self.leader_replica(key) {
            Ok(found) => found,
            Err(e) => return failed(e),
        };
        if let Some(f) = follower {
            if let Some(refused) =
                self.accept_follower_fetch(key, &replica, leader_epoch, &f, offset)
            {
                return refused;
            }
        }
        let deadline =
            Instant::now() + Duration::from_millis(wait_ms.min(self.config.fetch_wait_ms_max));
        loop {
            let (start, end) = (replica.log.log_start_offset(), replica.log.log_end_offset());
            let hw = replica.high_watermark.get().min(end.0);
            // Consumers read committed records only; followers read all.
            let (limit, watermark) = match follower {
                None => (Offset(hw), &replica.high_watermark),
                Some(_) => (end, &replica.log_end),
            };
            let mut outcome = FetchOutcome {
                high_watermark: hw,
                log_start_offset: start.0,
                log_end_offset: end.0,
                ..FetchOutcome::default()
            };
            if offset < start.0 || offset > end.0 {
                outcome.error = Some(OpError::new(
                    ErrorCode::OffsetOutOfRange,
                    format!("offset {offset} outside [{start}, {end}]"),
                ));
                return outcome;
            }
            let records = if offset >= limit.0 {
                Chunks::default()
            } else {
                let cached = self
                    .cache
                    .borrow()
                    .read(key, Offset(offset), max_bytes, limit);
                match cached {
                    Some((bytes, _)) => bytes,
                    None => match replica.log.read(Offset(offset), max_bytes, limit).await {
                        Ok(fetched) => Chunks::from(fetched.bytes),
                        Err(e) => {
                            outcome.error = Some(self.log_error(e));
                            return outcome;
                        }
                    },
                }
            };
            let now = Instant::now();
            let cancelled = cancel.is_some_and(|c| c.get() > 0);
            if !records.is_empty() || now >= deadline || cancelled {
                outcome.records = records;
                return outcome;
            }
            let _waiting = self.metrics.fetch_waiter();
            let woken = watermark.wait_at_least(offset + 1);
            match cancel {
                Some(cancel) => {
                    runtime::timeout(
                        deadline - now,
                        futures_lite::future::or(woken, cancel.wait_at_least(1)),
                    )
                    .await
                }
                None => runtime::timeout(deadline - now, woken).await,
            };
            if !replica.role.borrow().leader {
                return failed(OpError::new(
                    ErrorCode::NotLeaderOrFollower,
                    format!("no longer the leader of {}-{}", key.topic, key.partition),
                ));
            }
        }
    }

    /// A leader's checks of a follower's fetch at `offset`, by
    /// `replication::leader`: the leadership, the follower's incarnation, where
    /// its log diverges. Records the follower's progress and moves the high
    /// watermark when the fetch is accepted; else returns the answer to send.
    fn accept_follower_fetch(
        &self,
        key: &PartitionKey,
        replica: &Replica,
        leader_epoch: i32,
        f: &ReplicaFetch,
        offset: i64,
    ) -> Option<FetchOutcome> {
        use crate::replication::leader::{check_follower_fetch, FetchAccepted, FollowerFetchCheck};
        let refuse = |code: ErrorCode, message: String| {
            Some(FetchOutcome {
                error: Some(OpError::new(code, message)),
                high_watermark: -1,
                log_start_offset: -1,
                log_end_offset: -1,
                ..FetchOutcome::default()
            })
        };
        let end = replica.log.log_end_offset().0;
        let check = check_follower_fetch(leader_epoch, f, offset, &replica.epochs.borrow(), end);
        match check {
            FollowerFetchCheck::Serve => {}
            FollowerFetchCheck::Refuse(code, message) => return refuse(code, message),
            FollowerFetchCheck::Diverging { epoch, end_offset } => {
                return Some(FetchOutcome {
                    high_watermark: replica.high_watermark.get(),
                    log_start_offset: replica.log.log_start_offset().0,
                    log_end_offset: end,
                    diverging: Some((epoch, end_offset)),
                    ..FetchOutcome::default()
                })
            }
        }
        // An incarnation older than the one the metadata registered is a
        // zombie: its progress may not be on any disk that still counts.
        let registered = self
            .view
            .borrow()
            .brokers
            .get(&BrokerId(f.broker_id))
            .map(|b| b.epoch.0 as i64);
        if registered.is_some_and(|r| f.broker_epoch < r) {
            return refuse(
                ErrorCode::NotLeaderOrFollower,
                format!(
                    "broker {} fetches at epoch {}, registered at {}",
                    f.broker_id,
                    f.broker_epoch,
                    registered.unwrap_or_default()
                ),
            );
        }
        let now_ms = self.clock.now_ms().max(0) as u64;
        let accepted = replica
            .leader_state
            .borrow_mut()
            .as_mut()
            .map(|s| s.on_fetch(f.broker_id, f.broker_epoch, offset, end, now_ms));
        match accepted {
            Some(FetchAccepted::Accepted) => {
                self.update_high_watermark(replica);
                None
            }
            Some(FetchAccepted::StaleBrokerEpoch) => refuse(
                ErrorCode::NotLeaderOrFollower,
                format!(
                    "broker {} fetches from an older incarnation (epoch {})",
                    f.broker_id, f.broker_epoch
                ),
            ),
            Some(FetchAccepted::NotReplica) | None => refuse(
                ErrorCode::NotLeaderOrFollower,
                format!(
                    "broker {} is not a replica of {}-{}",
                    f.broker_id, key.topic, key.partition
                ),
            ),
        }
    }

    async fn list_offset_local(
        &self,
        key: &PartitionKey,
        timestamp_ms: i64,
    ) -> Result<i64, OpError> {
        let (replica, _) = self.leader_replica(key)?;
        match timestamp_ms {
            -2 => Ok(replica.log.log_start_offset().0),
            // The latest offset a consumer can read up to.
            -1 => Ok(replica
                .high_watermark
                .get()
                .min(replica.log.log_end_offset().0)),
            ts if ts < 0 => Err(OpError::new(
                ErrorCode::InvalidRequest,
                format!("timestamp {ts} is not -2, -1 or a time"),
            )),
            ts => Ok(replica
                .log
                .offset_for_timestamp(ts)
                .await
                .map_err(|e| self.log_error(e))?
                .map_or(-1, |o| o.0)),
        }
    }

    fn describe_local(&self, key: &PartitionKey) -> PartitionDetail {
        match self.replica(key) {
            Err(e) => PartitionDetail {
                error: Some(e),
                ..PartitionDetail::default()
            },
            Ok(r) => PartitionDetail {
                error: None,
                log_start_offset: r.log.log_start_offset().0,
                log_end_offset: r.log.log_end_offset().0,
                high_watermark: r.high_watermark.get().min(r.log.log_end_offset().0),
                size_bytes: r.log.size_bytes(),
            },
        }
    }

    /// Shard 0 only: checks what it can, forwards the rest to the controller,
    /// then waits until this broker's metadata shows each created topic.
    async fn create_topics(self: &Rc<Self>, specs: Vec<TopicSpec>) -> Vec<TopicOutcome> {
        assert_eq!(self.id, METADATA_SHARD, "topic admin runs on shard 0");
        let _gate = self.admin_gate.enter().await;
        let mut outcomes: Vec<TopicOutcome> = Vec::with_capacity(specs.len());
        let mut valid = Vec::new();
        for spec in specs {
            let error = spec
                .validate(&self.config.log)
                .err()
                .map(|e| OpError::new(e.code, e.message));
            if error.is_none() {
                valid.push(spec.clone());
            }
            outcomes.push(TopicOutcome {
                name: spec.name,
                error,
            });
        }
        if !valid.is_empty() {
            let forwarded = crate::controller_link::forward_create(self, &valid).await;
            let created: Vec<String> = forwarded
                .iter()
                .filter(|o| o.error.is_none())
                .map(|o| o.name.clone())
                .collect();
            merge_outcomes(&mut outcomes, forwarded);
            self.await_view(|view| created.iter().all(|name| view.topic(name).is_some()))
                .await;
        }
        outcomes
    }

    /// Shard 0 only: forwards deletions, then waits until this broker's
    /// metadata no longer shows them.
    async fn delete_topics(self: &Rc<Self>, names: Vec<String>) -> Vec<TopicOutcome> {
        assert_eq!(self.id, METADATA_SHARD, "topic admin runs on shard 0");
        let _gate = self.admin_gate.enter().await;
        let outcomes = crate::controller_link::forward_delete(self, &names).await;
        let deleted: Vec<String> = outcomes
            .iter()
            .filter(|o| o.error.is_none())
            .map(|o| o.name.clone())
            .collect();
        self.await_view(|view| deleted.iter().all(|name| view.topic(name).is_none()))
            .await;
        outcomes
    }

    /// Waits, bounded, until `done` holds for this shard's view and its
    /// replicas match that view. Shard 0 applies an update last, so then
    /// every shard has it.
    async fn await_view(&self, done: impl Fn(&ClusterView) -> bool) {
        let deadline = Instant::now() + Duration::from_millis(TOPIC_PROPAGATION_MS_MAX);
        while Instant::now() < deadline {
            {
                let view = self.view.borrow();
                if done(&view) && self.reconciled_version.get() >= view.version.0 {
                    return;
                }
            }
            runtime::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Shard 0 only: applies a controller update on every other shard, then
    /// here. The update is checked against a copy first, so a bad one is
    /// refused before any shard changes.
    pub async fn publish_metadata(self: Rc<Self>, update: MetadataUpdate) -> Result<(), ViewError> {
        assert_eq!(self.id, METADATA_SHARD, "metadata arrives on shard 0");
        let mut next = self.view.borrow().clone();
        next.apply(update.clone())?;
        let broker_epoch = self.broker_epoch.get();
        let calls: Vec<_> = (0..self.count)
            .filter(|&to| to != self.id)
            .map(|to| {
                let (shard, update) = (self.clone(), update.clone());
                runtime::spawn(async move {
                    shard
                        .call(
                            to,
                            ShardOp::ApplyMetadata {
                                update,
                                broker_epoch,
                            },
                        )
                        .await
                })
            })
            .collect();
        for call in calls {
            call.await;
        }
        let _gate = self.apply_gate.enter().await;
        *self.view.borrow_mut() = next;
        self.after_view_change(broker_epoch).await;
        Ok(())
    }

    async fn apply_metadata(self: &Rc<Self>, update: MetadataUpdate, broker_epoch: u64) {
        let _gate = self.apply_gate.enter().await;
        self.broker_epoch.set(broker_epoch);
        if let Err(e) = self.view.borrow_mut().apply(update) {
            // Shard 0 checked this update against the same view.
            panic!(
                "shard {}: metadata update refused after check: {e}",
                self.id
            );
        }
        self.after_view_change(broker_epoch).await;
    }

    /// With the apply gate held: replicas, fetchers and serving follow the
    /// view just installed.
    async fn after_view_change(self: &Rc<Self>, broker_epoch: u64) {
        self.reconcile().await;
        self.ensure_fetchers();
        self.reconciled_version.set(self.view.borrow().version.0);
        let me = self.broker_id();
        if !self.is_serving()
            && self
                .view
                .borrow()
                .is_registered_and_unfenced(me, broker_epoch)
        {
            self.serving.advance(1);
        }
    }

    /// Makes this shard's replicas match the view: opens replicas placed
    /// here, updates roles, and removes replicas of deleted topics.
    async fn reconcile(&self) {
        let me = self.broker_id();
        let mut wanted: HashMap<PartitionKey, (u64, Role, crate::log::LogConfig)> = HashMap::new();
        {
            let view = self.view.borrow();
            for topic in view.topics.values() {
                let log_config = match topic_log_config(&self.config.log, &topic.config) {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::error!(topic = %topic.name, error = %e.message, "topic config unusable here; not hosting it");
                        continue;
                    }
                };
                for (index, partition) in topic.partitions.iter().enumerate() {
                    let Some(replica) = partition.replica_on(me) else {
                        continue;
                    };
                    if usize::from(replica.shard.0) != self.id {
                        continue;
                    }
                    let key = PartitionKey {
                        topic: topic.name.clone(),
                        partition: i32::try_from(index).expect("partition count bounded"),
                    };
                    let leader_endpoint = partition.leader.filter(|&l| l != me).and_then(|l| {
                        let shard = partition.replica_on(l)?.shard.0;
                        view.brokers
                            .get(&l)?
                            .endpoints
                            .shards
                            .get(usize::from(shard))
                            .cloned()
                    });
                    let role = Role {
                        leader: partition.leader == Some(me),
                        leader_epoch: partition.leader_epoch.0,
                        partition_epoch: partition.partition_epoch.0,
                        replicas: partition.replicas.iter().map(|r| r.broker_id.0).collect(),
                        isr: partition.isr.iter().map(|b| b.0).collect(),
                        min_insync: min_insync(&topic.config),
                        leader_endpoint,
                    };
                    wanted.insert(key, (topic.id.0, role, log_config.clone()));
                }
            }
        }
        let gone: Vec<PartitionKey> = self
            .replicas
            .borrow()
            .iter()
            .filter(|(k, r)| wanted.get(*k).is_none_or(|(id, _, _)| *id != r.topic_id))
            .map(|(k, _)| k.clone())
            .collect();
        for key in gone {
            self.remove_replica(&key).await;
        }
        for (key, (topic_id, role, log_config)) in wanted {
            let existing = self.replicas.borrow().get(&key).cloned();
            match existing {
                Some(replica) => self.set_role(&key, &replica, role),
                None => match self.open_replica(&key, topic_id, log_config).await {
                    Ok(log) => {
                        let log_end = Watermark::new(log.log_end_offset().0);
                        // Only the latest epoch is known without a history
                        // file: a follower that asks about older ones is cut
                        // back further than needed, never too little.
                        let fallback = if log.log_end_offset() > log.log_start_offset() {
                            EpochHistory::from_entries(vec![(
                                log.latest_epoch().0,
                                log.log_start_offset().0,
                            )])
                        } else {
                            EpochHistory::default()
                        };
                        let epochs =
                            EpochHistory::load(log.dir(), log.log_end_offset().0, fallback);
                        let replica = Rc::new(Replica {
                            topic_id,
                            log,
                            log_end,
                            high_watermark: Watermark::new(0),
                            role: RefCell::new(Role::opened(&role)),
                            leader_state: RefCell::new(None),
                            epochs: RefCell::new(epochs),
                            alter_isr_in_flight: Cell::new(false),
                            role_version: Watermark::new(0),
                        });
                        self.replicas
                            .borrow_mut()
                            .insert(key.clone(), replica.clone());
                        self.set_role(&key, &replica, role);
                    }
                    Err(e) => {
                        self.metrics.on_storage_error();
                        tracing::error!(topic = %key.topic, partition = key.partition, error = %e, "cannot open replica");
                    }
                },
            }
        }
    }

    /// Controlled shutdown, on every shard: keep serving until the metadata
    /// shows this broker fenced (its partitions led elsewhere) or `deadline`.
    /// Shard 0 asks the controller for it.
    pub async fn hand_over(&self, deadline: Instant) {
        self.shutting_down.set(true);
        if self.id == METADATA_SHARD {
            crate::controller_link::request_shutdown(self, deadline).await;
        }
        let me = self.broker_id();
        while Instant::now() < deadline {
            let fenced = self.view.borrow().brokers.get(&me).is_none_or(|b| b.fenced);
            if fenced {
                return;
            }
            runtime::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Starts a follower fetcher for every leader endpoint some follower
    /// replica here needs and none runs for yet.
    fn ensure_fetchers(self: &Rc<Self>) {
        let endpoints: std::collections::BTreeSet<String> = self
            .replicas
            .borrow()
            .values()
            .filter_map(|r| {
                let role = r.role.borrow();
                (!role.leader)
                    .then(|| role.leader_endpoint.clone())
                    .flatten()
            })
            .collect();
        for endpoint in endpoints {
            if self.fetchers.borrow_mut().insert(endpoint.clone()) {
                tracing::info!(shard = self.id, leader = %endpoint, "starting follower fetcher");
                runtime::spawn(crate::replication::fetcher::run(self.clone(), endpoint)).detach();
            }
        }
    }

    /// Follower replicas fetching from `endpoint`: (key, replica, leader epoch).
    pub fn followers_of(&self, endpoint: &str) -> Vec<(PartitionKey, Rc<Replica>, i32)> {
        self.replicas
            .borrow()
            .iter()
            .filter_map(|(k, r)| {
                let role = r.role.borrow();
                (!role.leader && role.leader_endpoint.as_deref() == Some(endpoint))
                    .then(|| (k.clone(), r.clone(), role.leader_epoch))
            })
            .collect()
    }

    /// A follower applies its leader's answer for one partition as
    /// `replication::follower::decide` says: cut a diverged suffix, restart at
    /// the leader's log start, or append the records and take the high
    /// watermark. Stops wherever the replica stopped following at
    /// `leader_epoch` while it awaited; an error means "back off".
    pub async fn apply_fetched(
        &self,
        key: &PartitionKey,
        replica: &Replica,
        leader_epoch: i32,
        fetched: crate::replication::fetcher::Fetched,
    ) -> Result<(), OpError> {
        use crate::replication::follower::{decide, FollowerAction, LeaderAnswer};
        let still_following = || {
            let role = replica.role.borrow();
            !role.leader && role.leader_epoch == leader_epoch
        };
        if !still_following() {
            return Ok(());
        }
        let answer = LeaderAnswer {
            error: fetched.error,
            high_watermark: fetched.high_watermark,
            log_start_offset: fetched.log_start_offset,
            log_end_offset: fetched.log_end_offset,
            diverging: fetched.diverging,
        };
        let own_end = replica.log.log_end_offset().0;
        let action = decide(&answer, own_end, &replica.epochs.borrow());
        match action {
            FollowerAction::Retry => Err(OpError::new(
                fetched.error,
                format!("leader refused the fetch at {own_end}"),
            )),
            FollowerAction::Truncate(cut) => {
                tracing::warn!(topic = %key.topic, partition = key.partition, from = own_end, to = cut, leader_epoch, "truncating a diverged follower log");
                let cut_done = replica
                    .log
                    .truncate_to_if(Offset(cut), &still_following)
                    .await
                    .map_err(|e| self.log_error(e))?;
                if let Some(new_end) = cut_done {
                    self.after_cut(key, replica, new_end.0);
                }
                Ok(())
            }
            FollowerAction::RestartAt(start) => {
                tracing::warn!(topic = %key.topic, partition = key.partition, own_end, leader_log_start = start, "the leader's log starts past this replica's end; starting over there");
                let done = replica
                    .log
                    .reset_to_if(Offset(start), &still_following)
                    .await
                    .map_err(|e| self.log_error(e))?;
                if done {
                    self.after_cut(key, replica, start);
                    // Everything below the leader's log start is committed.
                    replica.high_watermark.set(start);
                }
                Ok(())
            }
            FollowerAction::Append => {
                self.append_fetched(replica, &fetched.records, &still_following)
                    .await?;
                if still_following() {
                    let hw = crate::replication::follower::follower_high_watermark(
                        fetched.high_watermark,
                        replica.log.log_end_offset().0,
                    );
                    replica.high_watermark.set(hw);
                }
                Ok(())
            }
        }
    }

    /// After a follower's log was cut (or restarted) so it ends at `new_end`:
    /// the epoch history, cached batches and watermarks follow the log.
    fn after_cut(&self, key: &PartitionKey, replica: &Replica, new_end: i64) {
        self.cache.borrow_mut().remove_partition(key);
        if replica.epochs.borrow_mut().truncate_to(new_end) {
            if let Err(e) = replica.epochs.borrow().save(replica.log.dir()) {
                self.metrics.on_storage_error();
                tracing::warn!(error = %e, "saving the leader epoch history failed");
            }
        }
        replica.log_end.set(new_end);
        if replica.high_watermark.get() > new_end {
            replica.high_watermark.reset(new_end);
        }
    }

    /// Appends the batches a leader sent, each validated by the log.
    async fn append_fetched(
        &self,
        replica: &Replica,
        records: &[u8],
        still_following: &dyn Fn() -> bool,
    ) -> Result<(), OpError> {
        let mut rest = records;
        while !rest.is_empty() {
            if !still_following() {
                return Ok(());
            }
            // Only the header here, to find the batch's end; the log's append
            // validates the whole batch (CRC included) once.
            let corrupt = |why: String| OpError::new(ErrorCode::CorruptMessage, why);
            let header = protocol::BatchHeader::parse(rest).map_err(|e| corrupt(e.to_string()))?;
            let used = header.total_bytes();
            if used > rest.len() {
                return Err(corrupt(format!(
                    "batch of {used} bytes, {} left in the response",
                    rest.len()
                )));
            }
            let bytes = &rest[..used];
            rest = &rest[used..];
            if header.next_offset().0 <= replica.log.log_end_offset().0 {
                continue;
            }
            let info = replica
                .log
                .append_replica(bytes)
                .await
                .map_err(|e| self.log_error(e))?;
            self.note_epoch(replica, header.partition_leader_epoch.0, info.base_offset.0);
            replica.log_end.advance(info.log_end_offset.0);
        }
        Ok(())
    }

    /// A log error as the wire reports it, counted when it is the disk's fault.
    fn log_error(&self, e: LogError) -> OpError {
        if matches!(e, LogError::Io { .. } | LogError::Corrupt { .. }) {
            self.metrics.on_storage_error();
        }
        e.into()
    }

    /// Moves a replica to the role the metadata gives it. A new leadership
    /// (or a new epoch of it) starts its epoch at the log end and tracks its
    /// followers afresh; a follower drops the leader state and is fetched for
    /// by `replication::fetcher`.
    fn set_role(&self, key: &PartitionKey, replica: &Replica, role: Role) {
        use crate::replication::role::{role_change, RoleChange};
        let old = replica.role.borrow().clone();
        let new_leadership = match role_change(&old, &role) {
            RoleChange::Unchanged => return,
            RoleChange::Stale => {
                tracing::debug!(topic = %key.topic, partition = key.partition, held_leader_epoch = old.leader_epoch, held_partition_epoch = old.partition_epoch, got_leader_epoch = role.leader_epoch, got_partition_epoch = role.partition_epoch, "ignoring an older role");
                return;
            }
            RoleChange::Apply { new_leadership, .. } => new_leadership,
        };
        if role.leader != old.leader || role.leader_epoch != old.leader_epoch {
            tracing::info!(topic = %key.topic, partition = key.partition, leader = role.leader, leader_epoch = role.leader_epoch, isr = ?role.isr, "replica role changed");
        }
        *replica.role.borrow_mut() = role.clone();
        if new_leadership {
            let end = replica.log.log_end_offset().0;
            self.note_epoch(replica, role.leader_epoch, end);
            let now_ms = self.clock.now_ms().max(0) as u64;
            let state = LeaderState::new(
                self.broker_id().0,
                &role.replicas,
                replica.high_watermark.get().min(end),
                now_ms,
            );
            *replica.leader_state.borrow_mut() = Some(state);
            replica.alter_isr_in_flight.set(false);
        } else if !role.leader {
            *replica.leader_state.borrow_mut() = None;
        }
        replica.role_version.advance(replica.role_version.get() + 1);
        self.update_high_watermark(replica);
    }

    /// Opens (or creates) a replica's log, first removing a directory left by
    /// an older topic of the same name.
    async fn open_replica(
        &self,
        key: &PartitionKey,
        topic_id: u64,
        log_config: crate::log::LogConfig,
    ) -> Result<Rc<PartitionLog>, LogError> {
        let dir = partition_dir(&self.config.data_dir, &key.topic, key.partition);
        let marker = dir.join(TOPIC_ID_FILE);
        match std::fs::read_to_string(&marker) {
            Ok(text) if text.trim() == topic_id.to_string() => {}
            Ok(text) => {
                tracing::warn!(dir = %dir.display(), old_topic_id = %text.trim(), topic_id, "removing the data of a deleted topic of the same name");
                std::fs::remove_dir_all(&dir).map_err(|e| LogError::io(&dir, e))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(LogError::io(&marker, e)),
        }
        let log = PartitionLog::open(&dir, log_config, self.clock.clone()).await?;
        if !marker.exists() {
            crate::log::write_atomically(&dir, TOPIC_ID_FILE, topic_id.to_string().as_bytes())
                .map_err(|e| LogError::io(&marker, e))?;
        }
        Ok(log)
    }

    async fn remove_replica(&self, key: &PartitionKey) {
        let replica = self.replicas.borrow_mut().remove(key);
        self.cache.borrow_mut().remove_partition(key);
        if let Some(replica) = replica {
            tracing::info!(topic = %key.topic, partition = key.partition, "removing replica");
            if let Err(e) = replica.log.close().await {
                tracing::warn!(error = %e, topic = %key.topic, partition = key.partition, "closing a removed replica failed");
            }
            if let Err(e) = std::fs::remove_dir_all(replica.log.dir()) {
                tracing::warn!(error = %e, dir = %replica.log.dir().display(), "removing a replica's data failed");
            }
        }
    }

    /// A leader's ISR check: asks the controller (through shard 0) for the
    /// ISR its followers' progress calls for, one request at a time.
    fn check_isr(self: &Rc<Self>, key: &PartitionKey, replica: &Rc<Replica>) {
        if replica.alter_isr_in_flight.get() {
            return;
        }
        let role = replica.role.borrow().clone();
        if !role.leader {
            return;
        }
        let epoch_start = replica
            .epochs
            .borrow()
            .start_of(role.leader_epoch)
            .unwrap_or(0);
        let now_ms = self.clock.now_ms().max(0) as u64;
        let desired = replica.leader_state.borrow().as_ref().and_then(|s| {
            s.desired_isr(
                &role.isr,
                epoch_start,
                now_ms,
                self.config.replica_lag_time_max_ms,
            )
        });
        let Some(new_isr) = desired else {
            return;
        };
        let new_isr_epochs = replica
            .leader_state
            .borrow()
            .as_ref()
            .map(|s| s.member_epochs(&new_isr, self.broker_epoch.get()))
            .unwrap_or_default()
            .into_iter()
            .map(controller::BrokerEpoch)
            .collect();
        let request = controller::messages::AlterIsr {
            leader_id: self.broker_id(),
            topic_id: controller::TopicId(replica.topic_id),
            partition: controller::PartitionIndex(
                u32::try_from(key.partition).expect("partition index non-negative"),
            ),
            leader_epoch: controller::LeaderEpoch(role.leader_epoch),
            partition_epoch: controller::PartitionEpoch(role.partition_epoch),
            new_isr: new_isr.iter().map(|&b| BrokerId(b)).collect(),
            new_isr_epochs,
        };
        tracing::info!(topic = %key.topic, partition = key.partition, from = ?role.isr, to = ?new_isr, "asking to change the ISR");
        replica.alter_isr_in_flight.set(true);
        let (shard, key, replica) = (self.clone(), key.clone(), replica.clone());
        runtime::spawn(async move {
            let reply = shard.call(METADATA_SHARD, ShardOp::AlterIsr(request)).await;
            match reply {
                ShardReply::AlterIsr(Ok((isr, partition_epoch))) => {
                    // The controller's answer may arrive after a delta that
                    // already carried this change, or a newer one:
                    // `set_role` applies it only if it is the newest.
                    let current = replica.role.borrow().clone();
                    if current.leader && current.leader_epoch == role.leader_epoch {
                        let next = Role {
                            isr,
                            partition_epoch,
                            ..current
                        };
                        shard.set_role(&key, &replica, next);
                    }
                }
                ShardReply::AlterIsr(Err(e)) => {
                    tracing::info!(topic = %key.topic, partition = key.partition, error = %e.message, "ISR change refused; waiting for newer metadata");
                    // Give the metadata time to catch up before asking again.
                    runtime::sleep(Duration::from_millis(ISR_CHECK_MS * 5)).await;
                }
                other => tracing::warn!(?other, "unexpected AlterIsr reply"),
            }
            replica.alter_isr_in_flight.set(false);
        })
        .detach();
    }

    /// Periodic log work, ISR checks and retention, until the shard stops.
    pub async fn run_maintenance(self: Rc<Self>) {
        let mut last_retention = Instant::now();
        let mut last_isr_check = Instant::now();
        while !self.stopping.get() {
            runtime::sleep(Duration::from_millis(LOG_MAINTENANCE_MS)).await;
            if last_isr_check.elapsed() >= Duration::from_millis(ISR_CHECK_MS) {
                last_isr_check = Instant::now();
                let leaders: Vec<(PartitionKey, Rc<Replica>)> = self
                    .replicas
                    .borrow()
                    .iter()
                    .filter(|(_, r)| r.role.borrow().leader)
                    .map(|(k, r)| (k.clone(), r.clone()))
                    .collect();
                for (key, replica) in leaders {
                    self.check_isr(&key, &replica);
                }
            }
            let replicas: Vec<(PartitionKey, Rc<Replica>)> = self
                .replicas
                .borrow()
                .iter()
                .map(|(k, r)| (k.clone(), r.clone()))
                .collect();
            let retention_due =
                last_retention.elapsed() >= Duration::from_millis(RETENTION_CHECK_MS);
            for (key, replica) in replicas {
                if let Err(e) = replica.log.maintain().await {
                    self.metrics.on_storage_error();
                    tracing::warn!(error = %e, topic = %key.topic, partition = key.partition, "log maintenance failed");
                }
                // Write-behind and syncs move the leader's stable offset, and
                // with it the high watermark (acks=0 writes wait for nothing).
                self.update_high_watermark(&replica);
                if retention_due {
                    // Never past the high watermark: followers may still need it.
                    let limit = Offset(
                        replica
                            .high_watermark
                            .get()
                            .min(replica.log.log_end_offset().0),
                    );
                    match replica.log.enforce_retention(limit).await {
                        Ok(0) => {}
                        Ok(n) => {
                            tracing::info!(topic = %key.topic, partition = key.partition, segments = n, "retention deleted segments")
                        }
                        Err(e) => tracing::warn!(error = %e, "retention failed"),
                    }
                }
            }
            if retention_due {
                last_retention = Instant::now();
            }
        }
    }

    /// Flushes and closes every log (graceful shutdown).
    pub async fn close_all(&self) {
        let replicas: Vec<(PartitionKey, Rc<Replica>)> = self
            .replicas
            .borrow()
            .iter()
            .map(|(k, r)| (k.clone(), r.clone()))
            .collect();
        for (key, replica) in replicas {
            if let Err(e) = replica.log.close().await {
                tracing::error!(error = %e, topic = %key.topic, partition = key.partition, "closing log failed");
            }
        }
    }

    pub fn render_metrics(&self) -> String {
        let mut partitions: BTreeMap<PartitionKey, i64> = BTreeMap::new();
        for (key, replica) in self.replicas.borrow().iter() {
            partitions.insert(key.clone(), replica.log.log_end_offset().0);
        }
        self.metrics
            .render(self.id, &partitions, self.cache.borrow().size_bytes())
    }
}

/// `min.insync.replicas` of a topic, 1 when unset.
fn min_insync(config: &std::collections::BTreeMap<String, String>) -> usize {
    config
        .get(MIN_INSYNC_REPLICAS)
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1)
        .max(1)
}

/// Puts the controller's answers for the forwarded topics into `outcomes`.
fn merge_outcomes(outcomes: &mut [TopicOutcome], forwarded: Vec<TopicOutcome>) {
    for answer in forwarded {
        if let Some(slot) = outcomes
            .iter_mut()
            .find(|o| o.name == answer.name && o.error.is_none())
        {
            slot.error = answer.error;
        }
    }
}

/// A mesh request in flight; dropped before its answer came, it forgets the
/// request and, for a fetch long poll, tells the other shard to stop waiting.
struct PendingCall<'a> {
    shard: &'a Rc<Shard>,
    to: usize,
    id: u64,
    cancel_on_drop: bool,
    answered: bool,
}

impl Drop for PendingCall<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        self.shard.pending.borrow_mut().remove(&self.id);
        if self.cancel_on_drop {
            let (shard, to, id) = (self.shard.clone(), self.to, self.id);
            runtime::spawn(async move {
                let cancel = MeshMessage {
                    from: shard.id,
                    id,
                    body: MeshBody::Cancel,
                };
                let _ = shard.mesh.send(to, cancel).await;
            })
            .detach();
        }
    }
}
