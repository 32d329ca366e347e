//! The transaction coordinator's state machine without a broker: zombie
//! fencing, the two-phase commit and abort, timeouts, retries, epoch
//! exhaustion, expiry, and a coordinator rebuilt from the records
//! (failover) owing exactly the prepared transactions' markers. A property
//! test drives random requests and checks after each that the state is what
//! replaying the emitted records gives and epochs only move forward.

use broker::txn::coordinator::{
    MarkerWork, TxnCoordinator, TxnCoordinatorConfig, TxnError, Written, PRODUCER_EPOCH_MAX,
};
use broker::txn::records::{TxnMetadata, TxnRecord, TxnState};
use broker::txn::TopicPartition;
use proptest::prelude::*;
use protocol::{ErrorCode, ProducerEpoch, ProducerId};

const TIMEOUT_MS: u32 = 10_000;

fn tp(topic: &str, partition: u32) -> TopicPartition {
    TopicPartition::new(topic, partition)
}

fn rebuilt(records: &[TxnRecord]) -> TxnCoordinator {
    let mut c = TxnCoordinator::new(TxnCoordinatorConfig::default());
    for r in records {
        c.replay(r);
    }
    c
}

fn keep<T>(log: &mut Vec<TxnRecord>, w: Written<T>) -> (Result<T, TxnError>, Vec<MarkerWork>) {
    log.extend(w.records);
    (w.response, w.markers)
}

#[test]
fn a_new_instance_fences_the_old_and_aborts_what_it_left_open() {
    let mut c = TxnCoordinator::new(TxnCoordinatorConfig::default());
    let mut log = Vec::new();
    let (first, _) = keep(
        &mut log,
        c.init_producer_id("t", TIMEOUT_MS, ProducerId(7), 0),
    );
    let (pid, epoch) = first.unwrap();
    assert_eq!((pid, epoch), (ProducerId(7), ProducerEpoch(0)));
    let parts = [tp("a", 0), tp("b", 1)];
    keep(&mut log, c.add_partitions("t", pid, epoch, &parts, 10))
        .0
        .unwrap();

    // A second instance starts: the open transaction is aborted under a
    // bumped epoch and the new instance is asked to retry.
    let (retry, markers) = keep(
        &mut log,
        c.init_producer_id("t", TIMEOUT_MS, ProducerId(8), 20),
    );
    assert_eq!(retry.unwrap_err().code(), ErrorCode::ConcurrentTransactions);
    assert_eq!(
        markers,
        [MarkerWork {
            transactional_id: "t".into(),
            producer_id: pid,
            producer_epoch: ProducerEpoch(1),
            commit: false,
            partitions: parts.to_vec(),
            transaction_number: 1,
        }]
    );
    // The zombie is fenced everywhere from now on.
    let zombie = c.add_partitions("t", pid, epoch, &parts, 21);
    assert_eq!(
        zombie.response.unwrap_err().code(),
        ErrorCode::ProducerFenced
    );
    let zombie = c.end_txn("t", pid, epoch, true, 21);
    assert_eq!(
        zombie.response.unwrap_err().code(),
        ErrorCode::ProducerFenced
    );
    // Still completing: the new instance retries later.
    let again = c.init_producer_id("t", TIMEOUT_MS, ProducerId(9), 22);
    assert_eq!(
        again.response.unwrap_err().code(),
        ErrorCode::ConcurrentTransactions
    );

    log.extend(c.markers_written(&markers[0], 30));
    assert_eq!(c.get("t").unwrap().state, TxnState::CompleteAbort);
    let (ok, _) = keep(
        &mut log,
        c.init_producer_id("t", TIMEOUT_MS, ProducerId(10), 40),
    );
    assert_eq!(ok.unwrap(), (pid, ProducerEpoch(2)));
    assert!(rebuilt(&log).same_state(&c));
    c.check_invariants();
}

