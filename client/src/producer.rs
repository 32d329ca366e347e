//! `Producer`: accepts records, batches them per partition (see
//! `accumulator.rs`), sends one produce request per leader endpoint with the
//! ready batches, retries retriable failures with exponential backoff and
//! resolves one future per record to its (partition, offset). A background
//! task owns all batching state; handles talk to it over a bounded channel.
//! Idempotent by default: the task gets a producer id from the cluster
//! before it sends anything, batches carry per-partition sequences, and a
//! batch that fails for good (so the broker may or may not hold it) makes
//! the task take a new producer id before the next first send.
//!
//! With a `transactional_id` the producer is transactional
//! (`init_transactions`, `begin_transaction`, `commit_transaction`,
//! `abort_transaction`): records are sent only inside a transaction, each
//! partition is added to the transaction at the coordinator before its
//! first batch goes out, and batches are marked transactional, so
//! read_committed consumers see them only once committed (see
//! `transaction.rs`).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use protocol::{ApiKey, ErrorCode, Record, RecordHeader};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::accumulator::{
    Accumulator, FailedSend, ProducerIdentity, SealedBatch, SendFailure, TopicPartition,
};
use crate::cluster::Cluster;
use crate::config::{Acks, ClientConfig, ProducerConfig};
use crate::error::{ClientError, Result};
use crate::messages::{self, ConsumerGroupMetadata, ProduceEntry, ProduceOutcome};
use crate::partitioner::{partition_for_key, Partitioner};
pub use crate::record::Header;
use crate::transaction::{is_fencing, TransactionManager, TxnPhase};

/// Bound on commands queued for the background task. Record bytes are
/// bounded separately by `buffer_bytes_max`.
const COMMAND_QUEUE_MAX: usize = 4096;
/// Bytes a record costs beyond its key, value and headers (varints,
/// attributes, deltas), for buffer accounting and the record bound.
const RECORD_OVERHEAD_BYTES: usize = 32;

/// A record to produce.
#[derive(Clone, Debug, Default)]
pub struct ProducerRecord {
    pub topic: String,
    /// `None` lets the partitioner choose (by key, else sticky).
    pub partition: Option<i32>,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<Header>,
    /// `None` stamps the current time.
    pub timestamp_ms: Option<i64>,
}

impl ProducerRecord {
    fn size_bytes(&self) -> usize {
        RECORD_OVERHEAD_BYTES
            + self.key.as_ref().map_or(0, Bytes::len)
            + self.value.as_ref().map_or(0, Bytes::len)
            + self
                .headers
                .iter()
                .map(|h| 8 + h.key.len() + h.value.as_ref().map_or(0, Bytes::len))
                .sum::<usize>()
    }
}

/// `(partition, offset)` of a delivered record; the offset is -1 with acks=0.
pub type Delivery = (i32, i64);

/// Resolves once the record is acknowledged (or written, with acks=0), or
/// failed for good.
#[derive(Debug)]
pub struct DeliveryFuture {
    reply: oneshot::Receiver<Result<Delivery>>,
}

impl Future for DeliveryFuture {
    type Output = Result<Delivery>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.reply)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(ClientError::ProducerClosed)))
    }
}

/// A record's completion and its share of the buffer, released when dropped.
#[derive(Debug)]
struct Ticket {
    reply: oneshot::Sender<Result<Delivery>>,
    _buffer: OwnedSemaphorePermit,
}

#[derive(Debug)]
enum Command {
    Append {
        record: ProducerRecord,
        partition: Option<i32>,
        partition_count: usize,
        ticket: Ticket,
    },
    Flush(oneshot::Sender<()>),
    Close(oneshot::Sender<()>),
    /// A transactional producer's identity from its coordinator: batches
    /// from now on carry it, with sequences from 0.
    SetIdentity(ProducerIdentity, oneshot::Sender<()>),
}

/// The producer handle. Dropping it lets the background task deliver what is
/// buffered and then stop; `close` does the same and waits.
#[derive(Debug)]
pub struct Producer {
    cluster: Cluster,
    config: ProducerConfig,
    commands: mpsc::Sender<Command>,
    buffer: Arc<Semaphore>,
    closed: AtomicBool,
    txn: Option<TransactionManager>,
}

impl Producer {
    pub async fn connect(
        bootstrap: &str,
        client_config: ClientConfig,
        config: ProducerConfig,
    ) -> Result<Producer> {
        Producer::new(Cluster::connect(bootstrap, client_config).await?, config)
    }

