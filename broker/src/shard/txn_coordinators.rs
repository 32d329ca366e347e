//! Transaction coordinators on this shard: one per `__transaction_state`
//! partition the shard leads, each a `txn::coordinator::TxnCoordinator`
//! hosted as `hosted` describes (loaded from the partition's log, changes
//! appended in order, answers once replicated). A decided transaction's
//! markers are written only once its Prepare record is replicated: this
//! shard has each partition's leader write them (through the mesh on this
//! broker, WriteTxnMarkers to another broker), retrying until every
//! partition has its marker, then writes Complete. A coordinator that loads
//! a partition (after a failover) sends the markers of every prepared
//! transaction again; a partition takes a repeated marker as ending nothing.
//! Markers carry the coordinator's leader epoch, so a deposed coordinator's
//! late markers are refused.

use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use protocol::flatbuffers::FlatBufferBuilder;
use protocol::record_batch::marker::{build_marker_batch, MarkerKind, TxnMarker};
use protocol::{wire, ApiKey, ErrorCode, ProducerEpoch, ProducerId};

use super::hosted::{HostedCore, Slot, Slots};
use super::{OpError, Shard, ShardOp, ShardReply};
use crate::cluster_view::TopicSpec;
use crate::partition::PartitionKey;
use crate::runtime;
use crate::runtime::peer::PeerConnection;
use crate::txn::coordinator::{MarkerWork, TxnCoordinator, TxnCoordinatorConfig, TxnError};
use crate::txn::records::{TxnMetadata, TxnRecord};
use crate::txn::{TopicPartition, TXN_STATE_TOPIC};

/// How often coordinators abort timed-out transactions and expire ids.
pub const TXN_TICK_MS: u64 = 1_000;
/// Backoff between rounds of marker writes that left partitions without
/// their marker.
const MARKER_RETRY_MS_MIN: u64 = 20;
const MARKER_RETRY_MS_MAX: u64 = 2_000;
/// Bound on one WriteTxnMarkers round trip to another broker, and on the
/// replication wait it asks of the leader.
const MARKER_REQUEST_MS_MAX: u64 = 10_000;

/// What a producer asks of its transactional id's coordinator.
#[derive(Debug)]
pub enum TxnOp {
    InitProducerId {
        transactional_id: String,
        timeout_ms: u32,
        /// A new producer id, taken in case this id needs one.
        fresh: ProducerId,
    },
    AddPartitions {
        transactional_id: String,
        producer_id: ProducerId,
        producer_epoch: ProducerEpoch,
        partitions: Vec<TopicPartition>,
    },
    EndTxn {
        transactional_id: String,
        producer_id: ProducerId,
        producer_epoch: ProducerEpoch,
        commit: bool,
    },
    Describe(String),
}

impl TxnOp {
    fn transactional_id(&self) -> &str {
        match self {
            TxnOp::InitProducerId {
                transactional_id, ..
            }
            | TxnOp::AddPartitions {
                transactional_id, ..
            }
            | TxnOp::EndTxn {
                transactional_id, ..
            }
            | TxnOp::Describe(transactional_id) => transactional_id,
        }
    }
}

#[derive(Debug)]
pub enum TxnAnswer {
    Producer(ProducerId, ProducerEpoch),
    Done,
    Described(TxnMetadata),
}

pub(super) type TxnSlot = Slot<TxnCoordinator>;

impl HostedCore for TxnCoordinator {
    type Record = TxnRecord;
    const TOPIC: &'static str = TXN_STATE_TOPIC;

    fn slots(shard: &Shard) -> &Slots<TxnCoordinator> {
        &shard.txn_coordinators
    }

    fn fresh(shard: &Shard) -> TxnCoordinator {
        TxnCoordinator::new(TxnCoordinatorConfig {
            id_expiration_ms: shard.config.transactions.id_expiration_ms,
        })
    }

