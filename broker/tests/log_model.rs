//! Property test: the partition log behaves like a simple model (a BTreeMap of
//! batches by base offset) under random appends, rolls, truncations,
//! retention, clean reopens and crashes.

mod support;

use std::collections::BTreeMap;
use std::rc::Rc;

use broker::clock::{Clock, ManualClock};
use broker::log::{FlushPolicy, LogConfig, PartitionLog};
use proptest::prelude::*;
use protocol::{LeaderEpoch, Offset};
use support::*;

#[derive(Clone, Debug)]
enum Op {
    Append {
        count: usize,
        value_bytes: usize,
    },
    AdvanceClockMs(i64),
    Flush,
    Truncate {
        fraction: f64,
    },
    Retention,
    CloseReopen,
    /// Drop the log without closing, as a crash would, then reopen.
    CrashReopen {
        flush_first: bool,
    },
    Read {
        fraction: f64,
        max_bytes: usize,
    },
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (1usize..20, 1usize..400).prop_map(|(count, value_bytes)| Op::Append { count, value_bytes }),
        1 => (1i64..100_000).prop_map(Op::AdvanceClockMs),
        1 => Just(Op::Flush),
        1 => (0.0f64..1.0).prop_map(|fraction| Op::Truncate { fraction }),
        1 => Just(Op::Retention),
        1 => Just(Op::CloseReopen),
        1 => any::<bool>().prop_map(|flush_first| Op::CrashReopen { flush_first }),
        2 => (0.0f64..1.0, 1usize..20_000).prop_map(|(fraction, max_bytes)| Op::Read { fraction, max_bytes }),
    ]
}

/// base offset -> (tag, record count)
type Model = BTreeMap<i64, (u64, usize)>;

fn config() -> LogConfig {
    LogConfig {
        segment_size_bytes: 8 * 1024,
        segment_age_ms: 60_000,
        index_interval_bytes: 512,
        write_chunk_bytes: 4096,
        unwritten_bytes_max: (1 << 20) + 4096,
        batch_bytes_max: 1 << 20,
        retention_ms: None,
        retention_bytes: Some(24 * 1024),
        flush_policy: FlushPolicy::None,
        ..LogConfig::default()
    }
}

fn model_end(model: &Model, start: i64) -> i64 {
    model
        .iter()
        .next_back()
        .map_or(start, |(b, (_, c))| b + *c as i64)
}

/// Reads the whole log and compares it with the model.
async fn check_contents(log: &PartitionLog, model: &Model) {
    log.check_invariants();
    let start = log.log_start_offset();
    assert_eq!(log.log_end_offset().0, model_end(model, start.0));
    let mut next = start;
    let mut seen = Vec::new();
    while next < log.log_end_offset() {
        let fetched = log
            .read(next, 16 * 1024, log.log_end_offset())
            .await
            .expect("read");
        assert!(fetched.batch_count > 0, "progress at {next}");
        for (base, values) in decode(&fetched.bytes) {
            seen.push((base, values));
        }
        next = fetched.next_offset;
    }
    let expected: Vec<_> = model
        .range(start.0..)
        .map(|(b, (t, c))| (*b, *t, *c))
        .collect();
    assert_eq!(seen.len(), expected.len(), "batch count");
    for ((base, values), (eb, tag, count)) in seen.iter().zip(expected) {
        assert_eq!(*base, eb);
        assert_eq!(values.len(), count);
        assert!(
            values[0].starts_with(format!("{tag}:0:").as_bytes()),
            "batch {base} holds tag {tag}"
        );
    }
}

async fn run_ops(ops: Vec<Op>) {
    let dir = tempfile::tempdir().unwrap();
    let clock = Rc::new(ManualClock::new(1_000_000));
    let mut log = open(dir.path(), config(), &clock).await;
    let mut model = Model::new();
    let mut tag = 0u64;
    for op in ops {
        match op {
            Op::Append { count, value_bytes } => {
                tag += 1;
                let info = log
                    .append(
                        &batch(tag, count, clock.now_ms(), value_bytes),
                        LeaderEpoch(1),
                    )
                    .await
                    .unwrap();
                assert_eq!(
                    info.base_offset.0,
                    model_end(&model, log.log_start_offset().0)
                );
                model.insert(info.base_offset.0, (tag, count));
            }
            Op::AdvanceClockMs(ms) => clock.advance(ms),
            Op::Flush => {
                log.flush().await.unwrap();
                assert_eq!(log.durable_offset(), log.log_end_offset());
            }
            Op::Truncate { fraction } => {
                let (start, end) = (log.log_start_offset().0, log.log_end_offset().0);
                let target = start + ((end - start) as f64 * fraction) as i64;
                let new_end = log.truncate_to(Offset(target)).await.unwrap();
                // The batch holding `target` goes too.
                let expected = model
                    .range(..=target)
                    .next_back()
                    .filter(|(b, (_, c))| *b + *c as i64 > target)
                    .map_or(target, |(b, _)| *b);
                assert_eq!(new_end.0, expected.max(start).min(end));
                model.retain(|b, _| *b < new_end.0);
            }
            Op::Retention => {
                let before = log.log_start_offset();
                log.enforce_retention(log.log_end_offset()).await.unwrap();
                let after = log.log_start_offset();
                assert!(after >= before);
                assert!(
                    after.0 == model_end(&model, after.0) || model.contains_key(&after.0),
                    "log start {after} is a batch boundary"
                );
                model.retain(|b, _| *b >= after.0);
                assert!(
                    log.size_bytes() >= 24 * 1024 || log.segment_count() == 1 || after == before
                );
            }
            Op::CloseReopen => {
                log.close().await.unwrap();
                drop(log);
                log = open(dir.path(), config(), &clock).await;
            }
            Op::CrashReopen { flush_first } => {
                if flush_first {
                    log.flush().await.unwrap();
                }
                let durable = log.durable_offset();
                let end = log.log_end_offset();
                drop(log);
                log = open(dir.path(), config(), &clock).await;
                let recovered = log.log_end_offset();
                assert!(
                    recovered >= durable && recovered <= end,
                    "recovered end {recovered} within [{durable}, {end}]"
                );
                model.retain(|b, _| *b < recovered.0);
                assert_eq!(
                    model_end(&model, log.log_start_offset().0),
                    recovered.0,
                    "recovered to a batch boundary"
                );
            }
            Op::Read {
                fraction,
                max_bytes,
            } => {
                let (start, end) = (log.log_start_offset().0, log.log_end_offset().0);
                let from = start + ((end - start) as f64 * fraction) as i64;
                let fetched = log
                    .read(Offset(from), max_bytes, Offset(end))
                    .await
                    .unwrap();
                let batches = decode(&fetched.bytes);
                if from < end {
                    let (first_base, _) = batches[0];
                    let holding = *model.range(..=from).next_back().unwrap().0;
                    assert_eq!(
                        first_base, holding,
                        "read starts at the batch holding {from}"
                    );
                    assert!(batches.len() == 1 || fetched.bytes.len() <= max_bytes);
                }
            }
        }
        log.check_invariants();
    }
    check_contents(&log, &model).await;
    log.close().await.unwrap();
    drop(log);
    let log = open(dir.path(), config(), &clock).await;
    check_contents(&log, &model).await;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn log_matches_model(ops in proptest::collection::vec(op_strategy(), 1..60)) {
        run(run_ops(ops));
    }
}
