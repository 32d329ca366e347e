//! Property test: idempotent producers against a partition log, checked
//! against a model of every batch each producer sent. Random new batches,
//! retries of earlier ones, sequence gaps, epoch bumps, rolls (small
//! segments), clean reopens, crashes (reopen without close) and truncations.
//! A retry of one of a producer's last five batches is answered with the
//! original offsets and appends nothing; an older retry, a gap or an old
//! epoch is refused; every logical batch is in the log at most once; and the
//! producer state the log keeps equals the state rebuilt from the batches
//! read back from disk (what a follower or a restarted broker derives).

mod support;

use std::collections::BTreeMap;
use std::rc::Rc;

use broker::clock::ManualClock;
use broker::log::producer_state::{ProducerStateTable, SequenceError};
use broker::log::{FlushPolicy, LogConfig, LogError, PartitionLog};
use proptest::prelude::*;
use protocol::record_batch::stamp_producer;
use protocol::{
    BatchBuilder, Compression, LeaderEpoch, Offset, ProducerEpoch, ProducerId, Record, Sequence,
};
use support::*;

const PRODUCERS: u8 = 3;

#[derive(Clone, Debug)]
enum Op {
    Send { producer: u8, count: u8 },
    Retry { producer: u8, back: u8 },
    Gap { producer: u8 },
    BumpEpoch { producer: u8 },
    StaleEpoch { producer: u8 },
    CloseReopen,
    Crash,
    Truncate { keep_permille: u16 },
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (0..PRODUCERS, 1u8..5).prop_map(|(producer, count)| Op::Send { producer, count }),
        6 => (0..PRODUCERS, 0u8..8).prop_map(|(producer, back)| Op::Retry { producer, back }),
        1 => (0..PRODUCERS).prop_map(|producer| Op::Gap { producer }),
        1 => (0..PRODUCERS).prop_map(|producer| Op::BumpEpoch { producer }),
        1 => (0..PRODUCERS).prop_map(|producer| Op::StaleEpoch { producer }),
        1 => Just(Op::CloseReopen),
        1 => Just(Op::Crash),
        1 => (0u16..1000).prop_map(|keep_permille| Op::Truncate { keep_permille }),
    ]
}

fn config() -> LogConfig {
    small_segments(FlushPolicy::Always)
}

/// One batch a producer sent, as the model remembers it.
#[derive(Clone, Debug)]
struct Sent {
    bytes: Vec<u8>,
    first_sequence: i32,
    count: i32,
    base_offset: i64,
}

#[derive(Clone, Debug, Default)]
struct ProducerModel {
    epoch: i16,
    /// Appended batches of the current epoch, oldest first.
    batches: Vec<Sent>,
}

impl ProducerModel {
    fn next_sequence(&self) -> i32 {
        self.batches
            .last()
            .map_or(0, |b| b.first_sequence + b.count)
    }
}

/// A batch from `producer` whose values name `tag`.
fn producer_batch(producer: u8, epoch: i16, first_sequence: i32, count: u8, tag: u64) -> Vec<u8> {
    let mut builder = BatchBuilder::new(if tag.is_multiple_of(2) {
        Compression::None
    } else {
        Compression::Zstd
    });
    for i in 0..count {
        let value = format!("{tag}:{i}:{}", "v".repeat(200));
        builder.push(&Record {
            timestamp_ms: 1_000,
            key: Some(&[producer]),
            value: Some(value.as_bytes()),
            headers: &[],
        });
    }
    let mut bytes = builder.build().unwrap();
    stamp_producer(
        &mut bytes,
        ProducerId(i64::from(producer) + 100),
        ProducerEpoch(epoch),
        Sequence(first_sequence),
    );
    bytes
}

/// Every stored batch from the log start: (header, values).
async fn read_batches(log: &PartitionLog) -> Vec<(protocol::BatchHeader, Vec<String>)> {
    read_stored(log, 64 * 1024)
        .await
        .into_iter()
        .map(|(header, records)| {
            let values = records
                .into_iter()
                .map(|r| String::from_utf8(r.value.unwrap()).unwrap())
                .collect();
            (header, values)
        })
        .collect()
}

async fn check(log: &PartitionLog, models: &[ProducerModel]) {
    log.check_invariants();
    let stored = read_batches(log).await;
    let mut rebuilt = ProducerStateTable::new();
    let mut tags = BTreeMap::new();
    for (header, values) in &stored {
        rebuilt.apply(header, None);
        let tag = values[0].split(':').next().unwrap().to_owned();
        assert!(
            tags.insert(tag.clone(), header.base_offset).is_none(),
            "batch {tag} is in the log twice"
        );
    }
    assert_eq!(
        log.producer_state(),
        rebuilt,
        "the kept producer state is what the stored batches give"
    );
    for (i, model) in models.iter().enumerate() {
        for sent in &model.batches {
            let found = stored
                .iter()
                .find(|(h, _)| h.base_offset.0 == sent.base_offset)
                .unwrap_or_else(|| panic!("producer {i}'s batch at {} is gone", sent.base_offset));
            assert_eq!(found.0.base_sequence, Sequence(sent.first_sequence));
        }
    }
}

async fn reopen(dir: &std::path::Path, clock: &Rc<ManualClock>) -> Rc<PartitionLog> {
    open(dir, config(), clock).await
}

