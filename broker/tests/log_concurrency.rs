//! Property test: appends, segment rolls, write-behind, flushes and retention
//! running as concurrent tasks on one executor (as they do on a shard) never
//! lose or damage an appended record. Each appender stages batches while
//! another task's writes are in flight, so a roll can happen in the middle of
//! a write wave. After every step the log's invariants hold; at the end the
//! log must serve exactly what was appended, pass `verify-log` after a clean
//! close, and hold everything that was acknowledged after a crash.

mod support;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use broker::clock::{Clock, ManualClock};
use broker::log::{FlushPolicy, LogConfig, PartitionLog};
use broker::runtime;
use proptest::prelude::*;
use protocol::{LeaderEpoch, Offset};
use support::*;

fn config(flush_policy: FlushPolicy) -> LogConfig {
    LogConfig {
        // Small segments and chunks: many rolls, many waves per segment.
        segment_size_bytes: 24 * 1024,
        index_interval_bytes: 512,
        write_chunk_bytes: 4096,
        unwritten_bytes_max: (1 << 20) + 4096,
        batch_bytes_max: 1 << 20,
        retention_ms: None,
        flush_policy,
        ..LogConfig::default()
    }
}

/// One appender's script: (record count, value bytes, yields before the append).
type Script = Vec<(usize, usize, u8)>;

/// base offset -> (tag, record count)
type Model = BTreeMap<i64, (u64, usize)>;

async fn read_all(log: &PartitionLog) -> Vec<(i64, Vec<Vec<u8>>)> {
    let mut next = log.log_start_offset();
    let mut seen = Vec::new();
    while next < log.log_end_offset() {
        let fetched = log
            .read(next, 64 * 1024, log.log_end_offset())
            .await
            .expect("read");
        assert!(fetched.batch_count > 0, "progress at {next}");
        seen.extend(decode(&fetched.bytes));
        next = fetched.next_offset;
    }
    seen
}

fn check_against(seen: &[(i64, Vec<Vec<u8>>)], model: &Model) {
    let expected: Vec<_> = model.iter().map(|(b, (t, c))| (*b, *t, *c)).collect();
    assert_eq!(seen.len(), expected.len(), "batch count");
    for ((base, values), (eb, tag, count)) in seen.iter().zip(expected) {
        assert_eq!(*base, eb);
        assert_eq!(values.len(), count, "records of batch {base}");
        assert!(
            values[0].starts_with(format!("{tag}:0:").as_bytes()),
            "batch {base} holds tag {tag}"
        );
    }
}

async fn run_concurrently(scripts: Vec<Script>, flusher_ms: Vec<u8>, policy: FlushPolicy) {
    let dir = tempfile::tempdir().unwrap();
    let clock = Rc::new(ManualClock::new(1_000_000));
    let log = open(dir.path(), config(policy), &clock).await;
    let model: Rc<RefCell<Model>> = Rc::default();
    // Acknowledged: the append's records may be acknowledged to a producer
    // (acks=1) once `wait_for_ack` returned.
    let acked: Rc<RefCell<Model>> = Rc::default();
    let mut tasks = Vec::new();
    for (worker, script) in scripts.into_iter().enumerate() {
        let (log, model, acked, clock) = (log.clone(), model.clone(), acked.clone(), clock.clone());
        tasks.push(runtime::spawn(async move {
            for (i, (count, value_bytes, yields)) in script.into_iter().enumerate() {
                for _ in 0..yields {
                    runtime::sleep(std::time::Duration::from_micros(50)).await;
                }
                let tag = (worker as u64) << 32 | i as u64;
                let info = log
                    .append(
                        &batch(tag, count, clock.now_ms(), value_bytes),
                        LeaderEpoch(1),
                    )
                    .await
                    .expect("append");
                model.borrow_mut().insert(info.base_offset.0, (tag, count));
                log.check_invariants();
                log.wait_for_ack(info.log_end_offset).await.expect("ack");
                assert!(
                    log.stable_offset() >= info.log_end_offset,
                    "acknowledged records are stable"
                );
                acked.borrow_mut().insert(info.base_offset.0, (tag, count));
                log.check_invariants();
            }
        }));
    }
    {
        let log = log.clone();
        tasks.push(runtime::spawn(async move {
            for pause in flusher_ms {
                runtime::sleep(std::time::Duration::from_micros(u64::from(pause) * 20)).await;
                if pause % 3 == 0 {
                    log.flush().await.expect("flush");
                } else {
                    log.maintain().await.expect("maintain");
                }
                log.check_invariants();
            }
        }));
    }
    for task in tasks {
        task.await;
    }
    log.check_invariants();
    let model = model.borrow().clone();
    check_against(&read_all(&log).await, &model);
    log.close().await.expect("close");
    drop(log);
    let report = broker::log::verify::verify_partition_dir(
        dir.path(),
        broker::log::verify::VerifyOptions::default(),
        &mut std::io::sink(),
    )
    .await
    .expect("verify runs");
    assert!(report.problems.is_empty(), "verify-log: {report:?}");
    let log = open(dir.path(), config(policy), &clock).await;
    assert_eq!(log.log_start_offset(), Offset(0));
    check_against(&read_all(&log).await, &model);
    log.close().await.unwrap();
}