#[test]
fn commit_is_two_phase_and_retries_are_answered() {
    let mut c = TxnCoordinator::new(TxnCoordinatorConfig::default());
    let mut log = Vec::new();
    let (pid, epoch) = keep(
        &mut log,
        c.init_producer_id("t", TIMEOUT_MS, ProducerId(1), 0),
    )
    .0
    .unwrap();
    keep(
        &mut log,
        c.add_partitions("t", pid, epoch, &[tp("b", 1)], 1),
    )
    .0
    .unwrap();
    // Adding what is already there writes nothing.
    let same = c.add_partitions("t", pid, epoch, &[tp("b", 1)], 2);
    assert!(same.records.is_empty() && same.response.is_ok());
    keep(
        &mut log,
        c.add_partitions("t", pid, epoch, &[tp("a", 0)], 3),
    )
    .0
    .unwrap();
    let (ended, markers) = keep(&mut log, c.end_txn("t", pid, epoch, true, 4));
    ended.unwrap();
    assert_eq!(markers.len(), 1);
    assert!(markers[0].commit);
    assert_eq!(markers[0].partitions, [tp("a", 0), tp("b", 1)]);
    assert_eq!(c.get("t").unwrap().state, TxnState::PrepareCommit);

    // While markers are written: no new transaction, a repeated commit
    // waits, an abort is refused.
    let busy = c.add_partitions("t", pid, epoch, &[tp("c", 0)], 5);
    assert_eq!(
        busy.response.unwrap_err().code(),
        ErrorCode::ConcurrentTransactions
    );
    let repeat = c.end_txn("t", pid, epoch, true, 5);
    assert_eq!(
        repeat.response.unwrap_err().code(),
        ErrorCode::ConcurrentTransactions
    );
    let abort = c.end_txn("t", pid, epoch, false, 5);
    assert_eq!(
        abort.response.unwrap_err().code(),
        ErrorCode::InvalidTxnState
    );

    // A coordinator that takes over from the log owes the same markers.
    let failover = rebuilt(&log);
    assert_eq!(failover.pending_markers(), markers);

    // A report for another epoch changes nothing; the right one completes.
    let stale = MarkerWork {
        producer_epoch: ProducerEpoch(5),
        ..markers[0].clone()
    };
    assert!(c.markers_written(&stale, 6).is_empty());
    let earlier = MarkerWork {
        transaction_number: markers[0].transaction_number - 1,
        ..markers[0].clone()
    };
    assert!(c.markers_written(&earlier, 6).is_empty());
    log.extend(c.markers_written(&markers[0], 6));
    assert_eq!(c.get("t").unwrap().state, TxnState::CompleteCommit);
    assert!(c.pending_markers().is_empty());
    let retried = c.end_txn("t", pid, epoch, true, 7);
    assert!(retried.response.is_ok() && retried.records.is_empty());
    let wrong = c.end_txn("t", pid, epoch, false, 7);
    assert_eq!(
        wrong.response.unwrap_err().code(),
        ErrorCode::InvalidTxnState
    );
    // The next transaction starts from nothing.
    keep(
        &mut log,
        c.add_partitions("t", pid, epoch, &[tp("z", 0)], 8),
    )
    .0
    .unwrap();
    assert_eq!(c.get("t").unwrap().partitions, [tp("z", 0)]);
    // Each transaction has its own number, which its markers carry.
    assert_eq!(
        c.get("t").unwrap().transaction_number,
        markers[0].transaction_number + 1
    );
    assert!(rebuilt(&log).same_state(&c));
}