fn run_ops(ops: Vec<Op>) {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let clock = Rc::new(ManualClock::new(1_000));
        let mut log = reopen(dir.path(), &clock).await;
        let mut models = vec![ProducerModel::default(); PRODUCERS as usize];
        let mut tag = 0u64;
        let epoch = LeaderEpoch(1);
        for op in ops {
            match op {
                Op::Send { producer, count } => {
                    let model = &mut models[producer as usize];
                    tag += 1;
                    let first = model.next_sequence();
                    let bytes = producer_batch(producer, model.epoch, first, count, tag);
                    let end = log.log_end_offset();
                    let info = log.append(&bytes, epoch).await.unwrap();
                    assert!(!info.duplicate);
                    assert_eq!(info.base_offset, end);
                    model.batches.push(Sent {
                        bytes,
                        first_sequence: first,
                        count: i32::from(count),
                        base_offset: info.base_offset.0,
                    });
                }
                Op::Retry { producer, back } => {
                    let model = &models[producer as usize];
                    let Some(index) = model.batches.len().checked_sub(1 + usize::from(back)) else {
                        continue;
                    };
                    let sent = &model.batches[index];
                    let end = log.log_end_offset();
                    let result = log.append(&sent.bytes, epoch).await;
                    assert_eq!(log.log_end_offset(), end, "a retry appends nothing");
                    if back < 5 {
                        let info = result.expect("a recent retry is a duplicate");
                        assert!(info.duplicate);
                        assert_eq!(info.base_offset.0, sent.base_offset);
                        assert_eq!(
                            info.last_offset.0,
                            sent.base_offset + i64::from(sent.count) - 1
                        );
                    } else {
                        assert!(
                            matches!(
                                result,
                                Err(LogError::Sequence(SequenceError::OutOfOrder { .. }))
                            ),
                            "an old retry is refused: {result:?}"
                        );
                    }
                }
                Op::Gap { producer } => {
                    let model = &models[producer as usize];
                    if model.batches.is_empty() {
                        continue;
                    }
                    tag += 1;
                    let bytes =
                        producer_batch(producer, model.epoch, model.next_sequence() + 1, 1, tag);
                    let result = log.append(&bytes, epoch).await;
                    assert!(
                        matches!(
                            result,
                            Err(LogError::Sequence(SequenceError::OutOfOrder { .. }))
                        ),
                        "a gap is refused: {result:?}"
                    );
                }
                Op::BumpEpoch { producer } => {
                    let model = &mut models[producer as usize];
                    model.epoch += 1;
                    model.batches.clear();
                    tag += 1;
                    let bytes = producer_batch(producer, model.epoch, 0, 1, tag);
                    let info = log.append(&bytes, epoch).await.unwrap();
                    model.batches.push(Sent {
                        bytes,
                        first_sequence: 0,
                        count: 1,
                        base_offset: info.base_offset.0,
                    });
                }
                Op::StaleEpoch { producer } => {
                    let model = &models[producer as usize];
                    if model.epoch == 0 || model.batches.is_empty() {
                        continue;
                    }
                    tag += 1;
                    let bytes =
                        producer_batch(producer, model.epoch - 1, model.next_sequence(), 1, tag);
                    let result = log.append(&bytes, epoch).await;
                    assert!(
                        matches!(
                            result,
                            Err(LogError::Sequence(SequenceError::StaleEpoch { .. }))
                        ),
                        "an old epoch is refused: {result:?}"
                    );
                }
                Op::CloseReopen => {
                    log.close().await.unwrap();
                    drop(log);
                    log = reopen(dir.path(), &clock).await;
                }
                Op::Crash => {
                    // Acknowledged (synced) and then the process dies.
                    log.flush().await.unwrap();
                    drop(log);
                    log = reopen(dir.path(), &clock).await;
                }
                Op::Truncate { keep_permille } => {
                    let end = log.log_end_offset().0;
                    let cut = end * i64::from(keep_permille) / 1000;
                    let new_end = log.truncate_to(Offset(cut)).await.unwrap().0;
                    for model in &mut models {
                        model.batches.retain(|b| b.base_offset < new_end);
                    }
                }
            }
            check(&log, &models).await;
        }
        log.close().await.unwrap();
        drop(log);
        // A clean open replays nothing after the snapshot at the end, a
        // crash replays from the last roll: both give the same state.
        let log = reopen(dir.path(), &clock).await;
        check(&log, &models).await;
        log.close().await.unwrap();
    });
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn idempotent_producers_against_a_model(ops in proptest::collection::vec(op_strategy(), 1..60)) {
        run_ops(ops);
    }
}

#[test]
fn a_retry_across_a_roll_and_a_crash_is_still_a_duplicate() {
    // Proves the state survives in the snapshot of a roll plus the replay
    // of the active segment after an unclean stop.
    let mut ops = Vec::new();
    for _ in 0..30 {
        ops.push(Op::Send {
            producer: 0,
            count: 3,
        });
    }
    ops.push(Op::Crash);
    ops.push(Op::Retry {
        producer: 0,
        back: 0,
    });
    ops.push(Op::Retry {
        producer: 0,
        back: 4,
    });
    ops.push(Op::Retry {
        producer: 0,
        back: 5,
    });
    run_ops(ops);
}
