//! Storage faults never abort the broker or lose what was stored:
//! - corrupt lengths in stored batches (negative, beyond the segment, huge)
//!   give `LogError::Corrupt` from reads and timestamp lookups, never a panic
//!   or a silent empty read;
//! - a read or timestamp lookup racing a truncation answers from the log as
//!   it is afterwards (or a typed error), never trips an assertion;
//! - lowering `batch_bytes_max` between restarts keeps older, larger batches;
//! - recovery syncs every segment it rescanned before it persists a recovery
//!   point that vouches for them (the log asserts it on every persist);
//! - a new partition directory is durable: its parents are synced;
//! - empty logs made in bulk are synced before they open, open without a
//!   rescan, and keep what they acknowledged across a crash;
//! - a closed log refuses truncation, reset and retention, so a task that
//!   outlives its shard's shutdown cannot change files already recorded as
//!   cleanly closed.

mod support;

use std::path::{Path, PathBuf};
use std::rc::Rc;

use broker::clock::ManualClock;
use broker::log::{LogConfig, LogError};
use broker::runtime;
use protocol::{LeaderEpoch, Offset, RecordBatch};
use support::*;

fn config() -> LogConfig {
    LogConfig {
        segment_size_bytes: 256 * 1024,
        ..small_config()
    }
}

/// Appends `batches` batches of 4 records with values of `value_bytes`; closes
/// cleanly when `close` is set (else it is left as a crash would leave it).
fn build(dir: &Path, config: LogConfig, batches: u64, value_bytes: usize, close: bool) {
    run(async {
        let clock = Rc::new(ManualClock::new(1_000));
        let log = open(dir, config, &clock).await;
        for tag in 0..batches {
            let info = log
                .append(
                    &batch(tag, 4, 1_000 + tag as i64 * 10, value_bytes),
                    LeaderEpoch(1),
                )
                .await
                .unwrap();
            log.wait_for_ack(info.log_end_offset).await.unwrap();
        }
        log.flush().await.unwrap();
        if close {
            log.close().await.unwrap();
        }
    });
}

fn log_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    files.sort();
    files
}

/// Byte positions of the batches in a segment file.
fn batch_positions(path: &Path) -> Vec<usize> {
    let bytes = std::fs::read(path).unwrap();
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let (_, used) = RecordBatch::parse_prefix(&bytes[at..], 1 << 24).unwrap();
        out.push(at);
        at += used;
    }
    out
}

/// Overwrites the batch length field (bytes 8..12) of the batch at `position`.
fn set_batch_length(path: &Path, position: usize, length: i32) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[position + 8..position + 12].copy_from_slice(&length.to_be_bytes());
    std::fs::write(path, bytes).unwrap();
}

fn is_corrupt<T: std::fmt::Debug>(result: &Result<T, LogError>) -> bool {
    matches!(result, Err(LogError::Corrupt { .. }))
}

#[test]
fn corrupt_batch_lengths_are_storage_errors_not_aborts() {
    for (name, length) in [
        ("negative", -100_000i32),
        ("below a header", 3),
        ("past the segment", 200_000),
        ("huge", i32::MAX),
    ] {
        let dir = tempfile::tempdir().unwrap();
        build(dir.path(), config(), 40, 200, true);
        let first = &log_files(dir.path())[0];
        let positions = batch_positions(first);
        // A batch in the middle of a closed, trusted segment: recovery does
        // not rescan it, so only reads meet it.
        set_batch_length(first, positions[20], length);
        run(async {
            let clock = Rc::new(ManualClock::new(1_000));
            let log = open(dir.path(), config(), &clock).await;
            let end = log.log_end_offset();
            // From offset 0 a read's window reaches the damaged batch.
            let mut next = Offset(0);
            let mut outcome = Ok(());
            while next < end {
                match log.read(next, 64 * 1024, end).await {
                    Ok(fetched) => {
                        assert!(fetched.batch_count > 0, "{name}: no silent empty read");
                        next = fetched.next_offset;
                    }
                    Err(e) => {
                        outcome = Err(e);
                        break;
                    }
                }
            }
            assert!(
                is_corrupt(&outcome),
                "{name}: a read through the damage is a corruption: {outcome:?}"
            );
            assert!(next <= Offset(80), "{name}: nothing past the damage served");
            // The timestamp of the damaged batch's records.
            let lookup = log.offset_for_timestamp(1_000 + 20 * 10).await;
            assert!(
                is_corrupt(&lookup),
                "{name}: a timestamp lookup through the damage: {lookup:?}"
            );
            log.check_invariants();
        });
    }
}