#[test]
fn timeouts_abort_under_a_new_epoch_and_idle_ids_expire() {
    let mut c = TxnCoordinator::new(TxnCoordinatorConfig {
        id_expiration_ms: 100_000,
    });
    let (pid, epoch) = c
        .init_producer_id("slow", TIMEOUT_MS, ProducerId(1), 0)
        .response
        .unwrap();
    c.init_producer_id("idle", TIMEOUT_MS, ProducerId(2), 0)
        .response
        .unwrap();
    c.add_partitions("slow", pid, epoch, &[tp("a", 0)], 1_000)
        .response
        .unwrap();
    assert!(c.tick(1_000 + i64::from(TIMEOUT_MS)).records.is_empty());
    let timed_out = c.tick(1_001 + i64::from(TIMEOUT_MS));
    assert_eq!(timed_out.markers.len(), 1);
    assert!(!timed_out.markers[0].commit);
    assert_eq!(timed_out.markers[0].producer_epoch, ProducerEpoch(1));
    let late = c.end_txn("slow", pid, epoch, true, 20_000);
    assert_eq!(late.response.unwrap_err().code(), ErrorCode::ProducerFenced);
    // "idle" has done nothing for longer than the expiration.
    let expired = c.tick(100_001);
    assert_eq!(
        expired.records,
        [TxnRecord {
            transactional_id: "idle".into(),
            value: None,
        }]
    );
    assert!(c.get("idle").is_none());
    assert!(
        c.get("slow").is_some(),
        "a prepared transaction never expires"
    );
}

#[test]
fn an_exhausted_epoch_takes_a_new_producer_id_and_bad_requests_are_refused() {
    let mut c = TxnCoordinator::new(TxnCoordinatorConfig::default());
    c.replay(&TxnRecord {
        transactional_id: "old".into(),
        value: Some(TxnMetadata {
            producer_id: ProducerId(3),
            producer_epoch: ProducerEpoch(PRODUCER_EPOCH_MAX),
            timeout_ms: TIMEOUT_MS,
            state: TxnState::CompleteCommit,
            start_ms: -1,
            update_ms: 0,
            partitions: Vec::new(),
            transaction_number: 1,
        }),
    });
    let fresh = c.init_producer_id("old", TIMEOUT_MS, ProducerId(99), 1);
    assert_eq!(fresh.response.unwrap(), (ProducerId(99), ProducerEpoch(0)));
    // An open transaction at the last startable epoch is fenced under the
    // same producer id (the partitions know it by that id); the next start
    // takes a new id.
    c.replay(&TxnRecord {
        transactional_id: "edge".into(),
        value: Some(TxnMetadata {
            producer_id: ProducerId(4),
            producer_epoch: ProducerEpoch(PRODUCER_EPOCH_MAX),
            timeout_ms: TIMEOUT_MS,
            state: TxnState::Ongoing,
            start_ms: 0,
            update_ms: 0,
            partitions: vec![tp("a", 0)],
            transaction_number: 1,
        }),
    });
    let fenced = c.init_producer_id("edge", TIMEOUT_MS, ProducerId(100), 1);
    assert_eq!(fenced.markers.len(), 1);
    assert_eq!(fenced.markers[0].producer_id, ProducerId(4));
    assert_eq!(fenced.markers[0].producer_epoch, ProducerEpoch(i16::MAX));
    c.markers_written(&fenced.markers[0], 2);
    let restarted = c.init_producer_id("edge", TIMEOUT_MS, ProducerId(101), 3);
    assert_eq!(
        restarted.response.unwrap(),
        (ProducerId(101), ProducerEpoch(0))
    );
    c.check_invariants();
    let bad = c.init_producer_id("t", 10, ProducerId(1), 0);
    assert_eq!(
        bad.response.unwrap_err().code(),
        ErrorCode::InvalidTransactionTimeout
    );
    let bad = c.init_producer_id(&"x".repeat(256), TIMEOUT_MS, ProducerId(1), 0);
    assert_eq!(bad.response.unwrap_err().code(), ErrorCode::InvalidRequest);
    let unknown = c.add_partitions("nobody", ProducerId(1), ProducerEpoch(0), &[tp("a", 0)], 0);
    assert_eq!(
        unknown.response.unwrap_err().code(),
        ErrorCode::InvalidProducerIdMapping
    );
    let wrong_id = c.end_txn("old", ProducerId(3), ProducerEpoch(0), true, 0);
    assert_eq!(
        wrong_id.response.unwrap_err().code(),
        ErrorCode::InvalidProducerIdMapping
    );
}

