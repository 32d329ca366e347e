//! The producer's batching with several batches in flight per partition,
//! against a model of a partition leader that appends a producer's batches
//! only in sequence order and answers a repeat of any of its last five with
//! the original offsets (as the broker does). The leader takes requests in
//! any order and their answers come back in any other order (the broker
//! serves a connection's requests concurrently); requests are lost before
//! or after the append, or refused with a retriable error; the
//! accumulator's own retry decision (`on_failed_send`) decides what goes
//! out again. An idle producer may be forgotten by a partition (its state
//! expired): its next batches there are refused until it numbers them
//! from 0 again. Every record must land exactly once, in the order
//! it was appended, and be reported at the offset where it landed.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use client::accumulator::{Accumulator, FailedSend, ProducerIdentity, SealedBatch, SendFailure};
use client::TopicPartition;
use proptest::prelude::*;
use protocol::{Compression, ProducerEpoch, ProducerId, Record};

#[derive(Clone, Copy, Debug)]
enum Fate {
    /// Appended (or recognised as a repeat) and answered.
    Answered,
    /// Never reached the leader.
    RequestLost,
    /// Appended, but the answer was lost.
    ResponseLost,
    /// Refused with a retriable error before the append (say, a leader
    /// change).
    Refused,
}

#[derive(Clone, Debug)]
enum Op {
    Append {
        partition: u8,
        records: u8,
    },
    Send,
    /// The leader takes the request at this index among those it has not
    /// taken (modulo their count).
    Process {
        pick: u16,
        fate: Fate,
    },
    /// The answer at this index among those not delivered reaches the
    /// producer.
    Deliver {
        pick: u16,
    },
    Advance {
        ms: u16,
    },
    /// With nothing of the producer outstanding, a partition forgets it.
    Forget {
        partition: u8,
    },
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let fate = prop_oneof![
        6 => Just(Fate::Answered),
        1 => Just(Fate::RequestLost),
        1 => Just(Fate::ResponseLost),
        1 => Just(Fate::Refused),
    ];
    prop_oneof![
        4 => (0u8..2, 1u8..4).prop_map(|(partition, records)| Op::Append { partition, records }),
        3 => Just(Op::Send),
        4 => (any::<u16>(), fate).prop_map(|(pick, fate)| Op::Process { pick, fate }),
        4 => any::<u16>().prop_map(|pick| Op::Deliver { pick }),
        1 => (0u16..300).prop_map(|ms| Op::Advance { ms }),
        1 => (0u8..2).prop_map(|partition| Op::Forget { partition }),
    ]
}

/// One partition's leader: the log (record tickets) and the producer's last
/// five batches (first sequence, record count, base offset).
#[derive(Default)]
struct Leader {
    log: Vec<u32>,
    recent: VecDeque<(i32, usize, usize)>,
}

enum Answer {
    Appended(usize),
    OutOfOrder,
    UnknownProducer,
}

impl Leader {
    fn receive(&mut self, batch: &SealedBatch<u32>) -> Answer {
        let (_, first) = batch.stamped.expect("an idempotent producer stamps");
        let count = batch.tickets.len();
        if let Some((_, _, base)) = self
            .recent
            .iter()
            .find(|(f, c, _)| *f == first.0 && *c == count)
        {
            return Answer::Appended(*base);
        }
        if self.recent.is_empty() && first.0 != 0 {
            // A producer the partition does not know starts at 0.
            return Answer::UnknownProducer;
        }
        let expected = self.recent.back().map_or(0, |(f, c, _)| *f + *c as i32);
        if first.0 != expected {
            return Answer::OutOfOrder;
        }
        let base = self.log.len();
        self.log.extend(&batch.tickets);
        self.recent.push_back((first.0, count, base));
        if self.recent.len() > 5 {
            self.recent.pop_front();
        }
        Answer::Appended(base)
    }
}

struct Run {
    accumulator: Accumulator<u32>,
    leaders: BTreeMap<TopicPartition, Leader>,
    /// Sent batches the leader has not taken yet.
    in_flight: Vec<SealedBatch<u32>>,
    /// Taken, with the answer on its way (`None`: lost or refused).
    answered: Vec<(SealedBatch<u32>, Option<Answer>)>,
    appended: BTreeMap<TopicPartition, Vec<u32>>,
    delivered: BTreeMap<u32, usize>,
    next_ticket: u32,
    now: Instant,
    in_flight_max: usize,
}

impl Run {
    fn send(&mut self, force: bool) {
        let ready = self.accumulator.drain_ready(self.now, force);
        self.in_flight.extend(ready);
        let mut per_partition: BTreeMap<&TopicPartition, usize> = BTreeMap::new();
        let answered = self.answered.iter().map(|(b, _)| b);
        for batch in self.in_flight.iter().chain(answered) {
            *per_partition.entry(&batch.topic_partition).or_default() += 1;
        }
        assert!(per_partition.values().all(|n| *n <= self.in_flight_max));
        self.accumulator.check_invariants();
    }