    /// Starts the background task; call inside a tokio runtime.
    pub fn new(cluster: Cluster, config: ProducerConfig) -> Result<Producer> {
        config.validate()?;
        let (commands, commands_rx) = mpsc::channel(COMMAND_QUEUE_MAX);
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let txn = config
            .transactional_id
            .as_deref()
            .map(|id| TransactionManager::new(cluster.clone(), id, config.transaction_timeout_ms));
        let mut accumulator = Accumulator::new(
            config.batch_bytes_max,
            Duration::from_millis(config.linger_ms),
            config.compression,
        );
        if txn.is_some() {
            accumulator.set_transactional();
        }
        accumulator.set_in_flight_max(config.in_flight_batches_per_partition_max);
        let sender = Sender {
            cluster: cluster.clone(),
            accumulator,
            partitioner: Partitioner::new(seed),
            config: config.clone(),
            in_flight: JoinSet::new(),
            // Nothing is retried with acks=0, and a lost batch would leave a
            // gap the broker refuses every later batch for: no idempotence.
            identity: if txn.is_some() {
                IdentityState::FromCoordinator
            } else if config.idempotence && config.acks != Acks::None {
                IdentityState::Missing { attempts: 0 }
            } else {
                IdentityState::NotUsed
            },
            identity_retry_at: None,
            txn: txn.clone(),
        };
        tokio::spawn(sender.run(commands_rx));
        Ok(Producer {
            cluster,
            buffer: Arc::new(Semaphore::new(config.buffer_bytes_max)),
            config,
            commands,
            closed: AtomicBool::new(false),
            txn,
        })
    }

    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// Takes a record into the buffer, waiting while `buffer_bytes_max` is
    /// reached, and returns the future of its delivery. Records enqueued one
    /// after another keep their order within a partition.
    pub async fn enqueue(&self, record: ProducerRecord) -> Result<DeliveryFuture> {
        if self.closed.load(Ordering::Acquire) {
            return Err(ClientError::ProducerClosed);
        }
        if let Some(txn) = &self.txn {
            let phase = txn.shared().phase.clone();
            if phase != TxnPhase::InTransaction {
                return Err(ClientError::InvalidTransactionState(format!(
                    "records are sent inside a transaction (the producer is {phase:?})"
                )));
            }
        }
        let size_bytes = record.size_bytes();
        if size_bytes > self.config.record_bytes_max {
            return Err(ClientError::RecordTooLarge {
                size_bytes,
                size_bytes_max: self.config.record_bytes_max,
            });
        }
        let topic = self
            .cluster
            .topic(&record.topic, self.config.retries_max + 1)
            .await?;
        let partition_count = topic.partition_count();
        let partition = match (record.partition, &record.key) {
            (Some(p), _) if topic.partition(p).is_none() => {
                return Err(ClientError::UnknownPartition {
                    topic: record.topic.clone(),
                    partition: p,
                })
            }
            (Some(p), _) => Some(p),
            (None, Some(key)) => Some(partition_for_key(key, partition_count)),
            (None, None) => None,
        };
        // A record can never need more than the whole buffer.
        let permits = size_bytes.min(self.config.buffer_bytes_max) as u32;
        let buffer = Arc::clone(&self.buffer)
            .acquire_many_owned(permits)
            .await
            .expect("the buffer semaphore is never closed");
        let (reply, reply_rx) = oneshot::channel();
        let command = Command::Append {
            record,
            partition,
            partition_count,
            ticket: Ticket {
                reply,
                _buffer: buffer,
            },
        };
        self.commands
            .send(command)
            .await
            .map_err(|_| ClientError::ProducerClosed)?;
        Ok(DeliveryFuture { reply: reply_rx })
    }

