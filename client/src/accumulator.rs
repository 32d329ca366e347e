//! `Accumulator`: the producer's per-partition batching, as a pure state
//! machine (records and the time in, batches ready to send out). Generic
//! over the per-record ticket so tests can drive it without channels, and it
//! never reads a clock: callers pass `now`.
//!
//! For an idempotent producer it stamps each batch, when first sent, with
//! the producer's identity and the partition's next sequence (a retry keeps
//! its stamp), and keeps up to `in_flight_max` batches per partition in
//! flight: the broker appends a partition's batches only in sequence order
//! and answers a repeat of any of its last five with the original offsets,
//! so order holds across retries. A batch that comes back for a retry goes
//! back into its partition's queue in sequence order, and the partition
//! sends nothing new until every batch in flight is back, so the retries go
//! out first and in order; a batch refused as out of order while an earlier
//! one of its partition is still unacknowledged is retried too (it only
//! waits for that one). Without idempotence one batch per partition is in
//! flight, which alone keeps the order.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use protocol::record_batch::stamp_producer;
use protocol::{
    BatchBuilder, BatchError, Compression, ProducerEpoch, ProducerId, Record, Sequence,
};

/// An idempotent producer's id and epoch, from InitProducerId.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProducerIdentity {
    pub id: ProducerId,
    pub epoch: ProducerEpoch,
}

/// A topic partition.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicPartition {
    pub topic: String,
    pub partition: i32,
}

impl TopicPartition {
    pub fn new(topic: impl Into<String>, partition: i32) -> TopicPartition {
        TopicPartition {
            topic: topic.into(),
            partition,
        }
    }
}

/// A batch that takes no more records.
#[derive(Debug)]
pub struct SealedBatch<T> {
    pub topic_partition: TopicPartition,
    /// The encoded (and compressed) batch, or why it could not be built.
    /// Shared with the requests that carry it, which write it to the socket
    /// from here; a stamp changes it in place once no request holds it.
    pub bytes: Result<Bytes, BatchError>,
    /// One per record, in offset order: ticket `i` is the record at base offset + `i`.
    pub tickets: Vec<T>,
    /// Uncompressed size, what `batch_bytes_max` bounds.
    pub size_bytes_uncompressed: usize,
    /// Sends so far.
    pub attempts: u32,
    retry_at: Option<Instant>,
    /// The identity and first sequence stamped at the first send.
    pub stamped: Option<(ProducerIdentity, Sequence)>,
    /// Where the stamp puts the batch among its partition's batches.
    sent_as: Option<SendKey>,
    /// Its last send went out while an earlier batch of its partition was
    /// unanswered: the broker may take them in either order.
    sent_behind: bool,
}

/// A stamped batch's place: the identity it was stamped under (counted per
/// `set_identity`) and its first sequence, unwrapped, so batches compare in
/// send order even past the sequence's wrap at `i32::MAX`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct SendKey {
    generation: u64,
    index: u64,
}

/// How a send failed, as the retry decision needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendFailure {
    /// A new attempt may succeed (leader moved, timeout, ...).
    Retriable,
    /// The broker's out-of-order refusal.
    OutOfOrder,
    /// The partition does not know the producer and the batch did not start
    /// at sequence 0.
    UnknownProducer,
    /// Anything else: final.
    Final,
}

/// What to do with a batch whose send failed.
#[derive(Debug)]
pub enum FailedSend<T> {
    /// Put back in its partition's queue; sent again after the backoff.
    Retried,
    /// Failed for good: the caller resolves its records with the error.
    Failed(SealedBatch<T>),
}

#[derive(Debug)]
struct OpenBatch<T> {
    builder: BatchBuilder,
    tickets: Vec<T>,
    created_at: Instant,
}

impl<T> OpenBatch<T> {
    fn seal(self, topic_partition: TopicPartition) -> SealedBatch<T> {
        let size_bytes_uncompressed = self.builder.size_bytes_uncompressed();
        let record_count = self.builder.record_count() as usize;
        assert_eq!(record_count, self.tickets.len(), "one ticket per record");
        SealedBatch {
            topic_partition,
            bytes: self.builder.build().map(Bytes::from),
            tickets: self.tickets,
            size_bytes_uncompressed,
            attempts: 0,
            retry_at: None,
            stamped: None,
            sent_as: None,
            sent_behind: false,
        }
    }
}

