//! Append, read, lookup and reopen through the real direct-I/O path.

mod support;

use std::rc::Rc;

use broker::clock::{Clock, ManualClock};
use broker::log::{FlushPolicy, LogError};
use protocol::{LeaderEpoch, Offset};
use support::*;

/// Appended batches come back whole, in order, with assigned offsets, from
/// memory before they are written and from disk after a reopen.
#[test]
fn append_read_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let clock = Rc::new(ManualClock::new(1_000));
        let log = open(dir.path(), small_config(), &clock).await;
        let mut expected = Vec::new();
        for tag in 0..200u64 {
            let info = log
                .append(&batch(tag, 5, 1_000 + tag as i64 * 10, 100), LeaderEpoch(1))
                .await
                .unwrap();
            assert_eq!(info.base_offset, Offset(tag as i64 * 5));
            expected.push(tag);
        }
        assert!(log.segment_count() > 1, "rolled: {}", log.segment_count());
        let check = |bytes: &[u8], from_tag: u64| {
            for (i, (base, values)) in decode(bytes).into_iter().enumerate() {
                let tag = from_tag + i as u64;
                assert_eq!(base, tag as i64 * 5);
                assert_eq!(values.len(), 5);
                assert!(values[0].starts_with(format!("{tag}:0:").as_bytes()));
            }
        };
        let mut next = Offset(0);
        let mut seen = 0;
        while next < log.log_end_offset() {
            let fetched = log.read(next, 4096, log.log_end_offset()).await.unwrap();
            assert!(fetched.batch_count > 0);
            check(&fetched.bytes, (next.0 / 5) as u64);
            seen += fetched.batch_count;
            next = fetched.next_offset;
        }
        assert_eq!(seen, 200);
        // Mid-batch start returns the batch holding the offset.
        let fetched = log.read(Offset(7), 1, Offset(1000)).await.unwrap();
        assert_eq!(decode(&fetched.bytes)[0].0, 5);
        assert_eq!(
            log.offset_for_timestamp(1_000 + 50 * 10 + 2).await.unwrap(),
            Some(Offset(252))
        );
        assert_eq!(log.offset_for_timestamp(0).await.unwrap(), Some(Offset(0)));
        assert_eq!(log.offset_for_timestamp(1 << 50).await.unwrap(), None);
        log.close().await.unwrap();

        let log = open(dir.path(), small_config(), &clock).await;
        assert_eq!(log.log_end_offset(), Offset(1000));
        let fetched = log.read(Offset(500), 1 << 20, Offset(1000)).await.unwrap();
        check(&fetched.bytes, 100);
        assert!(matches!(
            log.read(Offset(1001), 10, Offset(2000)).await,
            Err(LogError::OffsetOutOfRange { .. })
        ));
        assert!(matches!(
            log.append(&batch(1, 1, 0, 1), LeaderEpoch(0)).await,
            Err(LogError::StaleLeaderEpoch { .. })
        ));
        log.check_invariants();
    });
}

/// With flush `always`, concurrent appends all become durable and a crash
/// (no close) loses nothing acknowledged.
#[test]
fn flush_always_is_durable_without_close() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let clock = Rc::new(ManualClock::new(1_000));
        let config = broker::log::LogConfig {
            flush_policy: FlushPolicy::Always,
            ..small_config()
        };
        let log = open(dir.path(), config.clone(), &clock).await;
        for tag in 0..50u64 {
            let info = log
                .append(&batch(tag, 3, 1_000, 200), LeaderEpoch(0))
                .await
                .unwrap();
            log.wait_for_ack(info.log_end_offset).await.unwrap();
            assert!(log.durable_offset() >= info.log_end_offset);
        }
        drop(log); // no close: like a crash after the acknowledgements
        let log = open(dir.path(), config, &clock).await;
        assert_eq!(log.log_end_offset(), Offset(150));
        let fetched = log.read(Offset(0), 1 << 20, Offset(150)).await.unwrap();
        assert!(fetched.batch_count > 0);
    });
}

/// Concurrent appenders under flush `always` share syncs: every append is
/// durable when acknowledged, with far fewer fdatasyncs than appends.
#[test]
fn concurrent_appends_share_one_sync() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let clock = Rc::new(ManualClock::new(1_000));
        let config = broker::log::LogConfig {
            flush_policy: FlushPolicy::Always,
            ..small_config()
        };
        let log = open(dir.path(), config, &clock).await;
        let appenders: Vec<_> = (0..16u64)
            .map(|tag| {
                let log = log.clone();
                broker::runtime::spawn(async move {
                    for round in 0..10u64 {
                        let info = log
                            .append(&batch(tag * 100 + round, 2, 1_000, 64), LeaderEpoch(0))
                            .await
                            .unwrap();
                        log.wait_for_ack(info.log_end_offset).await.unwrap();
                        assert!(
                            log.durable_offset() >= info.log_end_offset,
                            "acknowledged only when durable"
                        );
                    }
                })
            })
            .collect();
        for appender in appenders {
            appender.await;
        }
        let stats = log.stats();
        assert_eq!(stats.appended_batches, 160);
        assert!(
            stats.data_syncs < 160 / 4,
            "group commit: {} syncs for 160 appends",
            stats.data_syncs
        );
        // Each write and each sync an acknowledgement waited for is timed.
        assert!(stats.chunk_writes > 0);
        assert_eq!(stats.write_latency.count(), stats.chunk_writes);
        assert_eq!(stats.sync_latency.count(), stats.data_syncs);
    });
}