    /// Sends one record and resolves to its `(partition, offset)`.
    /// Concurrent `send` futures enter the buffer in the order they are
    /// polled; use `enqueue` to pipeline records in a fixed order.
    pub fn send(
        &self,
        topic: &str,
        key: Option<Bytes>,
        value: Option<Bytes>,
        headers: Vec<Header>,
    ) -> impl Future<Output = Result<Delivery>> + Send + '_ {
        let record = ProducerRecord {
            topic: topic.to_owned(),
            key,
            value,
            headers,
            ..ProducerRecord::default()
        };
        async move { self.enqueue(record).await?.await }
    }

    /// Sends everything buffered now, ignoring linger, and waits until every
    /// record enqueued so far is delivered or failed.
    pub async fn flush(&self) -> Result<()> {
        let (done, done_rx) = oneshot::channel();
        if self.commands.send(Command::Flush(done)).await.is_err() {
            return Ok(());
        }
        let _ = done_rx.await;
        Ok(())
    }

    /// Refuses new records, delivers or fails every buffered one, and stops
    /// the background task. Every outstanding `DeliveryFuture` resolves.
    pub async fn close(&self) -> Result<()> {
        self.closed.store(true, Ordering::Release);
        let (done, done_rx) = oneshot::channel();
        if self.commands.send(Command::Close(done)).await.is_err() {
            return Ok(());
        }
        let _ = done_rx.await;
        Ok(())
    }

    fn transactional(&self) -> Result<&TransactionManager> {
        let txn = self.txn.as_ref().ok_or_else(|| {
            ClientError::InvalidTransactionState("the producer has no transactional_id".into())
        })?;
        if let TxnPhase::Fenced(why) = &txn.shared().phase {
            return Err(ClientError::InvalidTransactionState(format!(
                "fenced: {why}; close this producer"
            )));
        }
        Ok(txn)
    }

    /// Takes the transactional id's producer id with a new epoch from its
    /// coordinator, fencing every earlier instance (their later writes and
    /// commits are refused) and having the coordinator abort what an
    /// earlier instance left open. Call once, before the first transaction.
    pub async fn init_transactions(&self) -> Result<()> {
        let txn = self.transactional()?;
        if txn.shared().phase != TxnPhase::Uninitialized {
            return Err(ClientError::InvalidTransactionState(
                "init_transactions was already called".into(),
            ));
        }
        self.take_identity(txn).await
    }

    async fn take_identity(&self, txn: &TransactionManager) -> Result<()> {
        let identity = match txn.init().await {
            Ok(identity) => identity,
            Err(error) => {
                if is_fencing(&error) {
                    txn.shared().phase = TxnPhase::Fenced(error.to_string());
                }
                return Err(error);
            }
        };
        let (done, done_rx) = oneshot::channel();
        self.commands
            .send(Command::SetIdentity(identity, done))
            .await
            .map_err(|_| ClientError::ProducerClosed)?;
        done_rx.await.map_err(|_| ClientError::ProducerClosed)?;
        let mut shared = txn.shared();
        shared.phase = TxnPhase::Ready;
        shared.added.clear();
        shared.offsets_added = false;
        shared.failure = None;
        Ok(())
    }

    /// Starts a transaction: records sent until `commit_transaction` or
    /// `abort_transaction` belong to it.
    pub fn begin_transaction(&self) -> Result<()> {
        let txn = self.transactional()?;
        let mut shared = txn.shared();
        if shared.phase != TxnPhase::Ready {
            return Err(ClientError::InvalidTransactionState(format!(
                "begin_transaction needs a producer between transactions (it is {:?})",
                shared.phase
            )));
        }
        shared.phase = TxnPhase::InTransaction;
        shared.added.clear();
        shared.offsets_added = false;
        shared.failure = None;
        Ok(())
    }

    fn in_transaction(&self) -> Result<&TransactionManager> {
        let txn = self.transactional()?;
        if txn.shared().phase != TxnPhase::InTransaction {
            return Err(ClientError::InvalidTransactionState(
                "no transaction is open".into(),
            ));
        }
        Ok(txn)
    }

    /// Delivers every record of the transaction, then commits it: once this
    /// returns, read_committed consumers see all of its records (as the
    /// markers reach each partition) or, had it failed, none. A transaction
    /// one of whose records failed cannot commit: this returns the error
    /// and the transaction stays open for `abort_transaction`.
    pub async fn commit_transaction(&self) -> Result<()> {
        let txn = self.in_transaction()?;
        self.end_phase(txn, TxnPhase::Ending);
        let result = self.commit_inner(txn).await;
        match &result {
            Ok(()) => self.end_phase(txn, TxnPhase::Ready),
            // Still open (a failed record, or the coordinator not reached):
            // the caller aborts or retries the commit.
            Err(_) => self.end_phase(txn, TxnPhase::InTransaction),
        }
        result
    }

    async fn commit_inner(&self, txn: &TransactionManager) -> Result<()> {
        self.flush().await?;
        let (identity, partitions, failure) = {
            let shared = txn.shared();
            (
                shared.identity,
                shared.added.len() + usize::from(shared.offsets_added),
                shared.failure.clone(),
            )
        };
        if let Some(failure) = failure {
            return Err(ClientError::InvalidTransactionState(format!(
                "a record of the transaction failed ({failure}); abort it"
            )));
        }
        if partitions > 0 {
            let identity = identity.ok_or_else(no_identity)?;
            if let Err(error) = txn.end(identity, true).await {
                if is_fencing(&error) {
                    txn.shared().phase = TxnPhase::Fenced(error.to_string());
                }
                return Err(error);
            }
        }
        Ok(())
    }

    /// Moves the phase on, unless the producer was fenced meanwhile; a
    /// transaction's end forgets its partitions.
    fn end_phase(&self, txn: &TransactionManager, phase: TxnPhase) {
        let mut shared = txn.shared();
        if matches!(shared.phase, TxnPhase::Fenced(_)) {
            return;
        }
        if phase == TxnPhase::Ready {
            shared.added.clear();
            shared.offsets_added = false;
        }
        shared.phase = phase;
    }

    /// Commits a consumer group's offsets (the next offset to read, per
    /// partition) as part of the open transaction: they take effect only if
    /// it commits, so records consumed, transformed and produced in one
    /// transaction are never processed twice nor skipped. `group` is the
    /// consuming member's (`GroupConsumer::group_metadata`): a member
    /// fenced from the group cannot commit over the new owners.
    pub async fn send_offsets_to_transaction(
        &self,
        offsets: &BTreeMap<TopicPartition, i64>,
        group: &ConsumerGroupMetadata,
    ) -> Result<()> {
        let txn = self.in_transaction()?;
        let identity = txn.shared().identity.ok_or_else(no_identity)?;
        if let Err(error) = txn.commit_offsets(identity, group, offsets).await {
            let mut shared = txn.shared();
            if is_fencing(&error) {
                shared.phase = TxnPhase::Fenced(error.to_string());
            }
            shared.failure.get_or_insert(error.clone());
            return Err(error);
        }
        // The offsets partition takes a marker like any other.
        txn.shared().offsets_added = true;
        Ok(())
    }

    /// Ends the transaction without its records: read_committed consumers
    /// never see them. After a failed record the producer takes a new epoch
    /// (its sequences restart), so the next transaction starts clean.
    pub async fn abort_transaction(&self) -> Result<()> {
        let txn = self.in_transaction()?;
        self.end_phase(txn, TxnPhase::Ending);
        let result = self.abort_inner(txn).await;
        match &result {
            Ok(()) => {}
            Err(_) => self.end_phase(txn, TxnPhase::InTransaction),
        }
        result
    }

    async fn abort_inner(&self, txn: &TransactionManager) -> Result<()> {
        self.flush().await?;
        let (identity, partitions, failed) = {
            let shared = txn.shared();
            (
                shared.identity,
                shared.added.len() + usize::from(shared.offsets_added),
                shared.failure.is_some(),
            )
        };
        if partitions > 0 {
            let identity = identity.ok_or_else(no_identity)?;
            if let Err(error) = txn.end(identity, false).await {
                if is_fencing(&error) {
                    txn.shared().phase = TxnPhase::Fenced(error.to_string());
                }
                return Err(error);
            }
        }
        if failed {
            // Sets the phase to Ready with the new epoch.
            return self.take_identity(txn).await;
        }
        self.end_phase(txn, TxnPhase::Ready);
        Ok(())
    }
}