#[derive(Debug)]
struct PartitionQueue<T> {
    open: Option<OpenBatch<T>>,
    /// Batches back for a retry (stamped, in send order) then sealed ones
    /// never sent.
    sealed: VecDeque<SealedBatch<T>>,
    in_flight: usize,
    /// A batch came back for a retry: nothing goes out until every batch
    /// in flight is back.
    resending: bool,
    /// The partition forgot the producer: once every batch is back, the
    /// unanswered ones are numbered again from sequence 0.
    restamp: bool,
    /// Stamped batches from the oldest one not completed yet (in flight
    /// or back for a retry) to the newest, each with whether it completed.
    /// A new batch is stamped only while this holds fewer than the bound:
    /// the broker remembers a producer's last five batches, so a batch
    /// that may have been appended stays among them until it is answered.
    window: VecDeque<(SendKey, bool)>,
}

impl<T> PartitionQueue<T> {
    fn is_idle(&self) -> bool {
        self.open.is_none() && self.sealed.is_empty() && self.in_flight == 0
    }

    /// The oldest stamped batch not completed.
    fn oldest_unacked(&self) -> Option<SendKey> {
        self.window.front().map(|(key, done)| {
            assert!(!done, "the window starts at an unacked batch");
            *key
        })
    }

    /// Where a batch back for a retry goes: after the stamped batches sent
    /// before it, before later ones and before every unsent batch.
    fn retry_position(&self, key: Option<SendKey>) -> usize {
        let Some(key) = key else { return 0 };
        self.sealed
            .iter()
            .position(|b| b.sent_as.is_none_or(|other| other > key))
            .unwrap_or(self.sealed.len())
    }
}

/// Per-partition batching with linger and size triggers.
#[derive(Debug)]
pub struct Accumulator<T> {
    batch_bytes_max: usize,
    linger: Duration,
    compression: Compression,
    queues: BTreeMap<TopicPartition, PartitionQueue<T>>,
    records_buffered: usize,
    /// Partitions whose open batch was sealed since the last `take_seal_events`.
    seal_events: Vec<TopicPartition>,
    /// Set for an idempotent producer: stamped into each batch's first send.
    identity: Option<ProducerIdentity>,
    /// The next sequence per partition under `identity`.
    sequences: BTreeMap<TopicPartition, Sequence>,
    /// Batches are marked transactional (a transactional producer).
    transactional: bool,
    /// Batches in flight per partition with an identity (else 1).
    in_flight_max: usize,
    /// Counts `set_identity` calls: the generation of new stamps.
    generation: u64,
    /// The next unwrapped sequence per partition under `identity`.
    indices: BTreeMap<TopicPartition, u64>,
}

/// The most batches of one partition an idempotent producer keeps in
/// flight: the broker recognises a repeat of any of a producer's last five
/// batches in a partition.
pub const IN_FLIGHT_PER_PARTITION_MAX: usize = 5;

impl<T> Accumulator<T> {
    pub fn new(batch_bytes_max: usize, linger: Duration, compression: Compression) -> Self {
        assert!(batch_bytes_max > 0);
        Accumulator {
            batch_bytes_max,
            linger,
            compression,
            queues: BTreeMap::new(),
            records_buffered: 0,
            seal_events: Vec::new(),
            identity: None,
            sequences: BTreeMap::new(),
            transactional: false,
            in_flight_max: 1,
            generation: 0,
            indices: BTreeMap::new(),
        }
    }

    /// Batches per partition an idempotent producer may have in flight,
    /// 1..=`IN_FLIGHT_PER_PARTITION_MAX`. Without an identity it is 1.
    pub fn set_in_flight_max(&mut self, in_flight_max: usize) {
        assert!((1..=IN_FLIGHT_PER_PARTITION_MAX).contains(&in_flight_max));
        self.in_flight_max = in_flight_max;
    }

    /// Marks every batch built from now on as part of a transaction.
    pub fn set_transactional(&mut self) {
        self.transactional = true;
    }

