//! Transactions in one partition log against a model: transactional
//! batches, commit and abort markers, plain batches, clean and unclean
//! restarts and truncations. After every step the aborted transactions the
//! log returns, its last stable offset and its producer state match what the
//! batches on disk give, and survive a reopen.

mod support;

use std::rc::Rc;

use broker::clock::ManualClock;
use broker::log::producer_state::SequenceError;
use broker::log::txn_index::AbortedTxn;
use broker::log::{AppendInfo, FlushPolicy, LogConfig, LogError, PartitionLog};
use proptest::prelude::*;
use protocol::record_batch::marker::{build_marker_batch, MarkerKind, TxnMarker};
use protocol::record_batch::stamp_producer;
use protocol::{
    BatchBuilder, Compression, LeaderEpoch, Offset, ProducerEpoch, ProducerId, Record, Sequence,
};
use support::*;

const PRODUCERS: u8 = 3;
const LEADER_EPOCH: LeaderEpoch = LeaderEpoch(1);

#[derive(Clone, Debug)]
enum Op {
    TxnSend { producer: u8, count: u8 },
    Plain { producer: u8 },
    End { producer: u8, commit: bool },
    CloseReopen,
    Crash,
    Truncate { keep_permille: u16 },
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (0..PRODUCERS, 1u8..4).prop_map(|(producer, count)| Op::TxnSend { producer, count }),
        3 => (0..PRODUCERS).prop_map(|producer| Op::Plain { producer }),
        5 => (0..PRODUCERS, any::<bool>()).prop_map(|(producer, commit)| Op::End { producer, commit }),
        1 => Just(Op::CloseReopen),
        1 => Just(Op::Crash),
        1 => (0u16..1000).prop_map(|keep_permille| Op::Truncate { keep_permille }),
    ]
}

fn config() -> LogConfig {
    small_segments(FlushPolicy::Always)
}

fn producer_id(producer: u8) -> ProducerId {
    ProducerId(200 + i64::from(producer))
}

/// What the model knows was appended, in offset order.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Txn,
    Plain,
    Marker(bool),
}

#[derive(Clone, Copy, Debug)]
struct Event {
    producer: u8,
    base: i64,
    count: i32,
    kind: Kind,
}

/// Replays the events: (open transactions' first offsets by producer,
/// aborted transactions, next sequence by producer).
fn derive(events: &[Event]) -> (Vec<Option<i64>>, Vec<AbortedTxn>, Vec<i32>) {
    let mut open = vec![None; PRODUCERS as usize];
    let mut sequences = vec![0; PRODUCERS as usize];
    let mut aborted = Vec::new();
    for e in events {
        let p = e.producer as usize;
        match e.kind {
            Kind::Txn => {
                open[p].get_or_insert(e.base);
                sequences[p] += e.count;
            }
            Kind::Plain => sequences[p] += e.count,
            Kind::Marker(commit) => {
                if let (Some(first), false) = (open[p].take(), commit) {
                    aborted.push(AbortedTxn {
                        producer_id: producer_id(e.producer),
                        first_offset: Offset(first),
                        last_offset: Offset(e.base),
                    });
                }
            }
        }
    }
    aborted.sort_by_key(|t| (t.first_offset, t.producer_id));
    (open, aborted, sequences)
}

fn data_batch(producer: u8, sequence: i32, count: u8, transactional: bool, tag: u64) -> Vec<u8> {
    let mut builder = BatchBuilder::new(if tag.is_multiple_of(2) {
        Compression::None
    } else {
        Compression::Zstd
    })
    .transactional(transactional);
    for i in 0..count {
        let value = format!("{tag}:{i}:{}", "v".repeat(300));
        builder.push(&Record {
            timestamp_ms: 1_000,
            key: Some(&[producer]),
            value: Some(value.as_bytes()),
            headers: &[],
        });
    }
    stamped(builder, producer, sequence)
}

/// Builds the batch and stamps it as `producer`'s (epoch 0) from `sequence`.
fn stamped(builder: BatchBuilder, producer: u8, sequence: i32) -> Vec<u8> {
    let mut bytes = builder.build().unwrap();
    stamp_producer(
        &mut bytes,
        producer_id(producer),
        ProducerEpoch(0),
        Sequence(sequence),
    );
    bytes
}

async fn append_marker(log: &PartitionLog, producer: u8, marker: TxnMarker) -> AppendInfo {
    let batch = build_marker_batch(producer_id(producer), ProducerEpoch(0), marker, 1_000);
    log.append_marker(&batch, LEADER_EPOCH, &|| true)
        .await
        .unwrap()
}