fn no_identity() -> ClientError {
    ClientError::InvalidTransactionState("the producer has no identity".into())
}

/// The result of one produce request, with the batches it carried.
struct RequestOutcome {
    batches: Vec<SealedBatch<Ticket>>,
    result: Result<Vec<ProduceOutcome>>,
}

/// Where an idempotent producer stands with its producer id.
#[derive(Debug)]
enum IdentityState {
    /// Idempotence is off.
    NotUsed,
    /// Nothing is sent until the cluster gave an id.
    Missing {
        attempts: u32,
    },
    Ready,
    /// The cluster refused to give one: every record fails with this.
    Refused(ClientError),
    /// A transactional producer: nothing is sent until the handle set the
    /// identity its coordinator gave (`Command::SetIdentity`).
    FromCoordinator,
}

/// The background task's state.
struct Sender {
    cluster: Cluster,
    accumulator: Accumulator<Ticket>,
    partitioner: Partitioner,
    config: ProducerConfig,
    /// One task per leader and dispatch, with the outcome of each request.
    in_flight: JoinSet<Vec<RequestOutcome>>,
    identity: IdentityState,
    /// When to ask for a producer id again after a retriable failure.
    identity_retry_at: Option<Instant>,
    txn: Option<TransactionManager>,
}

impl Sender {
    async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        let mut flush_waiters: Vec<oneshot::Sender<()>> = Vec::new();
        let mut closing = false;
        loop {
            let force = closing || !flush_waiters.is_empty();
            self.ensure_identity().await;
            self.add_partitions().await;
            self.dispatch(force);
            if self.accumulator.is_empty() {
                for waiter in flush_waiters.drain(..) {
                    let _ = waiter.send(());
                }
                if closing {
                    break;
                }
            }
            // Without an identity nothing is drained: only its retry wakes.
            let batches_wakeup = match self.identity {
                IdentityState::Missing { .. } | IdentityState::FromCoordinator => None,
                _ => self.accumulator.next_wakeup(),
            };
            let wakeup = match (batches_wakeup, self.identity_retry_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            tokio::select! {
                command = commands.recv(), if !closing => match command {
                    Some(Command::Append { record, partition, partition_count, ticket }) => {
                        match self.refused_outside_transaction() {
                            Some(error) => {
                                let _ = ticket.reply.send(Err(error));
                            }
                            None => self.append(record, partition, partition_count, ticket),
                        }
                    }
                    Some(Command::Flush(done)) => flush_waiters.push(done),
                    Some(Command::Close(done)) => {
                        flush_waiters.push(done);
                        closing = true;
                    }
                    None => closing = true,
                    Some(Command::SetIdentity(identity, done)) => {
                        self.accumulator.set_identity(identity);
                        if let Some(txn) = &self.txn {
                            txn.shared().identity = Some(identity);
                        }
                        self.identity = IdentityState::Ready;
                        let _ = done.send(());
                    }
                },
                Some(joined) = self.in_flight.join_next(), if !self.in_flight.is_empty() => {
                    let outcomes = joined.expect("produce request tasks do not panic");
                    for outcome in outcomes {
                        self.handle_outcome(outcome);
                    }
                }
                () = sleep_until(wakeup), if wakeup.is_some() => {}
            }
        }
        // Commands that raced with close: their futures resolve to ProducerClosed.
        commands.close();
    }