/// Appends concurrently, then "crashes" (drops the log without closing, as
/// kill -9 would) while nothing is in flight: every acknowledged record must be
/// there after recovery, whatever the flush policy.
async fn crash_keeps_acknowledged(scripts: Vec<Script>, policy: FlushPolicy) {
    let dir = tempfile::tempdir().unwrap();
    let clock = Rc::new(ManualClock::new(1_000_000));
    let log = open(dir.path(), config(policy), &clock).await;
    let acked: Rc<RefCell<Model>> = Rc::default();
    let mut tasks = Vec::new();
    for (worker, script) in scripts.into_iter().enumerate() {
        let (log, acked, clock) = (log.clone(), acked.clone(), clock.clone());
        tasks.push(runtime::spawn(async move {
            for (i, (count, value_bytes, yields)) in script.into_iter().enumerate() {
                for _ in 0..yields {
                    runtime::yield_now().await;
                }
                let tag = (worker as u64) << 32 | i as u64;
                let info = log
                    .append(
                        &batch(tag, count, clock.now_ms(), value_bytes),
                        LeaderEpoch(1),
                    )
                    .await
                    .expect("append");
                log.wait_for_ack(info.log_end_offset).await.expect("ack");
                acked.borrow_mut().insert(info.base_offset.0, (tag, count));
            }
        }));
    }
    for task in tasks {
        task.await;
    }
    drop(log);
    let log = open(dir.path(), config(policy), &clock).await;
    let acked = acked.borrow().clone();
    let seen = read_all(&log).await;
    let end = acked
        .iter()
        .next_back()
        .map_or(0, |(b, (_, c))| b + *c as i64);
    assert!(
        log.log_end_offset().0 >= end,
        "recovered end {} below the acknowledged end {end}",
        log.log_end_offset()
    );
    let seen_prefix: Vec<_> = seen.into_iter().filter(|(b, _)| *b < end).collect();
    check_against(&seen_prefix, &acked);
    log.close().await.unwrap();
}

fn script_strategy() -> impl Strategy<Value = Script> {
    proptest::collection::vec((1usize..30, 1usize..600, 0u8..3), 1..40)
}

fn policy_strategy() -> impl Strategy<Value = FlushPolicy> {
    prop_oneof![
        Just(FlushPolicy::None),
        Just(FlushPolicy::Always),
        Just(FlushPolicy::IntervalMs(1)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn concurrent_appends_rolls_and_flushes_lose_nothing(
        scripts in proptest::collection::vec(script_strategy(), 1..5),
        flusher in proptest::collection::vec(0u8..50, 0..40),
        policy in policy_strategy(),
    ) {
        run(run_concurrently(scripts, flusher, policy));
    }

    #[test]
    fn a_crash_keeps_every_acknowledged_append(
        scripts in proptest::collection::vec(script_strategy(), 1..5),
        policy in policy_strategy(),
    ) {
        run(crash_keeps_acknowledged(scripts, policy));
    }
}

/// Retention removes whole segments' files (unlinks and a directory sync,
/// slow on a busy disk): an append's acknowledgement must not wait for that.
/// The retention pass is polled by hand until its segments left the log and
/// then left suspended in the removal, so the acknowledgement can only come
/// if the removal holds nothing the commit needs.
#[test]
fn an_acknowledgement_does_not_wait_for_retention_to_remove_files() {
    use std::future::Future;
    use std::task::{Context, Waker};
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    run(async move {
        let clock = Rc::new(ManualClock::new(0));
        let config = LogConfig {
            retention_bytes: Some(8 * 1024),
            ..small_segments(FlushPolicy::Always)
        };
        let log = open(dir.path(), config, &clock).await;
        for tag in 0..40 {
            let info = log
                .append(&batch(tag, 4, 0, 300), LeaderEpoch(3))
                .await
                .unwrap();
            log.wait_for_ack(info.log_end_offset).await.unwrap();
        }
        log.flush().await.unwrap();
        let start = log.log_start_offset();
        let mut retention = Box::pin(log.enforce_retention(log.log_end_offset()));
        let mut cx = Context::from_waker(Waker::noop());
        let mut polls = 0;
        while log.log_start_offset() == start {
            assert!(
                retention.as_mut().poll(&mut cx).is_pending(),
                "retention ended before it was seen removing files"
            );
            polls += 1;
            assert!(polls < 10_000, "retention never moved the log start");
            runtime::sleep(Duration::from_millis(1)).await;
        }
        let info = log
            .append(&batch(99, 4, 0, 300), LeaderEpoch(3))
            .await
            .unwrap();
        let acked = runtime::timeout(
            Duration::from_secs(30),
            log.wait_for_ack(info.log_end_offset),
        )
        .await;
        assert!(
            matches!(acked, Some(Ok(()))),
            "the acknowledgement waited for retention's file removal: {acked:?}"
        );
        let removed = retention.await.unwrap();
        assert!(removed > 0);
        let seen = read_all(&log).await;
        assert_eq!(seen.last().map(|(_, v)| v.len()), Some(4));
        assert!(seen.first().unwrap().0 >= log.log_start_offset().0);
        log.close().await.unwrap();
    });
}