async fn check(log: &PartitionLog, events: &[Event]) {
    log.check_invariants();
    let end = log.log_end_offset();
    assert_eq!(
        events.last().map_or(0, |e| e.base + i64::from(e.count)),
        end.0,
        "the model and the log end agree"
    );
    let (open, aborted, _) = derive(events);
    assert_eq!(
        log.aborted_transactions(Offset::ZERO, end),
        aborted,
        "aborted transactions"
    );
    let lso = open.iter().flatten().min().map_or(end.0, |f| *f);
    assert_eq!(log.last_stable_offset(end).0, lso, "last stable offset");
    // Every stored batch is where the model put it, markers included.
    let stored = read_stored(log, 64 * 1024).await;
    assert_eq!(stored.len(), events.len());
    for ((header, _), event) in stored.iter().zip(events) {
        assert_eq!(header.base_offset.0, event.base);
        assert_eq!(header.producer_id, producer_id(event.producer));
        assert_eq!(header.is_control(), matches!(event.kind, Kind::Marker(_)));
        assert_eq!(
            header.is_transactional(),
            !matches!(event.kind, Kind::Plain)
        );
    }
}

fn run_ops(ops: Vec<Op>) {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let clock = Rc::new(ManualClock::new(1_000));
        let mut log = open(dir.path(), config(), &clock).await;
        let mut events: Vec<Event> = Vec::new();
        let mut tag = 0u64;
        for op in ops {
            let (open_txns, _, sequences) = derive(&events);
            match op {
                Op::TxnSend { producer, count } => {
                    tag += 1;
                    let bytes =
                        data_batch(producer, sequences[producer as usize], count, true, tag);
                    let info = log.append(&bytes, LEADER_EPOCH).await.unwrap();
                    events.push(Event {
                        producer,
                        base: info.base_offset.0,
                        count: i32::from(count),
                        kind: Kind::Txn,
                    });
                }
                Op::Plain { producer } => {
                    tag += 1;
                    let bytes = data_batch(producer, sequences[producer as usize], 1, false, tag);
                    let result = log.append(&bytes, LEADER_EPOCH).await;
                    if open_txns[producer as usize].is_some() {
                        assert!(
                            matches!(
                                result,
                                Err(LogError::Sequence(SequenceError::NotInTransaction { .. }))
                            ),
                            "a plain batch inside an open transaction is refused: {result:?}"
                        );
                    } else {
                        let info = result.unwrap();
                        events.push(Event {
                            producer,
                            base: info.base_offset.0,
                            count: 1,
                            kind: Kind::Plain,
                        });
                    }
                }
                Op::End { producer, commit } => {
                    let marker = TxnMarker {
                        kind: if commit {
                            MarkerKind::Commit
                        } else {
                            MarkerKind::Abort
                        },
                        coordinator_epoch: 0,
                        transaction_number: 0,
                    };
                    let info = append_marker(&log, producer, marker).await;
                    events.push(Event {
                        producer,
                        base: info.base_offset.0,
                        count: 1,
                        kind: Kind::Marker(commit),
                    });
                }
                Op::CloseReopen => {
                    log.close().await.unwrap();
                    drop(log);
                    log = open(dir.path(), config(), &clock).await;
                }
                Op::Crash => {
                    log.flush().await.unwrap();
                    drop(log);
                    log = open(dir.path(), config(), &clock).await;
                }
                Op::Truncate { keep_permille } => {
                    let end = log.log_end_offset().0;
                    let cut = end * i64::from(keep_permille) / 1000;
                    let new_end = log.truncate_to(Offset(cut)).await.unwrap().0;
                    events.retain(|e| e.base < new_end);
                }
            }
            check(&log, &events).await;
        }
        log.close().await.unwrap();
        drop(log);
        let log = open(dir.path(), config(), &clock).await;
        check(&log, &events).await;
        log.close().await.unwrap();
    });
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn transactions_against_a_model(ops in proptest::collection::vec(op_strategy(), 1..60)) {
        run_ops(ops);
    }
}