    fn append(
        &mut self,
        record: ProducerRecord,
        partition: Option<i32>,
        partition_count: usize,
        ticket: Ticket,
    ) {
        let partition = partition.unwrap_or_else(|| {
            self.partitioner
                .partition(&record.topic, None, partition_count)
        });
        let headers: Vec<RecordHeader<'_>> = record
            .headers
            .iter()
            .map(|h| RecordHeader {
                key: h.key.as_bytes(),
                value: h.value.as_deref(),
            })
            .collect();
        let wire_record = Record {
            timestamp_ms: record.timestamp_ms.unwrap_or_else(now_ms),
            key: record.key.as_deref(),
            value: record.value.as_deref(),
            headers: &headers,
        };
        let topic_partition = TopicPartition::new(record.topic.clone(), partition);
        self.accumulator
            .append(&topic_partition, &wire_record, ticket, Instant::now());
        self.rotate_sticky();
    }

    fn rotate_sticky(&mut self) {
        for sealed in self.accumulator.take_seal_events() {
            self.partitioner
                .batch_sealed(&sealed.topic, sealed.partition);
        }
    }

    /// Asks the cluster for a producer id when one is needed and the last
    /// retriable failure's backoff is over; a refusal fails the producer.
    async fn ensure_identity(&mut self) {
        let IdentityState::Missing { attempts } = self.identity else {
            return;
        };
        if self.identity_retry_at.is_some_and(|at| Instant::now() < at) {
            return;
        }
        let bound = Duration::from_millis(self.cluster.config().request_timeout_ms);
        let answer = tokio::time::timeout(bound, self.cluster.init_producer_id())
            .await
            .unwrap_or_else(|_| {
                Err(ClientError::RequestTimeout {
                    address: "any broker".into(),
                    timeout_ms: self.cluster.config().request_timeout_ms,
                })
            });
        match answer {
            Ok((id, epoch)) => {
                self.accumulator
                    .set_identity(ProducerIdentity { id, epoch });
                self.identity = IdentityState::Ready;
                self.identity_retry_at = None;
            }
            Err(error) if error.is_retriable() => {
                let attempts = attempts + 1;
                self.identity = IdentityState::Missing { attempts };
                self.identity_retry_at =
                    Some(Instant::now() + self.config.retry_backoff(attempts.min(16)));
            }
            Err(error) => {
                self.identity = IdentityState::Refused(error);
            }
        }
    }