/// A leader deposed while its append waited stages nothing: `append_if`
/// checks leadership when the batch is staged, not only when it was asked.
#[test]
fn append_if_stages_nothing_once_leadership_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let clock = Rc::new(ManualClock::new(1_000));
        let log = open(dir.path(), small_config(), &clock).await;
        let leads = std::cell::Cell::new(true);
        let first = log
            .append_if(&batch(0, 5, 1_000, 100), LeaderEpoch(1), &|| leads.get())
            .await
            .unwrap();
        assert_eq!(first.log_end_offset, Offset(5));
        leads.set(false);
        let refused = log
            .append_if(&batch(1, 5, 1_010, 100), LeaderEpoch(1), &|| leads.get())
            .await;
        assert!(matches!(refused, Err(LogError::Changed)), "{refused:?}");
        assert_eq!(log.log_end_offset(), Offset(5), "nothing staged");
        log.close().await.unwrap();
    });
}

/// A log says whether `maintain` has work, so an owner of thousands of idle
/// logs visits only those that do: staged or unsynced bytes (as the policy
/// counts them), then the recovery-point checkpoint once its time comes
/// (for what was synced), and nothing after that.
#[test]
fn maintenance_is_due_only_while_a_log_has_work() {
    for policy in [
        FlushPolicy::Always,
        FlushPolicy::IntervalMs(50),
        FlushPolicy::None,
    ] {
        let dir = tempfile::tempdir().unwrap();
        run(async {
            let clock = Rc::new(ManualClock::new(1_000));
            let config = broker::log::LogConfig {
                flush_policy: policy,
                ..small_config()
            };
            let log = open(dir.path(), config, &clock).await;
            let due = || log.maintenance_due(clock.now_ms());
            assert!(!due(), "{policy}: a new log has nothing to do");
            log.append(&batch(1, 3, 1_000, 100), LeaderEpoch(0))
                .await
                .unwrap();
            assert!(log.has_pending_writes() && due(), "{policy}: staged bytes");
            log.maintain().await.unwrap();
            assert!(
                log.written_offset() == Offset(3),
                "{policy}: written behind"
            );
            match policy {
                FlushPolicy::Always => assert_eq!(log.durable_offset(), Offset(3)),
                // The first sync in a while comes at once; the next one
                // waits out the interval.
                FlushPolicy::IntervalMs(ms) => {
                    assert_eq!(log.durable_offset(), Offset(3));
                    log.append(&batch(2, 3, 1_000, 100), LeaderEpoch(0))
                        .await
                        .unwrap();
                    log.maintain().await.unwrap();
                    assert_eq!(log.written_offset(), Offset(6));
                    assert!(log.has_pending_writes() && due(), "{policy}: unsynced");
                    clock.advance(ms as i64);
                    log.maintain().await.unwrap();
                    assert_eq!(log.durable_offset(), Offset(6));
                }
                FlushPolicy::None => assert_eq!(log.durable_offset(), Offset(0)),
            }
            assert!(!log.has_pending_writes(), "{policy}");
            assert!(!due(), "{policy}: nothing left until the checkpoint");
            clock.advance(broker::log::RECOVERY_POINT_CHECKPOINT_MS);
            // Under `none` nothing was synced, so no checkpoint can vouch for it.
            assert_eq!(due(), policy != FlushPolicy::None, "{policy}: checkpoint");
            log.maintain().await.unwrap();
            assert!(!due(), "{policy}: idle again");
            if policy != FlushPolicy::None {
                assert_eq!(log.recovery_point(), log.log_end_offset(), "{policy}");
            }
            // An idle log costs no syncs, whatever the interval.
            let syncs = log.stats().data_syncs;
            clock.advance(60_000);
            log.maintain().await.unwrap();
            assert_eq!(
                log.stats().data_syncs,
                syncs,
                "{policy}: idle, not synced again"
            );
        });
    }
}

/// A read longer than one disk read (`DISK_READ_BYTES_MAX`) is read from
/// the segment file in pieces; the pieces come back whole and in order,
/// from an aligned start and from one in the middle of the file.
#[test]
fn a_read_longer_than_one_disk_read_comes_back_whole() {
    use broker::log::DISK_READ_BYTES_MAX;

    let dir = tempfile::tempdir().unwrap();
    run(async {
        let clock = Rc::new(ManualClock::new(1_000));
        let config = broker::log::LogConfig {
            segment_size_bytes: 64 << 20,
            ..small_config()
        };
        let log = open(dir.path(), config.clone(), &clock).await;
        // Even tags are uncompressed: about 50 KB each on disk.
        let tags: Vec<u64> = (0..60u64).map(|n| n * 2).collect();
        for &tag in &tags {
            log.append(&batch(tag, 1, 1_000, 50_000), LeaderEpoch(1))
                .await
                .unwrap();
        }
        log.close().await.unwrap();
        // Reopened, so every byte comes from the file.
        let log = open(dir.path(), config, &clock).await;
        assert_eq!(log.segment_count(), 1);
        for start in [0usize, 7] {
            let fetched = log
                .read(Offset(start as i64), 4 << 20, log.log_end_offset())
                .await
                .unwrap();
            assert!(
                fetched.bytes.len() > 4 * DISK_READ_BYTES_MAX,
                "{} bytes read",
                fetched.bytes.len()
            );
            let batches = decode(&fetched.bytes);
            assert_eq!(batches.len(), tags.len() - start);
            for ((base, values), &tag) in batches.iter().zip(&tags[start..]) {
                assert_eq!(*base, (tag / 2) as i64);
                assert_eq!(values.len(), 1);
                assert!(values[0].starts_with(format!("{tag}:0:").as_bytes()));
                assert_eq!(values[0].len(), 50_000);
            }
        }
        log.check_invariants();
    });
}