    /// Partitions holding records not yet sent (open or sealed batches).
    pub fn unsent_partitions(&self) -> impl Iterator<Item = &TopicPartition> {
        self.queues
            .iter()
            .filter(|(_, q)| q.open.is_some() || q.sealed.iter().any(|b| b.stamped.is_none()))
            .map(|(tp, _)| tp)
    }

    /// Batches sent from now on (not retries) carry `identity`, with
    /// sequences from 0 in every partition.
    pub fn set_identity(&mut self, identity: ProducerIdentity) {
        self.identity = Some(identity);
        self.sequences.clear();
        self.indices.clear();
        self.generation += 1;
    }

    pub fn identity(&self) -> Option<ProducerIdentity> {
        self.identity
    }

    /// Gives a batch about to be sent for the first time the identity and
    /// its partition's next sequences.
    fn stamp(&mut self, batch: &mut SealedBatch<T>) {
        let (Some(identity), Ok(bytes), None) = (self.identity, &mut batch.bytes, batch.stamped)
        else {
            return;
        };
        let next = self
            .sequences
            .entry(batch.topic_partition.clone())
            .or_insert(Sequence(0));
        let first = *next;
        // Not copied unless a request still holds the bytes (a restamp
        // after a connection closed with the request unwritten).
        let mut stamped = BytesMut::from(std::mem::take(bytes));
        stamp_producer(&mut stamped, identity.id, identity.epoch, first);
        *bytes = stamped.freeze();
        *next = first.advanced_by(batch.tickets.len() as i64);
        batch.stamped = Some((identity, first));
        let index = self
            .indices
            .entry(batch.topic_partition.clone())
            .or_insert(0);
        let key = SendKey {
            generation: self.generation,
            index: *index,
        };
        *index += batch.tickets.len() as u64;
        batch.sent_as = Some(key);
        let queue = self
            .queues
            .get_mut(&batch.topic_partition)
            .expect("a batch being sent has its queue");
        queue.window.push_back((key, false));
    }

    /// Adds a record to its partition's open batch. A record that would take
    /// the batch past `batch_bytes_max` seals it first and starts a new one
    /// (a record bigger than the bound travels alone); a batch that reached
    /// the bound is sealed at once.
    pub fn append(
        &mut self,
        topic_partition: &TopicPartition,
        record: &Record<'_>,
        ticket: T,
        now: Instant,
    ) {
        let compression = self.compression;
        let queue = self
            .queues
            .entry(topic_partition.clone())
            .or_insert_with(|| PartitionQueue {
                open: None,
                sealed: VecDeque::new(),
                in_flight: 0,
                resending: false,
                restamp: false,
                window: VecDeque::new(),
            });
        if let Some(open) = &queue.open {
            let size_after =
                open.builder.size_bytes_uncompressed() + open.builder.record_size_bytes(record);
            if size_after > self.batch_bytes_max {
                let full = queue.open.take().expect("checked above");
                queue.sealed.push_back(full.seal(topic_partition.clone()));
                self.seal_events.push(topic_partition.clone());
            }
        }
        let transactional = self.transactional;
        let open = queue.open.get_or_insert_with(|| OpenBatch {
            builder: BatchBuilder::new(compression).transactional(transactional),
            tickets: Vec::new(),
            created_at: now,
        });
        open.builder.push(record);
        open.tickets.push(ticket);
        self.records_buffered += 1;
        if open.builder.size_bytes_uncompressed() >= self.batch_bytes_max {
            let full = queue.open.take().expect("just filled");
            queue.sealed.push_back(full.seal(topic_partition.clone()));
            self.seal_events.push(topic_partition.clone());
        }
    }

    fn partition_in_flight_max(&self) -> usize {
        if self.identity.is_some() {
            self.in_flight_max
        } else {
            1
        }
    }