    /// A transactional producer: adds the partitions about to get their
    /// first batch of the transaction at the coordinator. A failure makes
    /// the transaction abortable; those partitions' batches then fail.
    async fn add_partitions(&mut self) {
        let (Some(txn), IdentityState::Ready) = (&self.txn, &self.identity) else {
            return;
        };
        let (new, identity) = {
            let shared = txn.shared();
            let open = matches!(shared.phase, TxnPhase::InTransaction | TxnPhase::Ending);
            if shared.failure.is_some() || !open {
                return;
            }
            let new: Vec<TopicPartition> = self
                .accumulator
                .unsent_partitions()
                .filter(|tp| !shared.added.contains(*tp))
                .cloned()
                .collect();
            (new, shared.identity)
        };
        let Some(identity) = identity else { return };
        if new.is_empty() {
            return;
        }
        match txn.add_partitions(identity, &new).await {
            Ok(()) => txn.shared().added.extend(new),
            Err(error) => {
                let mut shared = txn.shared();
                if is_fencing(&error) {
                    shared.phase = TxnPhase::Fenced(error.to_string());
                }
                shared.failure = Some(error);
            }
        }
    }

    /// Groups ready batches by leader endpoint and starts one request per endpoint.
    fn dispatch(&mut self, force: bool) {
        match &self.identity {
            IdentityState::Missing { .. } | IdentityState::FromCoordinator => return,
            IdentityState::Refused(error) => {
                let error = error.clone();
                for batch in self.accumulator.drain_ready(Instant::now(), true) {
                    self.finish_batch(batch, Err(error.clone()));
                }
                return;
            }
            IdentityState::NotUsed | IdentityState::Ready => {}
        }
        let ready = self.accumulator.drain_ready(Instant::now(), force);
        self.rotate_sticky();
        if ready.is_empty() {
            return;
        }
        let metadata = self.cluster.metadata();
        let mut by_address: Vec<(Result<String>, Vec<SealedBatch<Ticket>>)> = Vec::new();
        for mut batch in ready {
            if let Err(error) = &batch.bytes {
                let error = ClientError::Batch(error.clone());
                self.fail_batch(batch, error);
                continue;
            }
            if let Some(error) = self.not_in_transaction(&batch) {
                self.fail_batch(batch, error);
                continue;
            }
            batch.attempts += 1;
            let tp = &batch.topic_partition;
            let address = metadata.leader_address(&tp.topic, tp.partition);
            let same = by_address.iter_mut().find(|(a, _)| match (a, &address) {
                (Ok(a), Ok(b)) => a == b,
                _ => false,
            });
            match same {
                Some((_, batches)) => batches.push(batch),
                None => by_address.push((address, vec![batch])),
            }
        }
        for (address, batches) in by_address {
            let rounds = one_per_partition(batches);
            let cluster = self.cluster.clone();
            let acks = self.config.acks;
            let timeout_ms = self.config.produce_timeout_ms as i32;
            self.in_flight.spawn(async move {
                let outcomes = produce(&cluster, address, rounds, acks, timeout_ms).await;
                let stale = outcomes.iter().any(|o| match &o.result {
                    Err(error) => error.needs_metadata_refresh(),
                    Ok(outcomes) => outcomes
                        .iter()
                        .any(|o| ClientError::broker(o.error, None).needs_metadata_refresh()),
                });
                if stale {
                    // The retry must see the new leader; a failed refresh
                    // surfaces as the retry's own error.
                    let _ = cluster.refresh_metadata().await;
                }
                outcomes
            });
        }
    }

    fn handle_outcome(&mut self, outcome: RequestOutcome) {
        let acks_none = self.config.acks == Acks::None;
        for (index, batch) in outcome.batches.into_iter().enumerate() {
            let tp = &batch.topic_partition;
            let result = match &outcome.result {
                Err(error) => Err(error.clone()),
                Ok(_) if acks_none => Ok(-1),
                Ok(outcomes) => match partition_outcome(outcomes, index, tp) {
                    None => Err(ClientError::MalformedResponse(format!(
                        "no produce result for {}-{}",
                        tp.topic, tp.partition
                    ))),
                    Some(o) if o.error.is_ok() => Ok(o.base_offset),
                    Some(o) => Err(ClientError::broker(o.error, o.error_message.clone())),
                },
            };
            let error = match result {
                Ok(base_offset) => {
                    self.finish_batch(batch, Ok(base_offset));
                    continue;
                }
                Err(error) => error,
            };
            let backoff = self.config.retry_backoff(batch.attempts);
            let failure = match &error {
                ClientError::Broker {
                    code: ErrorCode::OutOfOrderSequenceNumber,
                    ..
                } => SendFailure::OutOfOrder,
                ClientError::Broker {
                    code: ErrorCode::UnknownProducerId,
                    ..
                } => SendFailure::UnknownProducer,
                error if error.is_retriable() => SendFailure::Retriable,
                _ => SendFailure::Final,
            };
            let failed = match self.accumulator.on_failed_send(
                batch,
                failure,
                self.config.retries_max,
                Instant::now(),
                backoff,
            ) {
                FailedSend::Retried => continue,
                FailedSend::Failed(batch) => batch,
            };
            let current = failed
                .stamped
                .is_some_and(|(identity, _)| Some(identity) == self.accumulator.identity());
            if current && self.txn.is_none() && matches!(self.identity, IdentityState::Ready) {
                // The broker may or may not hold this batch, so the
                // partition's next sequence is unknown: continue under a new
                // producer id (the partition's batches of this one finish
                // first).
                self.identity = IdentityState::Missing { attempts: 0 };
            }
            self.note_failure(&error);
            resolve(failed, Err(error));
        }
    }