#[test]
fn reads_racing_a_truncation_answer_from_the_new_log() {
    // Small batch bound: a timestamp lookup over this log needs many windows,
    // so truncations land between them.
    let config = LogConfig {
        segment_size_bytes: 64 << 20,
        // One index entry per segment: a lookup walks the segment window by
        // window, so the truncation lands between two of its reads.
        index_interval_bytes: 64 << 20,
        ..small_config()
    };
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), config.clone(), 2_000, 1_000, true);
    run(async {
        let clock = Rc::new(ManualClock::new(1_000));
        let log = open(dir.path(), config, &clock).await;
        for round in 0..30i64 {
            let end = log.log_end_offset();
            // Cut 50 batches off the end of the one segment while a lookup
            // of a timestamp just above the cut walks towards it.
            let cut = Offset(end.0 - 200);
            let target_ms = 1_000 + (end.0 / 4 - 20) * 10;
            let (reader, looker) = (log.clone(), log.clone());
            let read =
                runtime::spawn(async move { reader.read(Offset(end.0 - 400), 1 << 20, end).await });
            let lookup =
                runtime::spawn(async move { looker.offset_for_timestamp(target_ms).await });
            // Let both start and issue their first reads.
            futures_lite::future::yield_now().await;
            let new_end = log.truncate_to(cut).await.unwrap();
            assert!(new_end <= cut, "round {round}");
            let read = read.await;
            assert!(
                matches!(read, Ok(_) | Err(LogError::Changed)),
                "round {round}: {read:?}"
            );
            if let Ok(fetched) = read {
                for (base, _) in decode(&fetched.bytes) {
                    assert!(base < end.0, "round {round}: served batch {base}");
                }
            }
            let lookup = lookup.await;
            assert!(
                matches!(lookup, Ok(_) | Err(LogError::Changed)),
                "round {round}: {lookup:?}"
            );
            log.check_invariants();
        }
    });
}

#[test]
fn lowering_batch_bytes_max_keeps_older_larger_batches() {
    let dir = tempfile::tempdir().unwrap();
    let large = LogConfig {
        batch_bytes_max: 1 << 20,
        ..config()
    };
    // 4 records of 50 KB: batches of about 200 KB. Left as after a crash, so
    // the reopen rescans the whole active segment.
    build(dir.path(), large, 12, 50_000, false);
    let small = LogConfig {
        batch_bytes_max: 64 * 1024,
        unwritten_bytes_max: (4 << 20) + 64 * 1024,
        ..config()
    };
    run(async {
        let clock = Rc::new(ManualClock::new(1_000));
        let log = open(dir.path(), small, &clock).await;
        assert_eq!(log.log_end_offset(), Offset(48), "every batch kept");
        let mut next = Offset(0);
        let mut tags = Vec::new();
        while next < log.log_end_offset() {
            let fetched = log.read(next, 1 << 20, log.log_end_offset()).await.unwrap();
            tags.extend(decode(&fetched.bytes).into_iter().map(|(b, _)| b));
            next = fetched.next_offset;
        }
        assert_eq!(tags, (0..12).map(|t| t * 4).collect::<Vec<_>>());
        // New appends obey the lower bound.
        let too_big = batch(98, 4, 5_000, 50_000);
        assert!(log.append(&too_big, LeaderEpoch(1)).await.is_err());
        log.close().await.unwrap();
    });
}

#[test]
fn recovery_syncs_what_it_rescanned_before_vouching_for_it() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), config(), 400, 1_000, false);
    assert!(log_files(dir.path()).len() >= 4, "several segments");
    // A lost recovery point: every segment is rescanned on open. The log
    // asserts that each one is synced before the new point covers it.
    std::fs::remove_file(dir.path().join("recovery-point")).unwrap();
    run(async {
        let clock = Rc::new(ManualClock::new(1_000));
        let log = open(dir.path(), config(), &clock).await;
        assert_eq!(log.log_end_offset(), Offset(1_600));
        log.check_invariants();
        log.close().await.unwrap();
    });
}

