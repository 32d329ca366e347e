//! The mesh: `ShardOp`/`ShardReply`, the complete list of what shards ask of
//! each other, and `Shard::call`, which runs an op on its owning shard (here
//! directly, elsewhere through a bounded channel) with cancellation of a fetch
//! long poll when the caller goes away.

use std::rc::Rc;

use bytes::Bytes;
use protocol::control::messages::{AlterTopicConfigSpec, MetadataUpdate};
use protocol::{BrokerId, LeaderEpoch, Offset, PartitionEpoch};

use super::{OpError, ReplicaFetch, Shard};
use crate::cluster_view::TopicSpec;
use crate::log::txn_index::AbortedTxn;
use crate::partition::{Chunks, PartitionKey};
use crate::runtime::{self, oneshot, Watermark};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProduceOutcome {
    pub base_offset: Offset,
    pub log_start_offset: Offset,
    pub log_end_offset: Offset,
    /// The batch repeated one the log holds (a producer's retry, a marker's
    /// resend): nothing was written, the offsets are the original's.
    pub duplicate: bool,
}

/// A fetch's answer. With an error the offsets are `UNKNOWN_OFFSET`.
#[derive(Clone, Debug, Default)]
pub struct FetchOutcome {
    pub error: Option<OpError>,
    pub high_watermark: Offset,
    pub log_start_offset: Offset,
    pub log_end_offset: Offset,
    /// Where read_committed consumers stop (`UNKNOWN_OFFSET` when not known).
    pub last_stable_offset: Offset,
    pub records: Chunks,
    /// For a follower whose log diverges: (leader epoch, its end offset).
    pub diverging: Option<(LeaderEpoch, Offset)>,
    /// read_committed only: aborted transactions overlapping the records.
    pub aborted: Vec<AbortedTxn>,
}

/// What a consumer's fetch may see: every batch below the high watermark,
/// or only what is stable (below the last stable offset, with the aborted
/// transactions to skip).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Isolation {
    #[default]
    ReadUncommitted,
    ReadCommitted,
}

/// Who reads: a consumer (at an isolation level) or a follower.
#[derive(Clone, Copy, Debug)]
pub enum FetchReader {
    Consumer(Isolation),
    Follower(ReplicaFetch),
}

impl FetchReader {
    pub fn new(replica: Option<ReplicaFetch>, isolation: Isolation) -> FetchReader {
        match replica {
            Some(f) => FetchReader::Follower(f),
            None => FetchReader::Consumer(isolation),
        }
    }
}

impl Isolation {
    /// The wire's `isolation_level`: 1 read_committed, anything else
    /// read_uncommitted (Kafka's reading of unknown levels).
    pub fn from_wire(level: u8) -> Isolation {
        if level == 1 {
            Isolation::ReadCommitted
        } else {
            Isolation::ReadUncommitted
        }
    }
}

/// An offset the answer does not know (the wire's -1).
pub const UNKNOWN_OFFSET: Offset = Offset(-1);

#[derive(Clone, Debug, Default)]
pub struct PartitionDetail {
    pub error: Option<OpError>,
    pub log_start_offset: Offset,
    pub log_end_offset: Offset,
    pub high_watermark: Offset,
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
    /// A transaction marker (built by the coordinator's broker) to write as
    /// leader and answer once replicated like acks=all.
    WriteMarker {
        key: PartitionKey,
        batch: Bytes,
        timeout_ms: u64,
    },
    Fetch {
        key: PartitionKey,
        offset: Offset,
        max_bytes: usize,
        wait_ms: u64,
        /// Set when a follower fetches.
        replica: Option<ReplicaFetch>,
        /// Consumers only.
        isolation: Isolation,
    },
    /// To shard 0, which forwards it to the controller.
    AlterIsr(protocol::control::messages::AlterIsr),
    ListOffset {
        key: PartitionKey,
        timestamp_ms: i64,
        isolation: Isolation,
    },
    Describe {
        key: PartitionKey,
    },
    /// To shard 0, which forwards it to the controller.
    CreateTopics(Vec<TopicSpec>),
    /// To shard 0, which forwards it to the controller.
    DeleteTopics(Vec<String>),
    /// To shard 0, which checks the resulting configs and forwards them to
    /// the controller.
    AlterTopicConfigs(Vec<AlterTopicConfigSpec>),
    /// From shard 0 to every shard: a controller update, and this broker's
    /// current registration epoch (0 before the first).
    ApplyMetadata {
        update: MetadataUpdate,
        broker_epoch: u64,
    },
    RenderMetrics,
    /// To the shard leading the group's `__consumer_offsets` partition.
    Group {
        partition: i32,
        op: super::GroupOp,
    },
    /// The groups of every coordinator on the shard.
    ListGroups,
    /// Creates `__consumer_offsets` if it does not exist yet.
    EnsureOffsetsTopic,
    /// To shard 0: a producer id from this broker's block.
    NextProducerId,
    /// To the shard leading the transactional id's `__transaction_state`
    /// partition.
    Txn {
        partition: i32,
        op: super::txn_coordinators::TxnOp,
    },
    /// The transactional ids of every transaction coordinator on the shard.
    ListTransactions,
    /// Creates `__transaction_state` if it does not exist yet.
    EnsureTxnTopic,
}