    fn replay_record(
        &mut self,
        _shard: &Shard,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), String> {
        let record = TxnRecord::decode(key, value).map_err(|e| e.to_string())?;
        self.replay(&record);
        Ok(())
    }

    fn finish_load(&mut self, _shard: &Shard) {
        self.check_invariants();
    }

    fn on_loaded(shard: &Rc<Shard>, slot: &Rc<TxnSlot>) {
        let pending = match &*slot.state.borrow() {
            super::hosted::SlotState::Active(core) => core.pending_markers(),
            _ => Vec::new(),
        };
        if !pending.is_empty() {
            tracing::info!(
                partition = slot.partition,
                transactions = pending.len(),
                "finishing prepared transactions"
            );
        }
        for work in pending {
            shard.spawn_markers(slot.clone(), work);
        }
    }

    fn encode(record: &TxnRecord) -> (bytes::Bytes, Option<bytes::Bytes>) {
        (
            record.encode_key().into(),
            record.encode_value().map(Into::into),
        )
    }

    fn write_timeout_ms(shard: &Shard) -> u64 {
        shard.config.transactions.write_timeout_ms
    }
}

fn txn_error(e: TxnError) -> OpError {
    OpError::new(e.code(), e.to_string())
}

impl Shard {
    /// Runs one request on the coordinator of `partition`; the markers it
    /// decided are sent once its records are replicated.
    pub(super) async fn txn_call(
        self: &Rc<Self>,
        partition: i32,
        op: TxnOp,
    ) -> Result<TxnAnswer, OpError> {
        let now_ms = self.clock.now_ms();
        let (markers, answer) = self
            .hosted_call(partition, |core: &mut TxnCoordinator| {
                let id = op.transactional_id().to_owned();
                let out = run_op(core, op, now_ms);
                core.check_id(&id);
                out
            })
            .await?;
        if !markers.is_empty() {
            let slot = self.txn_coordinators.get(partition);
            if let Some(slot) = slot {
                for work in markers {
                    self.spawn_markers(slot.clone(), work);
                }
            }
        }
        answer.map_err(txn_error)
    }

    /// Every transactional id this shard's coordinators hold.
    pub(super) fn list_local_transactions(&self) -> Vec<(String, TxnMetadata)> {
        let mut out = Vec::new();
        self.txn_coordinators.for_each_active(|core| {
            out.extend(core.list().map(|(id, m)| (id.clone(), m.clone())));
        });
        out
    }

    /// Aborts timed-out transactions and forgets idle ids, forever.
    pub async fn run_txn_ticks(self: Rc<Self>) {
        while !self.stopping.get() {
            runtime::sleep(Duration::from_millis(TXN_TICK_MS)).await;
            for slot in self.txn_coordinators.list() {
                let now_ms = self.clock.now_ms();
                let markers = self
                    .hosted_internal(&slot, |core: &mut TxnCoordinator| {
                        let written = core.tick(now_ms);
                        for record in &written.records {
                            core.check_id(&record.transactional_id);
                        }
                        (written.records, written.markers)
                    })
                    .await
                    .unwrap_or_default();
                if markers.is_empty() {
                    continue;
                }
                // Markers only once the abort decision is replicated; if
                // that fails, a reload of the log sends them.
                if self.wait_hosted_committed(&*slot).await.is_ok() {
                    for work in markers {
                        tracing::info!(transactional_id = %work.transactional_id, "aborting a transaction past its timeout");
                        self.spawn_markers(slot.clone(), work);
                    }
                } else {
                    self.drop_hosted(&slot);
                }
            }
        }
    }

    fn spawn_markers(self: &Rc<Self>, slot: Rc<TxnSlot>, work: MarkerWork) {
        let shard = self.clone();
        runtime::spawn(async move { shard.complete_transaction(slot, work).await }).detach();
    }