#[test]
fn a_new_partition_directory_is_durable() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data").join("topics").join("t-0");
    run(async {
        broker::log::record_dir_syncs();
        let clock = Rc::new(ManualClock::new(1_000));
        let log = open(&dir, config(), &clock).await;
        let synced = broker::log::record_dir_syncs();
        for parent in [
            root.path().to_path_buf(),
            root.path().join("data"),
            root.path().join("data").join("topics"),
        ] {
            assert!(
                synced.contains(&parent),
                "{} synced after its new entry was made: {synced:?}",
                parent.display()
            );
        }
        log.close().await.unwrap();
    });
}

// Empty logs made in bulk open without a rescan, take appends, and after a
// crash (dropped without close) recover everything acknowledged; a later
// bulk pass leaves the existing directories alone.
#[test]
fn empty_logs_made_in_bulk_keep_what_they_acknowledge_across_a_crash() {
    use broker::log::{create_empty_logs, EmptyLog, PartitionLog};
    let root = tempfile::tempdir().unwrap();
    let parent = root.path().join("data").join("topics");
    let logs: Vec<EmptyLog> = (0..3)
        .map(|p| EmptyLog {
            dir: parent.join(format!("t-{p}")),
            files: vec![("topic.id", b"9".to_vec())],
        })
        .collect();
    broker::log::record_dir_syncs();
    assert_eq!(
        create_empty_logs(&parent, &logs).unwrap(),
        vec![true, true, true]
    );
    let synced = broker::log::record_dir_syncs();
    for dir in logs.iter().map(|l| &l.dir).chain([&parent]) {
        assert!(synced.contains(dir), "{} synced", dir.display());
    }
    for (p, log) in logs.iter().enumerate() {
        run(async {
            let clock: Rc<dyn broker::clock::Clock> = Rc::new(ManualClock::new(1_000));
            let opened = PartitionLog::open_empty(&log.dir, config(), clock)
                .await
                .unwrap();
            assert_eq!(opened.log_end_offset(), Offset::ZERO);
            assert_eq!(opened.stats().rescanned_segments, 0);
            for tag in 0..=p as u64 {
                let info = opened
                    .append(&batch(tag, 4, 1_000, 100), LeaderEpoch(0))
                    .await
                    .unwrap();
                opened.wait_for_ack(info.log_end_offset).await.unwrap();
            }
            // Dropped without close: a crash.
        });
    }
    assert_eq!(
        create_empty_logs(&parent, &logs).unwrap(),
        vec![false, false, false]
    );
    for (p, log) in logs.iter().enumerate() {
        assert_eq!(std::fs::read(log.dir.join("topic.id")).unwrap(), b"9");
        run(async {
            let clock = Rc::new(ManualClock::new(2_000));
            let reopened = open(&log.dir, config(), &clock).await;
            assert_eq!(reopened.log_end_offset(), Offset(4 * (p as i64 + 1)));
            reopened.check_invariants();
            reopened.close().await.unwrap();
        });
    }
}

fn inode(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().ino()
}

// A clean shutdown's checkpoint already vouches for every byte, so reopening
// rewrites nothing (a restart of thousands of partitions is mostly these
// fsyncs); the marker is gone for good before the log takes appends, so a
// crash after them rescans the tail.
#[test]
fn a_clean_reopen_keeps_the_checkpoint_and_a_later_crash_rescans() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), config(), 100, 1_000, true);
    let point = dir.path().join("recovery-point");
    let before = (inode(&point), std::fs::read(&point).unwrap());
    run(async {
        let clock = Rc::new(ManualClock::new(2_000));
        let log = open(dir.path(), config(), &clock).await;
        assert_eq!(log.log_end_offset(), Offset(400));
        assert_eq!(log.recovery_point(), Offset(400));
        assert!(!dir.path().join("clean-shutdown").exists());
        assert_eq!((inode(&point), std::fs::read(&point).unwrap()), before);
        let info = log
            .append(&batch(500, 4, 3_000, 1_000), LeaderEpoch(1))
            .await
            .unwrap();
        log.wait_for_ack(info.log_end_offset).await.unwrap();
        // Dropped without close: a crash.
    });
    run(async {
        let clock = Rc::new(ManualClock::new(4_000));
        let log = open(dir.path(), config(), &clock).await;
        assert_eq!(log.log_end_offset(), Offset(404));
        log.check_invariants();
        // Not clean: the checkpoint is written again for the rescanned tail.
        assert_ne!(inode(&point), before.0);
        log.close().await.unwrap();
    });
}