#[test]
fn an_abort_in_a_rolled_segment_survives_a_crash_and_a_lost_index_file() {
    // Proves the abort is found from the sealed segment's .txnindex after
    // an unclean stop, and from the segment's own markers when that file
    // is damaged.
    let mut ops = vec![Op::TxnSend {
        producer: 0,
        count: 3,
    }];
    ops.push(Op::End {
        producer: 0,
        commit: false,
    });
    for _ in 0..20 {
        ops.push(Op::TxnSend {
            producer: 1,
            count: 3,
        });
        ops.push(Op::End {
            producer: 1,
            commit: true,
        });
    }
    ops.push(Op::Crash);
    run_ops(ops);

    let dir = tempfile::tempdir().unwrap();
    run(async {
        let clock = Rc::new(ManualClock::new(1_000));
        let log = open(dir.path(), config(), &clock).await;
        log.append(&data_batch(0, 0, 2, true, 1), LEADER_EPOCH)
            .await
            .unwrap();
        let abort = TxnMarker {
            kind: MarkerKind::Abort,
            coordinator_epoch: 0,
            transaction_number: 0,
        };
        // A client may not write markers: the same batch through the produce
        // path is refused.
        let forged = build_marker_batch(producer_id(0), ProducerEpoch(0), abort, 1_000);
        assert!(matches!(
            log.append(&forged, LEADER_EPOCH).await,
            Err(LogError::InvalidRecord(_))
        ));
        append_marker(&log, 0, abort).await;
        for i in 0..20 {
            log.append(
                &data_batch(1, i * 2, 2, false, 2 * (i as u64 + 1)),
                LEADER_EPOCH,
            )
            .await
            .unwrap();
        }
        assert!(log.segment_count() > 2, "the abort's segment was sealed");
        let end = log.log_end_offset();
        let expected = log.aborted_transactions(Offset::ZERO, end);
        assert_eq!(expected.len(), 1);
        log.close().await.unwrap();
        drop(log);
        let index = dir.path().join(format!("{:020}.txnindex", 0));
        let mut bytes = std::fs::read(&index).expect("the sealed segment has a .txnindex");
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&index, &bytes).unwrap();
        let log = open(dir.path(), config(), &clock).await;
        assert_eq!(log.aborted_transactions(Offset::ZERO, end), expected);
        log.close().await.unwrap();
    });
}

/// A keyed batch of one record `key=value` from `producer`.
fn keyed(producer: u8, sequence: i32, transactional: bool, key: &str, value: &str) -> Vec<u8> {
    let mut builder = BatchBuilder::new(Compression::None).transactional(transactional);
    let padded = format!("{value}:{}", "p".repeat(400));
    builder.push(&Record {
        timestamp_ms: 1_000,
        key: Some(key.as_bytes()),
        value: Some(padded.as_bytes()),
        headers: &[],
    });
    stamped(builder, producer, sequence)
}

/// Appends `count` plain one-record batches of producer 0 with distinct
/// keys from `sequence`; returns the next sequence.
async fn filler(log: &PartitionLog, mut sequence: i32, count: usize) -> i32 {
    for _ in 0..count {
        let bytes = keyed(0, sequence, false, &format!("f{sequence}"), "x");
        log.append(&bytes, LEADER_EPOCH).await.unwrap();
        sequence += 1;
    }
    sequence
}

#[test]
fn compaction_drops_aborted_values_and_leaves_open_transactions_alone() {
    // Proves a compacted log keeps a key's committed value when a later
    // aborted transaction wrote the same key (the aborted record goes, its
    // marker stays), and cleans nothing at or past the last stable offset,
    // so an open transaction's value cannot displace a committed one.
    use broker::log::{CleanRequest, CleanupPolicy};
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let clock = Rc::new(ManualClock::new(1_000));
        let config = LogConfig {
            cleanup_policy: CleanupPolicy::COMPACT,
            min_cleanable_dirty_ratio_permille: 0,
            min_compaction_lag_ms: 0,
            ..config()
        };
        let log = open(dir.path(), config.clone(), &clock).await;
        let abort = TxnMarker {
            kind: MarkerKind::Abort,
            coordinator_epoch: 0,
            transaction_number: 0,
        };
        let commit = TxnMarker {
            kind: MarkerKind::Commit,
            ..abort
        };
        // 0: committed k=v1 (producer 0); 2: aborted k=v2 (producer 1).
        log.append(&keyed(0, 0, true, "k", "v1"), LEADER_EPOCH)
            .await
            .unwrap();
        append_marker(&log, 0, commit).await;
        log.append(&keyed(1, 0, true, "k", "v2"), LEADER_EPOCH)
            .await
            .unwrap();
        append_marker(&log, 1, abort).await;
        // Filler so segments roll, then an open k=v3 (producer 2), then
        // more filler so v3's segment is sealed too.
        let sequence = filler(&log, 1, 20).await;
        let open_at = log
            .append(&keyed(2, 0, true, "k", "v3"), LEADER_EPOCH)
            .await
            .unwrap()
            .base_offset;
        filler(&log, sequence, 20).await;
        assert!(log.segment_count() > 4);
        let end = log.log_end_offset();
        assert_eq!(log.last_stable_offset(end), open_at);
        let request = CleanRequest {
            end_limit: end,
            map_memory_bytes: 1 << 20,
            io_bytes_per_sec_max: 0,
            zstd_level: 1,
            stop_swap_after: None,
        };
        log.flush().await.unwrap();
        let report = log.clean(&request).await.unwrap();
        assert!(report.records_removed > 0, "{report:?}");
        let values = |stored: Vec<(protocol::BatchHeader, Vec<StoredRecord>)>| -> Vec<String> {
            stored
                .into_iter()
                .flat_map(|(_, records)| records)
                .filter(|r| r.key.as_deref() == Some(b"k"))
                .map(|r| {
                    let v = String::from_utf8(r.value.unwrap()).unwrap();
                    v.split(':').next().unwrap().to_owned()
                })
                .collect()
        };
        assert_eq!(
            values(read_stored(&log, 1 << 20).await),
            ["v1", "v3"],
            "the aborted v2 is gone; v1 stays while v3's transaction is open"
        );
        // The markers are still there.
        let markers = read_stored(&log, 1 << 20)
            .await
            .iter()
            .filter(|(h, _)| h.is_control())
            .count();
        assert_eq!(markers, 2);
        log.close().await.unwrap();
        drop(log);
        let log = open(dir.path(), config, &clock).await;
        assert_eq!(values(read_stored(&log, 1 << 20).await), ["v1", "v3"]);
        log.close().await.unwrap();
    });
}