    /// Has every partition of the decided transaction write its marker,
    /// then records the transaction complete. Gives up when the slot is
    /// dropped: its next coordinator sends the markers again.
    async fn complete_transaction(self: Rc<Self>, slot: Rc<TxnSlot>, work: MarkerWork) {
        let coordinator_epoch = slot.leader_epoch.0;
        let mut remaining = work.partitions.clone();
        let mut backoff_ms = MARKER_RETRY_MS_MIN;
        loop {
            if slot.is_gone() || self.stopping.get() {
                return;
            }
            match self
                .write_markers_once(&work, coordinator_epoch, remaining)
                .await
            {
                Ok(left) if left.is_empty() => break,
                Ok(left) => remaining = left,
                Err(e) => {
                    tracing::warn!(transactional_id = %work.transactional_id, error = %e.message, "markers refused for good; a newer coordinator finishes the transaction");
                    return;
                }
            }
            runtime::sleep(Duration::from_millis(backoff_ms)).await;
            backoff_ms = (backoff_ms * 2).min(MARKER_RETRY_MS_MAX);
        }
        // Complete, retried while the partition cannot take writes (too few
        // in-sync replicas); a dropped slot's reload resends the markers.
        let mut backoff_ms = MARKER_RETRY_MS_MIN;
        while !slot.is_gone() && !self.stopping.get() {
            let now_ms = self.clock.now_ms();
            let written = self
                .hosted_internal(&slot, |core: &mut TxnCoordinator| {
                    let records = core.markers_written(&work, now_ms);
                    core.check_id(&work.transactional_id);
                    (records, ())
                })
                .await;
            if written.is_some() {
                return;
            }
            runtime::sleep(Duration::from_millis(backoff_ms)).await;
            backoff_ms = (backoff_ms * 2).min(MARKER_RETRY_MS_MAX);
        }
    }

    /// One round: every partition's leader is asked to write the marker.
    /// Returns the partitions still without it; an error when a partition
    /// knows a newer coordinator.
    async fn write_markers_once(
        self: &Rc<Self>,
        work: &MarkerWork,
        coordinator_epoch: i32,
        partitions: Vec<TopicPartition>,
    ) -> Result<Vec<TopicPartition>, OpError> {
        // Where each partition's leader is: (broker endpoint, local shard).
        let mut local: Vec<(TopicPartition, usize)> = Vec::new();
        let mut remote: HashMap<String, Vec<TopicPartition>> = HashMap::new();
        let mut left = Vec::new();
        {
            let view = self.view.borrow();
            for tp in partitions {
                let Some(topic) = view.topic(&tp.topic) else {
                    // Deleted: nothing of the transaction is left to end there.
                    continue;
                };
                let Some(record) = topic.partitions.get(tp.partition.0 as usize) else {
                    continue;
                };
                let placed = record.leader.and_then(|leader| {
                    let shard = record.replica_on(leader)?.shard.0;
                    let endpoint = view
                        .brokers
                        .get(&leader)
                        .filter(|b| !b.fenced)?
                        .endpoints
                        .shards
                        .get(usize::from(shard))?
                        .clone();
                    Some((leader == self.broker_id(), usize::from(shard), endpoint))
                });
                match placed {
                    None => left.push(tp),
                    Some((true, shard, _)) => local.push((tp, shard)),
                    Some((false, _, endpoint)) => remote.entry(endpoint).or_default().push(tp),
                }
            }
        }
        let marker = TxnMarker {
            kind: if work.commit {
                MarkerKind::Commit
            } else {
                MarkerKind::Abort
            },
            coordinator_epoch,
            transaction_number: work.transaction_number,
        };
        let batch = bytes::Bytes::from(build_marker_batch(
            work.producer_id,
            work.producer_epoch,
            marker,
            self.clock.now_ms(),
        ));
        let mut fenced = None;
        for (tp, shard) in local {
            let op = ShardOp::WriteMarker {
                key: PartitionKey {
                    topic: tp.topic.clone(),
                    partition: tp.partition.0 as i32,
                },
                batch: batch.clone(),
                timeout_ms: MARKER_REQUEST_MS_MAX,
            };
            let result = match self.call(shard, op).await {
                ShardReply::Produce(outcome) => outcome.map(|_| ()),
                other => Err(OpError::new(
                    ErrorCode::Unknown,
                    format!("unexpected reply {other:?}"),
                )),
            };
            classify(tp, result.err(), &mut left, &mut fenced);
        }
        for (endpoint, tps) in remote {
            match self
                .send_markers_to(&endpoint, work, coordinator_epoch, &tps)
                .await
            {
                Ok(results) => {
                    for (tp, error) in results {
                        classify(tp, error, &mut left, &mut fenced);
                    }
                }
                Err(e) => {
                    tracing::debug!(endpoint, error = %e, "WriteTxnMarkers failed; retrying");
                    left.extend(tps);
                }
            }
        }
        match fenced {
            Some(e) => Err(e),
            None => Ok(left),
        }
    }

