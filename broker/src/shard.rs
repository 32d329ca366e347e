//! One shard: the state a pinned core owns end to end (its partition replicas,
//! their logs and fetch waiters, its batch cache, its copy of the cluster view,
//! its metrics) and the typed operations other shards may ask of it through the
//! mesh. Nothing here is shared across cores.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol::{ErrorCode, LeaderEpoch, Offset};

use crate::batch_cache::BatchCache;
use crate::clock::Clock;
use crate::cluster_view::{
    partition_dir, topic_log_config, ClusterView, MetadataStore, TopicMeta, TopicSpec,
};
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
}

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
    },
    Fetch {
        key: PartitionKey,
        offset: i64,
        max_bytes: usize,
        wait_ms: u64,
    },
    ListOffset {
        key: PartitionKey,
        timestamp_ms: i64,
    },
    Describe {
        key: PartitionKey,
    },
    /// To shard 0, the metadata owner.
    CreateTopics(Vec<TopicSpec>),
    /// To shard 0, the metadata owner.
    DeleteTopics(Vec<String>),
    /// From shard 0 to every shard.
    ApplyTopics {
        created: Vec<TopicMeta>,
        deleted: Vec<String>,
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
}

/// A partition replica this shard owns.
#[derive(Debug)]
pub struct Replica {
    pub log: Rc<PartitionLog>,
    /// The log end offset, for fetch long-polls to wait on.
    pub log_end: Watermark,
}

/// The metadata shard: owner of topic admin until the controller arrives.
pub const METADATA_SHARD: usize = 0;
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
    next_request_id: Cell<u64>,
    admin_gate: SerialGate,
    pub stopping: Cell<bool>,
}

impl Shard {
    pub fn new(
        id: usize,
        count: usize,
        config: Rc<BrokerConfig>,
        clock: Rc<dyn Clock>,
        view: ClusterView,
        mesh: Mesh<MeshMessage>,
    ) -> Shard {
        let cache = BatchCache::new(config.batch_cache_bytes_max);
        Shard {
            id,
            count,
            config,
            clock,
            view: RefCell::new(view),
            replicas: RefCell::new(HashMap::new()),
            cache: RefCell::new(cache),
            metrics: ShardMetrics::default(),
            mesh,
            pending: RefCell::new(HashMap::new()),
            next_request_id: Cell::new(0),
            admin_gate: SerialGate::new(),
            stopping: Cell::new(false),
        }
    }

    pub fn mesh_mut(&mut self) -> &mut Mesh<MeshMessage> {
        &mut self.mesh
    }

    /// The shard owning a partition, or `None` for an unknown topic/partition.
    pub fn owner(&self, topic: &str, partition: i32) -> Option<usize> {
        let view = self.view.borrow();
        let meta = view.topic(topic)?;
        (partition >= 0 && partition < meta.partitions)
            .then(|| ClusterView::shard_for(meta.id, partition, self.count))
    }

    /// Opens the logs of every partition of `topics` that this shard owns.
    pub async fn open_owned(&self, topics: &[TopicMeta]) -> Result<(), LogError> {
        for topic in topics {
            let log_config = topic_log_config(&self.config.log, &topic.configs).map_err(|e| {
                LogError::Config(crate::log::LogConfigError {
                    field: "topic",
                    reason: e.message,
                })
            })?;
            for partition in 0..topic.partitions {
                if ClusterView::shard_for(topic.id, partition, self.count) != self.id {
                    continue;
                }
                let dir = partition_dir(&self.config.data_dir, &topic.name, partition);
                let log = PartitionLog::open(&dir, log_config.clone(), self.clock.clone()).await?;
                let log_end = Watermark::new(log.log_end_offset().0);
                let key = PartitionKey {
                    topic: topic.name.clone(),
                    partition,
                };
                self.replicas
                    .borrow_mut()
                    .insert(key, Rc::new(Replica { log, log_end }));
            }
        }
        Ok(())
    }

    fn replica(&self, key: &PartitionKey) -> Result<Rc<Replica>, OpError> {
        self.replicas.borrow().get(key).cloned().ok_or_else(|| {
            OpError::new(
                ErrorCode::UnknownTopicOrPartition,
                format!("{}-{} is not hosted here", key.topic, key.partition),
            )
        })
    }