#[test]
fn transactions_open_too_long_are_reported_until_a_marker_ends_them() {
    // Proves the leader's backstop sees a transaction only once it has been
    // open longer than the bound, counted from when this replica first saw
    // it, and forgets it once ended.
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let clock = Rc::new(ManualClock::new(1_000));
        let log = open(dir.path(), config(), &clock).await;
        log.append(&data_batch(1, 0, 1, true, 1), LEADER_EPOCH)
            .await
            .unwrap();
        assert!(log.hanging_transactions(10_000, 5_000).is_empty());
        assert!(log.hanging_transactions(15_000, 5_000).is_empty());
        assert_eq!(
            log.hanging_transactions(15_001, 5_000),
            [(producer_id(1), ProducerEpoch(0), 0)]
        );
        let abort = TxnMarker {
            kind: MarkerKind::Abort,
            coordinator_epoch: 0,
            transaction_number: 0,
        };
        append_marker(&log, 1, abort).await;
        assert!(log.hanging_transactions(100_000, 5_000).is_empty());
        assert_eq!(
            log.last_stable_offset(log.log_end_offset()),
            log.log_end_offset()
        );
        log.close().await.unwrap();
    });
}

#[test]
fn a_resent_marker_is_not_written_twice_after_a_roll_or_a_reopen() {
    // Proves a marker repeating its transaction (as a coordinator that took
    // over resends it) is answered with the original's offset and written
    // nothing, whether the original is known from the live state, from a
    // snapshot, or only from the log after the snapshots are gone; and that
    // a late resend of an ended transaction never ends the next one.
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let clock = Rc::new(ManualClock::new(1_000));
        let log = open(dir.path(), config(), &clock).await;
        let commit = |coordinator_epoch, transaction_number| TxnMarker {
            kind: MarkerKind::Commit,
            coordinator_epoch,
            transaction_number,
        };
        log.append(&keyed(1, 0, true, "a", "1"), LEADER_EPOCH)
            .await
            .unwrap();
        let first = append_marker(&log, 1, commit(0, 1)).await;
        assert!(!first.duplicate);
        let end = log.log_end_offset();
        let resent = append_marker(&log, 1, commit(1, 1)).await;
        assert!(resent.duplicate);
        assert_eq!(resent.base_offset, first.base_offset);
        assert_eq!(log.log_end_offset(), end);

        // Segments roll (each roll snapshots the producers); the
        // transaction is still known.
        filler(&log, 0, 40).await;
        assert!(log.segment_count() > 2);
        assert!(append_marker(&log, 1, commit(1, 1)).await.duplicate);

        // The next transaction, open when the first one's resend comes.
        log.append(&keyed(1, 1, true, "b", "2"), LEADER_EPOCH)
            .await
            .unwrap();
        let open_from = log.log_end_offset().0 - 1;
        let late = append_marker(&log, 1, commit(0, 1)).await;
        assert!(late.duplicate);
        assert_eq!(
            log.last_stable_offset(log.log_end_offset()).0,
            open_from,
            "the late resend ended nothing"
        );
        let second = append_marker(&log, 1, commit(1, 2)).await;
        assert!(!second.duplicate);
        log.close().await.unwrap();
        drop(log);

        let log = open(dir.path(), config(), &clock).await;
        let again = append_marker(&log, 1, commit(1, 2)).await;
        assert!(again.duplicate);
        assert_eq!(again.base_offset, second.base_offset);
        log.close().await.unwrap();
        drop(log);

        // Without any snapshot the state is rebuilt from the markers.
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "snapshot") {
                std::fs::remove_file(path).unwrap();
            }
        }
        let log = open(dir.path(), config(), &clock).await;
        let end = log.log_end_offset();
        let again = append_marker(&log, 1, commit(2, 2)).await;
        assert!(again.duplicate);
        assert_eq!(again.base_offset, second.base_offset);
        assert_eq!(log.log_end_offset(), end);
        log.close().await.unwrap();
    });
}