#[derive(Clone, Debug)]
enum Op {
    Init { id: u8 },
    Add { id: u8, partition: u32, stale: bool },
    End { id: u8, commit: bool },
    MarkersDone { index: u8 },
    Tick { advance_ms: u32 },
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0u8..3).prop_map(|id| Op::Init { id }),
        5 => (0u8..3, 0u32..4, proptest::bool::weighted(0.1))
            .prop_map(|(id, partition, stale)| Op::Add { id, partition, stale }),
        3 => (0u8..3, any::<bool>()).prop_map(|(id, commit)| Op::End { id, commit }),
        3 => (0u8..4).prop_map(|index| Op::MarkersDone { index }),
        1 => (0u32..30_000).prop_map(|advance_ms| Op::Tick { advance_ms }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_coordinator_is_its_records(ops in proptest::collection::vec(op_strategy(), 1..80)) {
        let mut c = TxnCoordinator::new(TxnCoordinatorConfig { id_expiration_ms: 60_000 });
        let mut log: Vec<TxnRecord> = Vec::new();
        let mut owed: Vec<MarkerWork> = Vec::new();
        let mut now_ms = 0i64;
        let mut next_id = 100i64;
        // What each id's current producer believes it is.
        let mut producers: [Option<(ProducerId, ProducerEpoch)>; 3] = [None; 3];
        for op in ops {
            now_ms += 1;
            let before: Vec<(String, (i64, i16))> = c
                .list()
                .map(|(id, m)| (id.clone(), (m.producer_id.0, m.producer_epoch.0)))
                .collect();
            let (records, markers) = match op {
                Op::Init { id } => {
                    next_id += 1;
                    let w = c.init_producer_id(&format!("t{id}"), TIMEOUT_MS, ProducerId(next_id), now_ms);
                    if let Ok(identity) = &w.response {
                        producers[id as usize] = Some(*identity);
                    }
                    (w.records, w.markers)
                }
                Op::Add { id, partition, stale } => {
                    let Some((pid, epoch)) = producers[id as usize] else { continue };
                    let epoch = if stale && epoch.0 > 0 { ProducerEpoch(epoch.0 - 1) } else { epoch };
                    let w = c.add_partitions(&format!("t{id}"), pid, epoch, &[TopicPartition::new("p", partition)], now_ms);
                    if stale && epoch != producers[id as usize].unwrap().1 {
                        prop_assert!(w.response.is_err(), "a stale epoch is refused");
                    }
                    (w.records, w.markers)
                }
                Op::End { id, commit } => {
                    let Some((pid, epoch)) = producers[id as usize] else { continue };
                    let w = c.end_txn(&format!("t{id}"), pid, epoch, commit, now_ms);
                    (w.records, w.markers)
                }
                Op::MarkersDone { index } => {
                    if owed.is_empty() { continue; }
                    let work = owed.remove(usize::from(index) % owed.len());
                    (c.markers_written(&work, now_ms), Vec::new())
                }
                Op::Tick { advance_ms } => {
                    now_ms += i64::from(advance_ms);
                    let w = c.tick(now_ms);
                    (w.records, w.markers)
                }
            };
            // Markers are owed exactly by the prepared transactions they name.
            for m in &markers {
                let meta = c.get(&m.transactional_id).expect("a prepared id exists");
                prop_assert!(meta.state.is_prepared());
                prop_assert_eq!(&meta.partitions, &m.partitions);
                prop_assert!(!m.partitions.is_empty());
            }
            owed.extend(markers);
            log.extend(records);
            c.check_invariants();
            prop_assert!(rebuilt(&log).same_state(&c), "the state is the replay of its records");
            let pending = c.pending_markers();
            for m in &pending {
                prop_assert!(owed.contains(m), "every pending marker was handed out: {:?}", m);
            }
            // Epochs of an id only move forward (a new producer id restarts them).
            for (id, (pid, epoch)) in before {
                if let Some(m) = c.get(&id) {
                    prop_assert!(m.producer_id.0 != pid || m.producer_epoch.0 >= epoch);
                }
            }
        }
    }
}