    /// Takes the batches that may be sent now, per partition in order while
    /// fewer than the in-flight bound are out: sealed batches once their
    /// retry time passed, then the open batch once it lingered `linger` (or
    /// at once when `force`, for flush and close). A partition waiting for
    /// its batches to come back before resending sends nothing; one with
    /// batches of an earlier identity unacknowledged sends no new batch
    /// (it would overtake them).
    pub fn drain_ready(&mut self, now: Instant, force: bool) -> Vec<SealedBatch<T>> {
        let in_flight_max = self.partition_in_flight_max();
        let restamp: Vec<TopicPartition> = self
            .queues
            .iter()
            .filter(|(_, q)| q.restamp && q.in_flight == 0)
            .map(|(tp, _)| tp.clone())
            .collect();
        for tp in restamp {
            self.restamp(&tp);
        }
        let generation = self.generation;
        let stamping = self.identity.is_some();
        let mut ready = Vec::new();
        for (topic_partition, queue) in &mut self.queues {
            if queue.resending {
                if queue.in_flight > 0 {
                    continue;
                }
                queue.resending = false;
            }
            let older_unacked = queue
                .oldest_unacked()
                .is_some_and(|k| k.generation < generation);
            // Batches this round stamps join the window after the loop.
            let mut window = queue.window.len();
            while queue.in_flight < in_flight_max {
                // A new batch must leave room in the window (`may_stamp`).
                let may_stamp = !older_unacked && (!stamping || window < in_flight_max);
                if let Some(front) = queue.sealed.front() {
                    let waiting = front.retry_at.is_some_and(|at| at > now);
                    if waiting || (front.sent_as.is_none() && !may_stamp) {
                        break;
                    }
                    let batch = queue.sealed.pop_front().expect("front exists");
                    window += usize::from(batch.sent_as.is_none());
                    ready.push(batch);
                    queue.in_flight += 1;
                    continue;
                }
                let linger_over = queue
                    .open
                    .as_ref()
                    .is_some_and(|open| force || now >= open.created_at + self.linger);
                if linger_over && may_stamp {
                    let open = queue.open.take().expect("checked above");
                    ready.push(open.seal(topic_partition.clone()));
                    self.seal_events.push(topic_partition.clone());
                    queue.in_flight += 1;
                }
                break;
            }
        }
        for batch in &mut ready {
            self.stamp(batch);
            let oldest = self
                .queues
                .get(&batch.topic_partition)
                .and_then(|q| q.oldest_unacked());
            batch.sent_behind = matches!((oldest, batch.sent_as), (Some(o), Some(k)) if o < k);
        }
        ready
    }

    /// Whether `queue` may send a batch never sent before: no batch of an
    /// earlier identity is unanswered, and the window has room.
    fn may_stamp(&self, queue: &PartitionQueue<T>, in_flight_max: usize) -> bool {
        let older_unacked = queue
            .oldest_unacked()
            .is_some_and(|k| k.generation < self.generation);
        !older_unacked && (self.identity.is_none() || queue.window.len() < in_flight_max)
    }

    /// When `drain_ready` would next return something without new input,
    /// by the same rules (batches coming back wake the caller anyway; a
    /// partition that must wait for them gives no time, so the caller does
    /// not spin).
    pub fn next_wakeup(&self) -> Option<Instant> {
        let in_flight_max = self.partition_in_flight_max();
        self.queues
            .values()
            .filter(|q| q.in_flight < in_flight_max && !(q.resending && q.in_flight > 0))
            .filter_map(|q| {
                let may_stamp = self.may_stamp(q, in_flight_max);
                match q.sealed.front() {
                    Some(front) if front.sent_as.is_some() || may_stamp => {
                        Some(front.retry_at.unwrap_or_else(Instant::now))
                    }
                    Some(_) => None,
                    None => q
                        .open
                        .as_ref()
                        .filter(|_| may_stamp)
                        .map(|open| open.created_at + self.linger),
                }
            })
            .min()
    }