    /// A wakeup that is due means a send: the producer's task sleeps until
    /// `next_wakeup` and then drains, so a due wakeup that sends nothing
    /// would spin.
    fn check_wakeup(&mut self) {
        if self
            .accumulator
            .next_wakeup()
            .is_some_and(|at| at <= self.now)
        {
            let ready = self.accumulator.drain_ready(self.now, false);
            assert!(!ready.is_empty(), "a due wakeup sends something");
            self.in_flight.extend(ready);
        }
    }

    fn process(&mut self, pick: usize, fate: Fate) {
        if self.in_flight.is_empty() {
            return;
        }
        let batch = self.in_flight.remove(pick % self.in_flight.len());
        let leader = self
            .leaders
            .entry(batch.topic_partition.clone())
            .or_default();
        let answer = match fate {
            Fate::Answered => Some(leader.receive(&batch)),
            Fate::ResponseLost => {
                leader.receive(&batch);
                None
            }
            Fate::RequestLost | Fate::Refused => None,
        };
        self.answered.push((batch, answer));
    }

    fn deliver(&mut self, pick: usize) {
        if self.answered.is_empty() {
            return;
        }
        let (batch, answer) = self.answered.remove(pick % self.answered.len());
        match answer {
            Some(Answer::Appended(base)) => {
                for (i, ticket) in batch.tickets.iter().enumerate() {
                    assert!(
                        self.delivered.insert(*ticket, base + i).is_none(),
                        "record {ticket} reported twice"
                    );
                }
                self.accumulator.complete(&batch);
            }
            answer => {
                let failure = match answer {
                    Some(Answer::OutOfOrder) => SendFailure::OutOfOrder,
                    Some(Answer::UnknownProducer) => SendFailure::UnknownProducer,
                    _ => SendFailure::Retriable,
                };
                let verdict = self.accumulator.on_failed_send(
                    batch,
                    failure,
                    100,
                    self.now,
                    Duration::from_millis(10),
                );
                if let FailedSend::Failed(batch) = verdict {
                    panic!("batch {:?} failed for good", batch.tickets);
                }
            }
        }
        self.accumulator.check_invariants();
    }
}