    /// A transactional producer takes records only inside a transaction,
    /// judged when the record reaches this task: a commit sets `Ending`
    /// before its flush goes down the same channel, so every record taken
    /// is delivered (or failed) before the commit is sent.
    fn refused_outside_transaction(&self) -> Option<ClientError> {
        let txn = self.txn.as_ref()?;
        let phase = txn.shared().phase.clone();
        (phase != TxnPhase::InTransaction).then(|| {
            ClientError::InvalidTransactionState(format!(
                "records are sent inside a transaction (the producer is {phase:?})"
            ))
        })
    }

    /// A transactional batch whose partition is not (or could not be)
    /// added to the transaction, or whose transaction already failed: it
    /// is not sent.
    fn not_in_transaction(&self, batch: &SealedBatch<Ticket>) -> Option<ClientError> {
        let txn = self.txn.as_ref()?;
        // A retry was part of the transaction when first sent (every batch
        // is stamped by then, so the stamp cannot tell).
        if batch.attempts > 0 {
            return None;
        }
        let shared = txn.shared();
        if let Some(failure) = &shared.failure {
            return Some(failure.clone());
        }
        (!shared.added.contains(&batch.topic_partition)).then(|| {
            ClientError::InvalidTransactionState(format!(
                "{}-{} is not part of the transaction",
                batch.topic_partition.topic, batch.topic_partition.partition
            ))
        })
    }

    /// Fails a batch for good; in a transaction, the transaction can then
    /// only abort (a fencing error ends the producer).
    fn fail_batch(&mut self, batch: SealedBatch<Ticket>, error: ClientError) {
        self.note_failure(&error);
        self.finish_batch(batch, Err(error));
    }

    /// In a transaction a failed batch leaves it only able to abort (a
    /// fencing error ends the producer).
    fn note_failure(&self, error: &ClientError) {
        if let Some(txn) = &self.txn {
            let mut shared = txn.shared();
            if is_fencing(error) {
                shared.phase = TxnPhase::Fenced(error.to_string());
            }
            shared.failure.get_or_insert(error.clone());
        }
    }

    /// Completes a batch in the accumulator and resolves its record futures.
    fn finish_batch(&mut self, batch: SealedBatch<Ticket>, result: Result<i64>) {
        self.accumulator.complete(&batch);
        resolve(batch, result);
    }
}

/// The answer for `tp`, the `index`th partition of its request. A broker
/// answers in request order, so the same place is looked at first: a search
/// per batch would cost a request of thousands of partitions millions of
/// comparisons.
fn partition_outcome<'a>(
    outcomes: &'a [ProduceOutcome],
    index: usize,
    tp: &TopicPartition,
) -> Option<&'a ProduceOutcome> {
    let matches = |o: &&ProduceOutcome| o.topic == tp.topic && o.partition == tp.partition;
    outcomes
        .get(index)
        .filter(matches)
        .or_else(|| outcomes.iter().find(matches))
}

/// Resolves every record future of a completed batch.
fn resolve(batch: SealedBatch<Ticket>, result: Result<i64>) {
    let partition = batch.topic_partition.partition;
    for (index, ticket) in batch.tickets.into_iter().enumerate() {
        let delivery = result.clone().map(|base_offset| {
            let offset = if base_offset >= 0 {
                base_offset + index as i64
            } else {
                -1
            };
            (partition, offset)
        });
        let _ = ticket.reply.send(delivery);
    }
}