    /// One WriteTxnMarkers request to another broker's shard.
    async fn send_markers_to(
        &self,
        endpoint: &str,
        work: &MarkerWork,
        coordinator_epoch: i32,
        partitions: &[TopicPartition],
    ) -> Result<Vec<(TopicPartition, Option<OpError>)>, String> {
        let body = encode_markers_request(work, coordinator_epoch, partitions);
        let mut connection = PeerConnection::open(
            endpoint,
            self.config.frame_size_bytes_max,
            MARKER_REQUEST_MS_MAX,
        )
        .await
        .map_err(|e| e.to_string())?;
        let response = connection
            .call(
                ApiKey::WriteTxnMarkers as u16,
                &body,
                &[],
                MARKER_REQUEST_MS_MAX,
            )
            .await
            .map_err(|e| e.to_string())?;
        let decoded = protocol::flatbuffers::root::<wire::WriteTxnMarkersResponse>(response.body())
            .map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        for marker in decoded.markers().iter().flatten() {
            for topic in marker.topics().iter().flatten() {
                let name = topic.name().unwrap_or_default();
                for p in topic.partitions().iter().flatten() {
                    let Ok(index) = u32::try_from(p.partition()) else {
                        continue;
                    };
                    let error = (p.error_code() != 0).then(|| {
                        OpError::new(
                            ErrorCode::from_u16(p.error_code()),
                            p.error_message().unwrap_or_default(),
                        )
                    });
                    out.push((TopicPartition::new(name, index), error));
                }
            }
        }
        // A partition the answer left out gets its marker next round.
        for tp in partitions {
            if !out.iter().any(|(t, _)| t == tp) {
                out.push((
                    tp.clone(),
                    Some(OpError::new(ErrorCode::Unknown, "no answer")),
                ));
            }
        }
        Ok(out)
    }

    /// The spec `__transaction_state` is created with.
    fn txn_topic_spec(&self) -> TopicSpec {
        let t = &self.config.transactions;
        self.internal_topic_spec(
            TXN_STATE_TOPIC,
            t.state_topic_partitions,
            t.state_topic_replication_factor,
            t.state_topic_segment_bytes,
        )
    }

    /// Shard 0 only: creates `__transaction_state` once.
    pub(super) async fn ensure_txn_topic(self: &Rc<Self>) -> Result<(), OpError> {
        let spec = self.txn_topic_spec();
        self.ensure_internal_topic(spec).await
    }
}

/// Sorts one partition's marker result: written (or no longer needed),
/// to retry, or fenced by a newer coordinator.
fn classify(
    tp: TopicPartition,
    error: Option<OpError>,
    left: &mut Vec<TopicPartition>,
    fenced: &mut Option<OpError>,
) {
    let Some(error) = error else { return };
    match error.code {
        ErrorCode::TransactionCoordinatorFenced => *fenced = Some(error),
        // The partition's producer moved past this transaction (a later
        // epoch wrote there): the marker is moot.
        ErrorCode::InvalidProducerEpoch | ErrorCode::ProducerFenced => {
            tracing::warn!(topic = %tp.topic, partition = tp.partition.0, error = %error.message, "marker not needed");
        }
        _ => left.push(tp),
    }
}