    /// Runs `op` on shard `to`: directly when it is this shard, else through the mesh.
    pub async fn call(self: &Rc<Self>, to: usize, op: ShardOp) -> ShardReply {
        if to == self.id {
            return self.execute(op).await;
        }
        let id = self.next_request_id.get();
        self.next_request_id.set(id + 1);
        let (sender, receiver) = oneshot();
        self.pending.borrow_mut().insert(id, sender);
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
            self.pending.borrow_mut().remove(&id);
            return ShardReply::Admin(vec![]);
        }
        receiver.await.expect("every mesh request is answered")
    }

    /// Handles one message from another shard.
    pub fn on_mesh_message(self: &Rc<Self>, message: MeshMessage) {
        match message.body {
            MeshBody::Reply(reply) => {
                let sender = self.pending.borrow_mut().remove(&message.id);
                if let Some(sender) = sender {
                    sender.send(reply);
                }
            }
            MeshBody::Request(op) => {
                let shard = self.clone();
                runtime::spawn(async move {
                    let reply = shard.execute(op).await;
                    let _ = shard
                        .mesh
                        .send(
                            message.from,
                            MeshMessage {
                                from: shard.id,
                                id: message.id,
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
            ShardOp::Produce { key, batch, acks } => {
                ShardReply::Produce(self.produce_local(key, batch, acks).await)
            }
            ShardOp::Fetch {
                key,
                offset,
                max_bytes,
                wait_ms,
            } => ShardReply::Fetch(self.fetch_local(&key, offset, max_bytes, wait_ms).await),
            ShardOp::ListOffset { key, timestamp_ms } => {
                ShardReply::ListOffset(self.list_offset_local(&key, timestamp_ms).await)
            }
            ShardOp::Describe { key } => ShardReply::Describe(self.describe_local(&key)),
            ShardOp::CreateTopics(specs) => ShardReply::Admin(self.create_topics(specs).await),
            ShardOp::DeleteTopics(names) => ShardReply::Admin(self.delete_topics(names).await),
            ShardOp::ApplyTopics { created, deleted } => {
                self.apply_topics(created, deleted).await;
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
    ) -> Result<ProduceOutcome, OpError> {
        let replica = self.replica(&key)?;
        if self.stopping.get() {
            return Err(OpError::new(
                ErrorCode::ShuttingDown,
                "broker is shutting down",
            ));
        }
        let info = replica.log.append(&batch, LeaderEpoch(0)).await?;
        self.cache.borrow_mut().insert(
            &key,
            info.base_offset,
            info.log_end_offset,
            LeaderEpoch(0),
            batch,
        );
        replica.log_end.advance(info.log_end_offset.0);
        self.metrics
            .on_append(info.log_end_offset.0 - info.base_offset.0);
        if acks == -1 {
            replica.log.wait_for_ack(info.log_end_offset).await?;
        }
        Ok(ProduceOutcome {
            base_offset: info.base_offset,
            log_start_offset: replica.log.log_start_offset(),
            log_end_offset: info.log_end_offset,
        })
    }

    async fn fetch_local(
        &self,
        key: &PartitionKey,
        offset: i64,
        max_bytes: usize,
        wait_ms: u64,
    ) -> FetchOutcome {
        let replica = match self.replica(key) {
            Ok(r) => r,
            Err(e) => {
                return FetchOutcome {
                    error: Some(e),
                    high_watermark: -1,
                    log_start_offset: -1,
                    log_end_offset: -1,
                    records: Chunks::default(),
                }
            }
        };
        let deadline =
            Instant::now() + Duration::from_millis(wait_ms.min(self.config.fetch_wait_ms_max));
        loop {
            let (start, end) = (replica.log.log_start_offset(), replica.log.log_end_offset());
            // Single replica: everything appended is committed, so the high
            // watermark is the log end. Replication lowers it to the ISR minimum.
            let mut outcome = FetchOutcome {
                error: None,
                high_watermark: end.0,
                log_start_offset: start.0,
                log_end_offset: end.0,
                records: Chunks::default(),
            };
            if offset < start.0 || offset > end.0 {
                outcome.error = Some(OpError::new(
                    ErrorCode::OffsetOutOfRange,
                    format!("offset {offset} outside [{start}, {end}]"),
                ));
                return outcome;
            }
            let cached = self
                .cache
                .borrow()
                .read(key, Offset(offset), max_bytes, end);
            let records = match cached {
                Some((bytes, _)) => bytes,
                None => match replica.log.read(Offset(offset), max_bytes, end).await {
                    Ok(fetched) => Chunks::from(fetched.bytes),
                    Err(e) => {
                        outcome.error = Some(e.into());
                        return outcome;
                    }
                },
            };
            let now = Instant::now();
            if !records.is_empty() || now >= deadline {
                outcome.records = records;
                return outcome;
            }
            runtime::timeout(deadline - now, replica.log_end.wait_at_least(offset + 1)).await;
        }
    }

    async fn list_offset_local(
        &self,
        key: &PartitionKey,
        timestamp_ms: i64,
    ) -> Result<i64, OpError> {
        let replica = self.replica(key)?;
        match timestamp_ms {
            -2 => Ok(replica.log.log_start_offset().0),
            -1 => Ok(replica.log.log_end_offset().0),
            ts if ts < 0 => Err(OpError::new(
                ErrorCode::InvalidRequest,
                format!("timestamp {ts} is not -2, -1 or a time"),
            )),
            ts => Ok(replica
                .log
                .offset_for_timestamp(ts)
                .await?
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
                high_watermark: r.log.log_end_offset().0,
                size_bytes: r.log.size_bytes(),
            },
        }
    }

    /// Shard 0 only: validates, persists and broadcasts new topics.
    async fn create_topics(self: &Rc<Self>, specs: Vec<TopicSpec>) -> Vec<TopicOutcome> {
        assert_eq!(
            self.id, METADATA_SHARD,
            "topic admin runs on the metadata shard"
        );
        let _gate = self.admin_gate.enter().await;
        let mut next = self.view.borrow().clone();
        let mut outcomes = Vec::new();
        let mut created = Vec::new();
        for spec in specs {
            match next.plan_create(&spec, &self.config.log, 1) {
                Ok(topic) => {
                    next.apply_create(topic.clone());
                    created.push(topic);
                    outcomes.push(TopicOutcome {
                        name: spec.name,
                        error: None,
                    });
                }
                Err(e) => outcomes.push(TopicOutcome {
                    name: spec.name,
                    error: Some(OpError::new(e.code, e.message)),
                }),
            }
        }
        self.persist_then_apply(&next, created, Vec::new(), outcomes)
            .await
    }

    /// Shard 0 only: removes topics durably, then everywhere.
    async fn delete_topics(self: &Rc<Self>, names: Vec<String>) -> Vec<TopicOutcome> {
        assert_eq!(
            self.id, METADATA_SHARD,
            "topic admin runs on the metadata shard"
        );
        let _gate = self.admin_gate.enter().await;
        let mut next = self.view.borrow().clone();
        let mut outcomes = Vec::new();
        let mut deleted = Vec::new();
        for name in names {
            if next.apply_delete(&name).is_some() {
                deleted.push(name.clone());
                outcomes.push(TopicOutcome { name, error: None });
            } else {
                outcomes.push(TopicOutcome {
                    error: Some(OpError::new(
                        ErrorCode::UnknownTopicOrPartition,
                        format!("no topic {name}"),
                    )),
                    name,
                });
            }
        }
        self.persist_then_apply(&next, Vec::new(), deleted, outcomes)
            .await
    }

    /// Persists the new view, then applies the change on every shard. If the
    /// view cannot be persisted nothing changes, and every topic the request
    /// would have changed reports the storage error.
    async fn persist_then_apply(
        self: &Rc<Self>,
        next: &ClusterView,
        created: Vec<TopicMeta>,
        deleted: Vec<String>,
        outcomes: Vec<TopicOutcome>,
    ) -> Vec<TopicOutcome> {
        if created.is_empty() && deleted.is_empty() {
            return outcomes;
        }
        if let Err(e) = MetadataStore::new(&self.config.data_dir).save(next) {
            tracing::error!(error = %e, "cannot persist topic metadata");
            return outcomes
                .into_iter()
                .map(|o| TopicOutcome {
                    error: Some(
                        o.error.unwrap_or_else(|| {
                            OpError::new(ErrorCode::StorageError, e.to_string())
                        }),
                    ),
                    ..o
                })
                .collect();
        }
        self.broadcast_apply(created, deleted).await;
        outcomes
    }

    async fn broadcast_apply(self: &Rc<Self>, created: Vec<TopicMeta>, deleted: Vec<String>) {
        let calls: Vec<_> = (0..self.count)
            .map(|to| {
                let (shard, created, deleted) = (self.clone(), created.clone(), deleted.clone());
                runtime::spawn(async move {
                    shard
                        .call(to, ShardOp::ApplyTopics { created, deleted })
                        .await
                })
            })
            .collect();
        for call in calls {
            call.await;
        }
    }

    async fn apply_topics(&self, created: Vec<TopicMeta>, deleted: Vec<String>) {
        for name in &deleted {
            self.view.borrow_mut().apply_delete(name);
            let keys: Vec<PartitionKey> = self
                .replicas
                .borrow()
                .keys()
                .filter(|k| &k.topic == name)
                .cloned()
                .collect();
            for key in keys {
                let replica = self.replicas.borrow_mut().remove(&key);
                self.cache.borrow_mut().remove_partition(&key);
                if let Some(replica) = replica {
                    if let Err(e) = replica.log.close().await {
                        tracing::warn!(error = %e, topic = %key.topic, partition = key.partition, "closing a deleted partition failed");
                    }
                    if let Err(e) = std::fs::remove_dir_all(replica.log.dir()) {
                        tracing::warn!(error = %e, dir = %replica.log.dir().display(), "removing a deleted partition failed");
                    }
                }
            }
        }
        for topic in &created {
            self.view.borrow_mut().apply_create(topic.clone());
        }
        if let Err(e) = self.open_owned(&created).await {
            tracing::error!(error = %e, "opening new partitions failed");
        }
    }

    /// Periodic log work and retention, until the shard stops.
    pub async fn run_maintenance(self: Rc<Self>) {
        let mut last_retention = Instant::now();
        while !self.stopping.get() {
            runtime::sleep(Duration::from_millis(LOG_MAINTENANCE_MS)).await;
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
                if retention_due {
                    match replica
                        .log
                        .enforce_retention(replica.log.log_end_offset())
                        .await
                    {
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