/// Splits one leader's batches into requests holding at most one batch per
/// partition (an answer names its partition, not its batch), each
/// partition's batches in send order across the requests.
fn one_per_partition(batches: Vec<SealedBatch<Ticket>>) -> Vec<Vec<SealedBatch<Ticket>>> {
    let mut rounds: Vec<Vec<SealedBatch<Ticket>>> = Vec::new();
    let mut seen: BTreeMap<TopicPartition, usize> = BTreeMap::new();
    for batch in batches {
        let round = seen.entry(batch.topic_partition.clone()).or_insert(0);
        if *round == rounds.len() {
            rounds.push(Vec::new());
        }
        rounds[*round].push(batch);
        *round += 1;
    }
    for round in &mut rounds {
        round.sort_by(|a, b| a.topic_partition.cmp(&b.topic_partition));
    }
    rounds
}

/// Sends one produce request per round to the leader at `address`, every
/// request written before any answer is awaited (in order, so the leader
/// gets each partition's batches in sequence order), and returns each
/// request's per-partition outcomes.
async fn produce(
    cluster: &Cluster,
    address: Result<String>,
    rounds: Vec<Vec<SealedBatch<Ticket>>>,
    acks: Acks,
    timeout_ms: i32,
) -> Vec<RequestOutcome> {
    let connection = match address {
        Ok(address) => cluster.connection(&address).await,
        Err(error) => Err(error),
    };
    let mut sent = Vec::with_capacity(rounds.len());
    for batches in rounds {
        // Each answer is awaited from the moment its request is written, so
        // its timeout runs: a silent broker then closes the connection and
        // frees the slots a later round may be waiting for.
        let answer = match &connection {
            Ok(connection) => send_produce(connection, &batches, acks, timeout_ms)
                .await
                .map(|answer| answer.map(tokio::spawn)),
            Err(error) => Err(error.clone()),
        };
        sent.push((batches, answer));
    }
    let mut outcomes = Vec::with_capacity(sent.len());
    for (batches, answer) in sent {
        let result = match answer {
            Ok(Some(response)) => match response.await {
                Ok(answer) => answer.and_then(|r| messages::produce_response(r.body())),
                Err(_) => Err(ClientError::MalformedResponse(
                    "the task awaiting a produce answer ended".into(),
                )),
            },
            Ok(None) => Ok(Vec::new()),
            Err(error) => Err(error),
        };
        outcomes.push(RequestOutcome { batches, result });
    }
    outcomes
}

/// Writes one produce request; its answer to await (`None` with acks=0,
/// which has none).
async fn send_produce(
    connection: &crate::connection::Connection,
    batches: &[SealedBatch<Ticket>],
    acks: Acks,
    timeout_ms: i32,
) -> Result<Option<crate::connection::ResponseFuture>> {
    let entries: Vec<ProduceEntry<'_>> = batches
        .iter()
        .map(|b| ProduceEntry {
            topic: &b.topic_partition.topic,
            partition: b.topic_partition.partition,
            batch: b.bytes.as_deref().expect("only built batches are sent"),
        })
        .collect();
    let body = messages::produce_request(acks.wire_value(), timeout_ms, &entries);
    drop(entries);
    let parts: Vec<bytes::Bytes> = batches
        .iter()
        .map(|b| b.bytes.clone().expect("only built batches are sent"))
        .collect();
    if acks == Acks::None {
        connection
            .send_parts_without_response(ApiKey::Produce, &body, parts)
            .await?;
        return Ok(None);
    }
    Ok(Some(
        connection.send_parts(ApiKey::Produce, &body, parts).await?,
    ))
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => std::future::pending().await,
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(topic: &str, partition: i32, base_offset: i64) -> ProduceOutcome {
        ProduceOutcome {
            topic: topic.into(),
            partition,
            error: ErrorCode::None,
            error_message: None,
            base_offset,
        }
    }

    #[test]
    fn each_batch_gets_its_own_partitions_answer_in_any_order() {
        let in_order = [
            outcome("a", 0, 10),
            outcome("a", 1, 20),
            outcome("b", 0, 30),
        ];
        let b0 = TopicPartition::new("b".to_owned(), 0);
        assert_eq!(
            partition_outcome(&in_order, 2, &b0).map(|o| o.base_offset),
            Some(30)
        );
        // An answer in another order is still matched by name and partition.
        let shuffled = [
            outcome("b", 0, 30),
            outcome("a", 1, 20),
            outcome("a", 0, 10),
        ];
        let a0 = TopicPartition::new("a".to_owned(), 0);
        assert_eq!(
            partition_outcome(&shuffled, 0, &a0).map(|o| o.base_offset),
            Some(10)
        );
        let missing = TopicPartition::new("a".to_owned(), 7);
        assert!(partition_outcome(&shuffled, 1, &missing).is_none());
    }
}