fn encode_markers_request(
    work: &MarkerWork,
    coordinator_epoch: i32,
    partitions: &[TopicPartition],
) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let topics = encode_topics(&mut fbb, partitions);
    let marker = wire::WritableTxnMarker::create(
        &mut fbb,
        &wire::WritableTxnMarkerArgs {
            producer_id: work.producer_id.0,
            producer_epoch: work.producer_epoch.0,
            commit: work.commit,
            coordinator_epoch,
            topics: Some(topics),
            transaction_number: work.transaction_number,
        },
    );
    let markers = fbb.create_vector(&[marker]);
    let root = wire::WriteTxnMarkersRequest::create(
        &mut fbb,
        &wire::WriteTxnMarkersRequestArgs {
            markers: Some(markers),
            timeout_ms: MARKER_REQUEST_MS_MAX as i32,
        },
    );
    fbb.finish(root, None);
    fbb.finished_data().to_vec()
}

/// Partitions by topic, in the `TxnMarkerTopic` shape several transaction
/// messages share. `partitions` is sorted, so each topic's run is contiguous.
pub fn encode_topics<'a>(
    fbb: &mut FlatBufferBuilder<'a>,
    partitions: &[TopicPartition],
) -> protocol::flatbuffers::WIPOffset<
    protocol::flatbuffers::Vector<
        'a,
        protocol::flatbuffers::ForwardsUOffset<wire::TxnMarkerTopic<'a>>,
    >,
> {
    let topics: Vec<_> = crate::group::runs_by_topic(partitions)
        .into_iter()
        .map(|(name, list)| {
            let name = fbb.create_string(name);
            let partitions = fbb.create_vector(&list);
            wire::TxnMarkerTopic::create(
                fbb,
                &wire::TxnMarkerTopicArgs {
                    name: Some(name),
                    partitions: Some(partitions),
                },
            )
        })
        .collect();
    fbb.create_vector(&topics)
}

type OpOut = (
    Vec<TxnRecord>,
    (Vec<MarkerWork>, Result<TxnAnswer, TxnError>),
);

fn run_op(core: &mut TxnCoordinator, op: TxnOp, now_ms: i64) -> OpOut {
    let (written, answer) = match op {
        TxnOp::InitProducerId {
            transactional_id,
            timeout_ms,
            fresh,
        } => {
            let w = core.init_producer_id(&transactional_id, timeout_ms, fresh, now_ms);
            let answer = w
                .response
                .clone()
                .map(|(id, epoch)| TxnAnswer::Producer(id, epoch));
            ((w.records, w.markers), answer)
        }
        TxnOp::AddPartitions {
            transactional_id,
            producer_id,
            producer_epoch,
            partitions,
        } => {
            let w = core.add_partitions(
                &transactional_id,
                producer_id,
                producer_epoch,
                &partitions,
                now_ms,
            );
            let answer = w.response.clone().map(|()| TxnAnswer::Done);
            ((w.records, w.markers), answer)
        }
        TxnOp::EndTxn {
            transactional_id,
            producer_id,
            producer_epoch,
            commit,
        } => {
            let w = core.end_txn(
                &transactional_id,
                producer_id,
                producer_epoch,
                commit,
                now_ms,
            );
            let answer = w.response.clone().map(|()| TxnAnswer::Done);
            ((w.records, w.markers), answer)
        }
        TxnOp::Describe(transactional_id) => {
            let answer = core
                .get(&transactional_id)
                .cloned()
                .map(TxnAnswer::Described)
                .ok_or(TxnError::NotFound(transactional_id));
            ((Vec::new(), Vec::new()), answer)
        }
    };
    (written.0, (written.1, answer))
}