// An unclean reopen whose checkpoint lags the log syncs the rescanned bytes
// and moves the checkpoint up to the log end.
#[test]
fn an_unclean_reopen_moves_the_checkpoint_to_the_log_end() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), config(), 100, 1_000, false);
    run(async {
        let clock = Rc::new(ManualClock::new(2_000));
        let log = open(dir.path(), config(), &clock).await;
        assert_eq!(log.log_end_offset(), Offset(400));
        assert_eq!(log.recovery_point(), Offset(400));
        let text = std::fs::read_to_string(dir.path().join("recovery-point")).unwrap();
        assert_eq!(text.lines().nth(1), Some("400"), "{text}");
        log.close().await.unwrap();
    });
}

// A log closed without its own marker is rescanned unless the data dir's
// record of a clean shutdown names it; one that is named is trusted as a
// marked one is. The record is read once: taking it removes it.
#[test]
fn a_log_named_by_the_clean_shutdown_record_opens_without_a_rescan() {
    use broker::log::{take_clean_logs, write_clean_logs, PartitionLog};
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().join("topics").join("t-0");
    std::fs::create_dir_all(&dir).unwrap();
    build(&dir, config(), 100, 1_000, false);
    let rescans = |closed_clean: bool| {
        run(async {
            let clock: Rc<dyn broker::clock::Clock> = Rc::new(ManualClock::new(2_000));
            let log = PartitionLog::open_after(&dir, config(), clock, closed_clean)
                .await
                .unwrap();
            assert_eq!(log.log_end_offset(), Offset(400));
            let rescanned = log.stats().rescanned_segments;
            assert!(log.close_unmarked().await.unwrap(), "this close sealed it");
            // Already closed (as after an error): not sealed by this call, so
            // the broker does not record it as clean.
            assert!(!log.close_unmarked().await.unwrap());
            assert!(!dir.join("clean-shutdown").exists(), "no marker of its own");
            rescanned
        })
    };
    // After a crash (the build dropped the log unclosed): every segment.
    assert!(rescans(false) > 0);
    // Closed unmarked, and named by the record: none.
    write_clean_logs(data.path(), &["t-0".to_string(), "t-1".to_string()]).unwrap();
    let named = take_clean_logs(data.path()).unwrap();
    assert!(named.contains("t-0") && named.contains("t-1"));
    assert!(
        !data.path().join("clean-shutdown-logs").exists(),
        "taken once"
    );
    assert!(take_clean_logs(data.path()).unwrap().is_empty());
    assert_eq!(rescans(named.contains("t-0")), 0);
    // Closed unmarked and not named (the record was taken, then a crash):
    // rescanned again.
    assert!(rescans(false) > 0);
    // A damaged record names nothing.
    std::fs::write(data.path().join("clean-shutdown-logs"), "t-0\n").unwrap();
    assert!(take_clean_logs(data.path()).unwrap().is_empty());
}

#[test]
fn a_closed_log_refuses_whatever_would_change_its_files() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), config(), 200, 1_000, false);
    let files_before = |dir: &Path| -> Vec<(PathBuf, u64)> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .map(|p| (p.clone(), std::fs::metadata(&p).unwrap().len()))
            .collect();
        files.sort();
        files
    };
    run(async {
        let clock = Rc::new(ManualClock::new(1_000));
        let log = open(dir.path(), config(), &clock).await;
        let end = log.log_end_offset();
        assert_eq!(end, Offset(800));
        log.close().await.unwrap();
        let closed = files_before(dir.path());
        assert!(matches!(
            log.truncate_to(Offset(400)).await,
            Err(LogError::Closed)
        ));
        assert!(matches!(
            log.reset_to_if(Offset(5_000), Rc::new(|| true)).await,
            Err(LogError::Closed)
        ));
        assert!(matches!(
            log.enforce_retention(end).await,
            Err(LogError::Closed)
        ));
        log.maintain().await.unwrap();
        assert_eq!(
            files_before(dir.path()),
            closed,
            "no file changed after close"
        );
    });
    // The reopened log is the one that was closed.
    run(async {
        let clock = Rc::new(ManualClock::new(1_000));
        let log = open(dir.path(), config(), &clock).await;
        assert_eq!(log.log_end_offset(), Offset(800));
        log.check_invariants();
    });
}