    /// An in-flight batch finished (delivered or failed for good); its
    /// records leave the buffer.
    pub fn complete(&mut self, batch: &SealedBatch<T>) {
        let topic_partition = &batch.topic_partition;
        let queue = self
            .queues
            .get_mut(topic_partition)
            .expect("completing a partition the accumulator knows");
        assert!(
            queue.in_flight > 0,
            "completing a partition with nothing in flight"
        );
        queue.in_flight -= 1;
        if let Some(key) = batch.sent_as {
            let entry = queue
                .window
                .iter_mut()
                .find(|(k, _)| *k == key)
                .expect("a stamped batch is in its window");
            assert!(!entry.1, "a batch completes once");
            entry.1 = true;
            while queue.window.front().is_some_and(|(_, done)| *done) {
                queue.window.pop_front();
            }
        }
        self.records_buffered = self
            .records_buffered
            .checked_sub(batch.tickets.len())
            .expect("completed more records than buffered");
        if queue.is_idle() && queue.window.is_empty() {
            self.queues.remove(topic_partition);
        }
    }

    /// Numbers the partition's unanswered batches (all back, at the front
    /// of its queue) again from sequence 0 under the current identity.
    fn restamp(&mut self, topic_partition: &TopicPartition) {
        let queue = self
            .queues
            .get_mut(topic_partition)
            .expect("restamping a known partition");
        assert_eq!(queue.in_flight, 0, "every batch is back");
        queue.restamp = false;
        queue.window.clear();
        let mut again = Vec::new();
        while queue.sealed.front().is_some_and(|b| b.sent_as.is_some()) {
            let mut batch = queue.sealed.pop_front().expect("front exists");
            batch.stamped = None;
            batch.sent_as = None;
            again.push(batch);
        }
        self.sequences.remove(topic_partition);
        self.indices.remove(topic_partition);
        for batch in &mut again {
            self.stamp(batch);
        }
        let queue = self
            .queues
            .get_mut(topic_partition)
            .expect("restamping a known partition");
        for batch in again.into_iter().rev() {
            queue.sealed.push_front(batch);
        }
    }

    /// Puts an in-flight batch back into its partition's queue in send
    /// order, to be sent again no earlier than `retry_at`; the partition
    /// sends nothing until its other batches in flight are back.
    pub fn retry(&mut self, mut batch: SealedBatch<T>, retry_at: Instant) {
        let queue = self
            .queues
            .get_mut(&batch.topic_partition)
            .expect("retrying a partition the accumulator knows");
        assert!(
            queue.in_flight > 0,
            "retrying a batch that was not in flight"
        );
        queue.in_flight -= 1;
        queue.resending = true;
        batch.retry_at = Some(retry_at);
        let at = queue.retry_position(batch.sent_as);
        queue.sealed.insert(at, batch);
    }

    /// A send of `batch` failed. Within `retries_max` attempts a retriable
    /// failure is retried after `backoff` from `now`. An out-of-order or
    /// unknown-producer refusal of a batch that went out while an earlier
    /// batch of its partition was unanswered is retried at once, without
    /// counting (the broker may have taken this one first; the earlier one
    /// may be in by now, or be retried before it). An unknown-producer
    /// refusal of the partition's oldest unanswered batch means the
    /// partition forgot the producer: once every batch is back, the
    /// unanswered ones are numbered again from 0 and resent. Anything else
    /// fails for good and is completed here.
    pub fn on_failed_send(
        &mut self,
        mut batch: SealedBatch<T>,
        failure: SendFailure,
        retries_max: u32,
        now: Instant,
        backoff: Duration,
    ) -> FailedSend<T> {
        let refused = matches!(
            failure,
            SendFailure::OutOfOrder | SendFailure::UnknownProducer
        );
        if refused && batch.sent_behind {
            // Sent in the shadow of the earlier batch: not this batch's own
            // attempt.
            batch.attempts = batch.attempts.saturating_sub(1);
            self.retry(batch, now);
            FailedSend::Retried
        } else if failure == SendFailure::UnknownProducer && batch.attempts <= retries_max {
            self.queues
                .get_mut(&batch.topic_partition)
                .expect("a failed batch's queue")
                .restamp = true;
            self.retry(batch, now);
            FailedSend::Retried
        } else if failure == SendFailure::Retriable && batch.attempts <= retries_max {
            self.retry(batch, now + backoff);
            FailedSend::Retried
        } else {
            self.complete(&batch);
            FailedSend::Failed(batch)
        }
    }

    pub fn take_seal_events(&mut self) -> Vec<TopicPartition> {
        std::mem::take(&mut self.seal_events)
    }