fn run(ops: Vec<Op>, in_flight_max: usize) {
    let start = Instant::now();
    let mut accumulator = Accumulator::new(1 << 20, Duration::ZERO, Compression::None);
    accumulator.set_identity(ProducerIdentity {
        id: ProducerId(1),
        epoch: ProducerEpoch(0),
    });
    accumulator.set_in_flight_max(in_flight_max);
    let mut run = Run {
        accumulator,
        leaders: BTreeMap::new(),
        in_flight: Vec::new(),
        answered: Vec::new(),
        appended: BTreeMap::new(),
        delivered: BTreeMap::new(),
        next_ticket: 0,
        now: start,
        in_flight_max,
    };
    for op in ops {
        match op {
            Op::Append { partition, records } => {
                let tp = TopicPartition::new("t", i32::from(partition));
                for _ in 0..records {
                    let ticket = run.next_ticket;
                    run.next_ticket += 1;
                    let value = ticket.to_be_bytes();
                    let record = Record {
                        timestamp_ms: 0,
                        key: None,
                        value: Some(&value),
                        headers: &[],
                    };
                    run.accumulator.append(&tp, &record, ticket, run.now);
                    run.appended.entry(tp.clone()).or_default().push(ticket);
                }
            }
            Op::Send => run.send(false),
            Op::Process { pick, fate } => run.process(usize::from(pick), fate),
            Op::Deliver { pick } => run.deliver(usize::from(pick)),
            Op::Advance { ms } => run.now += Duration::from_millis(u64::from(ms)),
            Op::Forget { partition } => {
                // Only an idle producer is forgotten (expiry counts a day
                // of silence).
                if run.accumulator.is_empty() {
                    let tp = TopicPartition::new("t", i32::from(partition));
                    if let Some(leader) = run.leaders.get_mut(&tp) {
                        leader.recent.clear();
                    }
                }
            }
        }
        run.check_wakeup();
    }
    // Then everything goes through: answered in the order sent.
    let mut rounds = 0;
    while !run.accumulator.is_empty() {
        rounds += 1;
        assert!(rounds < 10_000, "the producer drains");
        run.now += Duration::from_millis(50);
        run.send(true);
        while !run.in_flight.is_empty() {
            run.process(0, Fate::Answered);
        }
        while !run.answered.is_empty() {
            run.deliver(0);
        }
    }
    for (tp, tickets) in &run.appended {
        let log = run.leaders.get(tp).map_or(&[][..], |l| &l.log[..]);
        assert_eq!(log, &tickets[..], "{tp:?}: each record once, in order");
        for (offset, ticket) in log.iter().enumerate() {
            assert_eq!(run.delivered.get(ticket), Some(&offset));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_record_lands_once_and_in_order(
        ops in proptest::collection::vec(op_strategy(), 1..200),
        in_flight_max in 1usize..=5,
    ) {
        run(ops, in_flight_max);
    }
}

/// An idempotent producer's accumulator, five batches per partition in
/// flight, no linger.
fn five_in_flight() -> Accumulator<u32> {
    let mut accumulator = Accumulator::new(1 << 20, Duration::ZERO, Compression::None);
    accumulator.set_identity(ProducerIdentity {
        id: ProducerId(1),
        epoch: ProducerEpoch(0),
    });
    accumulator.set_in_flight_max(5);
    accumulator
}

#[test]
fn five_go_out_together_and_a_retry_waits_for_the_rest() {
    // Proves a partition has up to five batches out; when one comes back
    // for a retry nothing new leaves until the others are back, the retries
    // then leave in their original order, and no new batch leaves while it
    // would make the broker forget one still unanswered.
    let start = Instant::now();
    let mut accumulator = five_in_flight();
    let tp = TopicPartition::new("t", 0);
    let mut sent = Vec::new();
    for ticket in 0..7u32 {
        let value = [ticket as u8];
        let record = Record {
            timestamp_ms: 0,
            key: None,
            value: Some(&value),
            headers: &[],
        };
        accumulator.append(&tp, &record, ticket, start);
        sent.extend(accumulator.drain_ready(start, false));
    }
    assert_eq!(sent.len(), 5, "five in flight, the rest waits");
    let mut sent: VecDeque<_> = sent.into();
    let first = sent.pop_front().unwrap();
    let second = sent.pop_front().unwrap();
    // The second fails first, then the first: both back, three still out.
    assert!(matches!(
        accumulator.on_failed_send(second, SendFailure::Retriable, 5, start, Duration::ZERO),
        FailedSend::Retried
    ));
    assert!(matches!(
        accumulator.on_failed_send(first, SendFailure::Retriable, 5, start, Duration::ZERO),
        FailedSend::Retried
    ));
    assert!(accumulator.drain_ready(start, false).is_empty());
    for batch in sent.drain(..) {
        accumulator.complete(&batch);
    }
    // The window: 0 and 1 unanswered, 2..=4 answered. A sixth batch would
    // push 0 out of the broker's memory of the last five: it waits.
    let again = accumulator.drain_ready(start, false);
    let order: Vec<&[u32]> = again.iter().map(|b| &b.tickets[..]).collect();
    assert_eq!(order, [&[0][..], &[1]], "the retries, in order, alone");
    // An out-of-order refusal behind an unacknowledged batch is retried;
    // with nothing earlier outstanding it is final.
    let mut again: VecDeque<_> = again.into();
    let zero = again.pop_front().unwrap();
    let one = again.pop_front().unwrap();
    assert!(matches!(
        accumulator.on_failed_send(one, SendFailure::OutOfOrder, 0, start, Duration::ZERO),
        FailedSend::Retried
    ));
    accumulator.complete(&zero);
    let mut next: VecDeque<_> = accumulator.drain_ready(start, false).into();
    let one = next.pop_front().unwrap();
    assert_eq!(one.tickets, [1]);
    assert_eq!(next[0].tickets, [5, 6], "room in the window again");
    assert!(matches!(
        accumulator.on_failed_send(one, SendFailure::OutOfOrder, 0, start, Duration::ZERO),
        FailedSend::Failed(_)
    ));
    accumulator.complete(&next[0]);
    assert!(accumulator.is_empty());
}

#[test]
fn a_full_window_gives_no_wakeup() {
    // Proves that while the oldest of five batches is unanswered and the
    // four after it are answered, a new batch waits (the broker would
    // forget the oldest) and the producer is not woken for it, so its task
    // sleeps instead of spinning; the answer frees the window.
    let start = Instant::now();
    let mut accumulator = five_in_flight();
    let tp = TopicPartition::new("t", 0);
    let record = |value: &'static [u8]| Record {
        timestamp_ms: 0,
        key: None,
        value: Some(value),
        headers: &[],
    };
    let mut sent = Vec::new();
    for ticket in 0..5u32 {
        accumulator.append(&tp, &record(b"v"), ticket, start);
        sent.extend(accumulator.drain_ready(start, false));
    }
    assert_eq!(sent.len(), 5);
    for batch in &sent[1..] {
        accumulator.complete(batch);
    }
    accumulator.append(&tp, &record(b"w"), 5, start);
    let later = start + Duration::from_secs(1);
    assert_eq!(accumulator.next_wakeup(), None, "nothing to wake up for");
    assert!(accumulator.drain_ready(later, false).is_empty());
    accumulator.complete(&sent[0]);
    assert!(accumulator.next_wakeup().is_some());
    let next = accumulator.drain_ready(later, false);
    assert_eq!(next[0].tickets, [5]);
}