#[derive(Debug)]
pub enum ShardReply {
    Produce(Result<ProduceOutcome, OpError>),
    Fetch(FetchOutcome),
    /// The offset asked for; `UNKNOWN_OFFSET` when no record is at or
    /// after the timestamp.
    ListOffset(Result<Offset, OpError>),
    Describe(PartitionDetail),
    Admin(Vec<TopicOutcome>),
    /// The ISR and partition epoch the controller recorded.
    AlterIsr(Result<(Vec<BrokerId>, PartitionEpoch), OpError>),
    Applied,
    Metrics(String),
    Group(Result<super::GroupAnswer, OpError>),
    Groups(Vec<crate::group::coordinator::GroupSummary>),
    Ensured(Result<(), OpError>),
    ProducerId(Result<protocol::ProducerId, OpError>),
    Txn(Result<super::TxnAnswer, OpError>),
    Transactions(Vec<(String, crate::txn::records::TxnMetadata)>),
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

impl Shard {
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
                            isolation,
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
                                    FetchReader::new(replica, isolation),
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
            ShardOp::WriteMarker {
                key,
                batch,
                timeout_ms,
            } => ShardReply::Produce(self.write_marker_local(key, batch, timeout_ms).await),
            ShardOp::Fetch {
                key,
                offset,
                max_bytes,
                wait_ms,
                replica,
                isolation,
            } => ShardReply::Fetch(
                self.fetch_local(
                    &key,
                    offset,
                    max_bytes,
                    wait_ms,
                    FetchReader::new(replica, isolation),
                    None,
                )
                .await,
            ),
            ShardOp::ListOffset {
                key,
                timestamp_ms,
                isolation,
            } => {
                ShardReply::ListOffset(self.list_offset_local(&key, timestamp_ms, isolation).await)
            }
            ShardOp::Describe { key } => ShardReply::Describe(self.describe_local(&key)),
            ShardOp::RenderMetrics => ShardReply::Metrics(self.render_metrics()),
            ShardOp::ListGroups => ShardReply::Groups(self.list_local_groups()),
            ShardOp::ListTransactions => ShardReply::Transactions(self.list_local_transactions()),
            // Every call's future is as large as the largest operation's and
            // is copied whole at each spawn and move: the rest run boxed, so
            // the operations above stay small.
            op => Box::pin(self.execute_rare(op)).await,
        }
    }

    /// The operations off the produce and fetch paths, for `execute`.
    async fn execute_rare(self: &Rc<Self>, op: ShardOp) -> ShardReply {
        match op {
            ShardOp::AlterIsr(request) => {
                ShardReply::AlterIsr(super::controller_link::alter_isr(self, request).await)
            }
            ShardOp::CreateTopics(specs) => ShardReply::Admin(self.create_topics(specs).await),
            ShardOp::DeleteTopics(names) => ShardReply::Admin(self.delete_topics(names).await),
            ShardOp::AlterTopicConfigs(specs) => {
                ShardReply::Admin(self.alter_topic_configs(specs).await)
            }
            ShardOp::ApplyMetadata {
                update,
                broker_epoch,
            } => {
                self.apply_metadata(update, broker_epoch).await;
                ShardReply::Applied
            }
            ShardOp::Group { partition, op } => {
                ShardReply::Group(self.group_call(partition, op).await)
            }
            ShardOp::EnsureOffsetsTopic => ShardReply::Ensured(self.ensure_offsets_topic().await),
            ShardOp::NextProducerId => ShardReply::ProducerId(self.next_producer_id().await),
            ShardOp::Txn { partition, op } => ShardReply::Txn(self.txn_call(partition, op).await),
            ShardOp::EnsureTxnTopic => ShardReply::Ensured(self.ensure_txn_topic().await),
            ShardOp::Produce { .. }
            | ShardOp::WriteMarker { .. }
            | ShardOp::Fetch { .. }
            | ShardOp::ListOffset { .. }
            | ShardOp::Describe { .. }
            | ShardOp::RenderMetrics
            | ShardOp::ListGroups
            | ShardOp::ListTransactions => unreachable!("served by execute"),
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