    /// Records appended and not yet completed, including those in flight.
    pub fn records_buffered(&self) -> usize {
        self.records_buffered
    }

    pub fn is_empty(&self) -> bool {
        self.records_buffered == 0
    }

    pub fn check_invariants(&self) {
        let counted: usize = self
            .queues
            .values()
            .map(|q| {
                q.open.as_ref().map_or(0, |o| o.tickets.len())
                    + q.sealed.iter().map(|s| s.tickets.len()).sum::<usize>()
            })
            .sum();
        assert!(
            counted <= self.records_buffered,
            "queued records are counted"
        );
        for queue in self.queues.values() {
            if let Some(open) = &queue.open {
                assert!(!open.tickets.is_empty(), "an open batch holds a record");
            }
            assert!(queue.in_flight <= self.in_flight_max.max(1));
            let stamped: Vec<SendKey> = queue.sealed.iter().filter_map(|b| b.sent_as).collect();
            assert!(
                stamped.windows(2).all(|w| w[0] < w[1]),
                "batches back for a retry wait in send order"
            );
            assert!(
                queue
                    .sealed
                    .iter()
                    .skip_while(|b| b.sent_as.is_some())
                    .all(|b| b.sent_as.is_none()),
                "retries wait before batches never sent"
            );
            assert!(stamped
                .iter()
                .all(|k| queue.window.iter().any(|(w, done)| w == k && !done)));
            assert!(queue
                .window
                .iter()
                .zip(queue.window.iter().skip(1))
                .all(|(a, b)| a.0 < b.0));
            assert!(queue.window.len() <= self.in_flight_max.max(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::RecordBatch;

    fn record(value: &[u8]) -> Record<'_> {
        Record {
            timestamp_ms: 1_000,
            key: None,
            value: Some(value),
            headers: &[],
        }
    }

    #[test]
    fn linger_trigger_releases_a_batch_only_after_linger() {
        // Proves an open batch waits `linger` from its first record, then
        // goes out as one batch holding every record appended meanwhile.
        let start = Instant::now();
        let linger = Duration::from_millis(5);
        let mut accumulator = Accumulator::new(64 << 10, linger, Compression::None);
        let tp = TopicPartition::new("t", 0);
        for i in 0..3u32 {
            accumulator.append(
                &tp,
                &record(b"v"),
                i,
                start + Duration::from_millis(i.into()),
            );
        }
        assert!(accumulator
            .drain_ready(start + Duration::from_millis(4), false)
            .is_empty());
        assert_eq!(accumulator.next_wakeup(), Some(start + linger));
        let ready = accumulator.drain_ready(start + linger, false);
        assert_eq!(ready.len(), 1);
        assert_eq!(ready[0].tickets, vec![0, 1, 2]);
        let bytes = ready[0].bytes.as_ref().unwrap();
        assert_eq!(
            RecordBatch::parse(bytes, 1 << 20)
                .unwrap()
                .header()
                .record_count,
            3
        );
        accumulator.check_invariants();
    }

    #[test]
    fn size_trigger_seals_before_the_bound_is_passed() {
        // Proves batches never exceed batch_bytes_max (unless one record is
        // bigger than it), full batches are ready without lingering, and
        // records keep their order across batches.
        let start = Instant::now();
        let batch_bytes_max = 1024;
        let mut accumulator =
            Accumulator::new(batch_bytes_max, Duration::from_secs(60), Compression::None);
        let tp = TopicPartition::new("t", 0);
        let value = [7u8; 100];
        for i in 0..30u32 {
            accumulator.append(&tp, &record(&value), i, start);
        }
        let sealed = accumulator.take_seal_events().len();
        assert!(
            sealed >= 2,
            "30 records of ~110 bytes fill several 1 KiB batches"
        );
        let mut order = Vec::new();
        let mut batches = 0;
        loop {
            let ready = accumulator.drain_ready(start, false);
            if ready.is_empty() {
                break;
            }
            assert_eq!(ready.len(), 1, "one batch in flight per partition");
            let batch = &ready[0];
            assert!(batch.size_bytes_uncompressed <= batch_bytes_max);
            order.extend(batch.tickets.iter().copied());
            accumulator.complete(batch);
            batches += 1;
        }
        assert_eq!(batches, sealed, "only sealed batches leave before linger");
        // The rest is in the open batch, released by a forced drain (flush).
        let rest = accumulator.drain_ready(start, true);
        order.extend(rest[0].tickets.iter().copied());
        assert_eq!(order, (0..30).collect::<Vec<_>>());
        // A record above the bound travels alone.
        let big = [1u8; 2048];
        let tp1 = TopicPartition::new("t", 1);
        accumulator.append(&tp1, &record(b"x"), 100, start);
        accumulator.append(&tp1, &record(&big), 101, start);
        let ready = accumulator.drain_ready(start, false);
        assert_eq!(ready[0].tickets, vec![100]);
    }

    #[test]
    fn retried_batch_keeps_partition_order_and_waits_for_backoff() {
        // Proves a batch put back for retry is sent before later batches of
        // its partition, and not before its retry time.
        let start = Instant::now();
        let mut accumulator = Accumulator::new(1 << 20, Duration::ZERO, Compression::Zstd);
        let tp = TopicPartition::new("t", 0);
        accumulator.append(&tp, &record(b"first"), 1u32, start);
        let first = accumulator.drain_ready(start, false).pop().unwrap();
        accumulator.append(&tp, &record(b"second"), 2u32, start);
        assert!(
            accumulator.drain_ready(start, false).is_empty(),
            "one in flight"
        );
        let retry_at = start + Duration::from_millis(100);
        accumulator.retry(first, retry_at);
        assert!(
            accumulator.drain_ready(start, false).is_empty(),
            "backoff holds"
        );
        assert_eq!(accumulator.next_wakeup(), Some(retry_at));
        let again = accumulator.drain_ready(retry_at, false).pop().unwrap();
        assert_eq!(again.tickets, vec![1]);
        accumulator.complete(&again);
        let second = accumulator.drain_ready(retry_at, false).pop().unwrap();
        assert_eq!(second.tickets, vec![2]);
        accumulator.complete(&second);
        assert!(accumulator.is_empty());
    }

    #[test]
    fn an_idempotent_producer_numbers_batches_per_partition_and_retries_keep_theirs() {
        // Proves batches of a partition get consecutive sequences counted in
        // records, a retried batch goes out with the stamp it had, and a new
        // identity starts every partition again at 0.
        let start = Instant::now();
        let mut accumulator = Accumulator::new(1 << 20, Duration::ZERO, Compression::None);
        let identity = ProducerIdentity {
            id: ProducerId(9),
            epoch: ProducerEpoch(0),
        };
        accumulator.set_identity(identity);
        let tp = TopicPartition::new("t", 0);
        let header = |batch: &SealedBatch<u32>| {
            *RecordBatch::parse(batch.bytes.as_ref().unwrap(), 1 << 20)
                .unwrap()
                .header()
        };
        for i in 0..3 {
            accumulator.append(&tp, &record(b"a"), i, start);
        }
        let first = accumulator.drain_ready(start, false).pop().unwrap();
        assert_eq!(header(&first).base_sequence, Sequence(0));
        assert_eq!(header(&first).producer_id, ProducerId(9));
        accumulator.append(&tp, &record(b"b"), 3, start);
        accumulator.retry(first, start);
        let again = accumulator.drain_ready(start, false).pop().unwrap();
        assert_eq!(
            header(&again).base_sequence,
            Sequence(0),
            "a retry keeps its stamp"
        );
        accumulator.complete(&again);
        let second = accumulator.drain_ready(start, false).pop().unwrap();
        assert_eq!(header(&second).base_sequence, Sequence(3));
        accumulator.complete(&second);
        accumulator.set_identity(ProducerIdentity {
            id: ProducerId(10),
            epoch: ProducerEpoch(0),
        });
        accumulator.append(&tp, &record(b"c"), 4, start);
        let third = accumulator.drain_ready(start, false).pop().unwrap();
        assert_eq!(header(&third).producer_id, ProducerId(10));
        assert_eq!(header(&third).base_sequence, Sequence(0));
    }
}
