//! Property test: a compacted log against a model of every record ever
//! written. Random keyed writes with tombstones, clock moves, cleaning passes
//! with small key maps (so passes cover the dirty part a piece at a time),
//! crashes at every step of a segment swap, and reopens. After each step the
//! log read back from disk holds each key's latest value (or nothing once its
//! tombstone expired), only records of the model at their own offsets, in
//! strictly increasing offsets, with no record removed that was younger than
//! the compaction lag or that no later record of its key superseded.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use broker::clock::{Clock, ManualClock};
use broker::log::verify::{verify_partition_dir, VerifyOptions};
use broker::log::{CleanRequest, CleanupPolicy, FlushPolicy, LogConfig, PartitionLog, SwapStep};
use proptest::prelude::*;
use protocol::{BatchBuilder, Compression, LeaderEpoch, Offset, Record, RecordBatch};
use support::*;

const KEYS: u8 = 12;
const LAG_MS: i64 = 1_000;
const DELETE_RETENTION_MS: i64 = 5_000;

#[derive(Clone, Debug)]
enum Op {
    Write {
        records: Vec<(u8, bool)>,
        value_bytes: usize,
        zstd: bool,
    },
    AdvanceClockMs(i64),
    Clean {
        map_entries: usize,
        crash_at: Option<SwapStep>,
    },
    CloseReopen,
}

fn swap_step() -> impl Strategy<Value = SwapStep> {
    prop_oneof![
        Just(SwapStep::Written),
        Just(SwapStep::IndexesStaged),
        Just(SwapStep::Committed),
        Just(SwapStep::OldPartlyRemoved),
        Just(SwapStep::OldRemoved),
        Just(SwapStep::Done),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (
            proptest::collection::vec((0..KEYS, proptest::bool::weighted(0.15)), 1..8),
            20usize..300,
            any::<bool>(),
        )
            .prop_map(|(records, value_bytes, zstd)| Op::Write { records, value_bytes, zstd }),
        3 => (0i64..3_000).prop_map(Op::AdvanceClockMs),
        3 => (1usize..16, proptest::option::weighted(0.3, swap_step()))
            .prop_map(|(map_entries, crash_at)| Op::Clean { map_entries, crash_at }),
        1 => Just(Op::CloseReopen),
    ]
}

fn config() -> LogConfig {
    LogConfig {
        cleanup_policy: CleanupPolicy::COMPACT,
        min_cleanable_dirty_ratio_permille: 0,
        min_compaction_lag_ms: LAG_MS,
        delete_retention_ms: DELETE_RETENTION_MS,
        ..small_segments(FlushPolicy::None)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Written {
    key: u8,
    value: Option<Vec<u8>>,
    timestamp_ms: i64,
}

fn keyed_batch(
    records: &[(u8, bool)],
    value_bytes: usize,
    zstd: bool,
    now_ms: i64,
    tag: u64,
) -> (Vec<u8>, Vec<Written>) {
    let mut builder = BatchBuilder::new(if zstd {
        Compression::Zstd
    } else {
        Compression::None
    });
    let mut written = Vec::new();
    for (i, &(key, tombstone)) in records.iter().enumerate() {
        let value = (!tombstone).then(|| {
            let mut v = format!("{tag}:{i}:").into_bytes();
            v.resize(value_bytes.max(v.len()), b'v');
            v
        });
        let key_bytes = [b'k', key];
        builder.push(&Record {
            timestamp_ms: now_ms,
            key: Some(&key_bytes),
            value: value.as_deref(),
            headers: &[],
        });
        written.push(Written {
            key,
            value,
            timestamp_ms: now_ms,
        });
    }
    (builder.build().unwrap(), written)
}

/// One pass over everything cleanable up to the log end, with room for
/// `map_entries` keys.
fn pass(log: &PartitionLog, map_entries: usize, stop_swap_after: Option<SwapStep>) -> CleanRequest {
    CleanRequest {
        end_limit: log.log_end_offset(),
        map_memory_bytes: map_entries * broker::log::compaction::OFFSET_MAP_ENTRY_BYTES,
        io_bytes_per_sec_max: 0,
        zstd_level: 1,
        stop_swap_after,
    }
}

/// Every record the log serves, from its start to its end, in order.
async fn read_all(log: &PartitionLog) -> Vec<(i64, Written)> {
    read_stored(log, 8 * 1024)
        .await
        .into_iter()
        .flat_map(|(_, records)| records)
        .map(|r| {
            let key = r.key.expect("keyed");
            let written = Written {
                key: key[1],
                value: r.value,
                timestamp_ms: r.timestamp_ms,
            };
            (r.offset, written)
        })
        .collect()
}

/// The log against the model. `removable_before_ms`: no record with a
/// timestamp at or after it may be gone (the lag at the last pass).
async fn check(
    log: &PartitionLog,
    model: &BTreeMap<i64, Written>,
    now_ms: i64,
    removable_before_ms: i64,
) {
    log.check_invariants();
    let read = read_all(log).await;
    let mut previous = -1;
    for (offset, record) in &read {
        assert!(
            *offset > previous,
            "offsets strictly increase: {offset} after {previous}"
        );
        previous = *offset;
        assert_eq!(
            model.get(offset),
            Some(record),
            "offset {offset} holds what was written there"
        );
    }
    let present: HashMap<i64, ()> = read.iter().map(|(o, _)| (*o, ())).collect();
    let mut latest: HashMap<u8, i64> = HashMap::new();
    for (offset, record) in model {
        latest.insert(record.key, *offset);
    }
    for (offset, record) in model {
        if present.contains_key(offset) {
            continue;
        }
        assert!(
            record.timestamp_ms < removable_before_ms,
            "offset {offset} removed while younger than the compaction lag"
        );
        let superseded = latest[&record.key] > *offset;
        let expired_tombstone =
            record.value.is_none() && now_ms - record.timestamp_ms > DELETE_RETENTION_MS;
        assert!(
            superseded || expired_tombstone,
            "offset {offset} (key {}) removed though it is the latest value",
            record.key
        );
    }
    let cleaned_to = log.cleaned_to().0;
    let mut keys_below = HashMap::new();
    for (offset, record) in read.iter().filter(|(o, _)| *o < cleaned_to) {
        if let Some(other) = keys_below.insert(record.key, *offset) {
            panic!(
                "key {} at {other} and {offset}, both below the cleaned point {cleaned_to}",
                record.key
            );
        }
    }
}

async fn run_ops(ops: Vec<Op>) {
    let dir = tempfile::tempdir().unwrap();
    let clock = Rc::new(ManualClock::new(1_000_000));
    let mut log = open(dir.path(), config(), &clock).await;
    let mut model: BTreeMap<i64, Written> = BTreeMap::new();
    let mut removable_before_ms = i64::MIN;
    let mut tag = 0u64;
    for op in ops {
        match op {
            Op::Write {
                records,
                value_bytes,
                zstd,
            } => {
                tag += 1;
                let (bytes, written) =
                    keyed_batch(&records, value_bytes, zstd, clock.now_ms(), tag);
                let info = log.append(&bytes, LeaderEpoch(1)).await.unwrap();
                for (i, w) in written.into_iter().enumerate() {
                    model.insert(info.base_offset.0 + i as i64, w);
                }
            }
            Op::AdvanceClockMs(ms) => clock.advance(ms),
            Op::Clean {
                map_entries,
                crash_at,
            } => {
                // Everything appended is on disk, so a crash in the swap
                // loses only what the swap itself was doing.
                log.flush().await.unwrap();
                let request = pass(&log, map_entries, crash_at);
                let report = log.clean(&request).await.unwrap();
                removable_before_ms = removable_before_ms.max(clock.now_ms() - LAG_MS + 1);
                assert!(!report.abandoned);
                if crash_at.is_some() {
                    drop(log);
                    log = open(dir.path(), config(), &clock).await;
                }
            }
            Op::CloseReopen => {
                log.close().await.unwrap();
                drop(log);
                log = open(dir.path(), config(), &clock).await;
            }
        }
        check(&log, &model, clock.now_ms(), removable_before_ms).await;
    }
    log.close().await.unwrap();
    drop(log);
    let report = verify_partition_dir(dir.path(), VerifyOptions::default(), &mut std::io::sink())
        .await
        .unwrap();
    assert_eq!(report.first_problem(), None, "verify-log finds no problem");
    let log = open(dir.path(), config(), &clock).await;
    check(&log, &model, clock.now_ms(), removable_before_ms).await;
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(48),
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_compacted_log_keeps_every_latest_value(ops in proptest::collection::vec(op_strategy(), 1..120)) {
        run(run_ops(ops));
    }
}

/// A deterministic end-to-end pass: many updates per key, then one pass with a
/// map that holds them all leaves exactly one record per key below the
/// active segment, and reading from the start (as a consumer that starts after
/// compaction) sees each key's final value once.
#[test]
fn one_pass_leaves_each_keys_final_value() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let clock = Rc::new(ManualClock::new(1_000_000));
        let config = LogConfig {
            min_compaction_lag_ms: 0,
            ..config()
        };
        let log = open(dir.path(), config.clone(), &clock).await;
        let mut finals = HashMap::new();
        for round in 0..60u64 {
            let records: Vec<(u8, bool)> = (0..KEYS).map(|k| (k, false)).collect();
            let (bytes, _) = keyed_batch(&records, 40, round % 2 == 0, clock.now_ms(), round);
            let info = log.append(&bytes, LeaderEpoch(1)).await.unwrap();
            for k in 0..KEYS {
                finals.insert(k, info.base_offset.0 + i64::from(k));
            }
            clock.advance(10);
        }
        log.flush().await.unwrap();
        let size_before = log.size_bytes();
        let active_base = *log.segment_bases().last().unwrap();
        let report = log.clean(&pass(&log, 1 << 15, None)).await.unwrap();
        assert!(report.segments_rewritten > 1, "{report:?}");
        assert!(report.records_removed > 0);
        assert!(log.size_bytes() < size_before);
        assert_eq!(log.cleaned_to(), active_base);
        log.close().await.unwrap();
        drop(log);
        let log = open(dir.path(), config, &clock).await;
        let read = read_all(&log).await;
        let below: Vec<_> = read.iter().filter(|(o, _)| *o < active_base.0).collect();
        let mut seen = HashMap::new();
        for (offset, record) in &below {
            assert!(
                seen.insert(record.key, *offset).is_none(),
                "key {} once",
                record.key
            );
        }
        // Each key's final value is there, once, whether below or in the active segment.
        for (key, offset) in &finals {
            assert!(read.iter().any(|(o, r)| o == offset && r.key == *key));
        }
        assert_eq!(log.log_end_offset(), Offset(60 * i64::from(KEYS)));
        let _ = clock.now_ms();
    });
}

/// A swap's replaced segment files go to the shard's releaser, which frees
/// their blocks in paced steps, and that takes nothing the compacted log
/// keeps: after the releaser drained, a reopen reads each key's final value
/// back from disk and `verify-log` finds no problem.
#[test]
fn a_swap_leaves_the_replaced_files_space_to_the_releaser() {
    use broker::log::space_release::SpaceReleaser;

    run(async {
        let dir = tempfile::tempdir().unwrap();
        let clock = Rc::new(ManualClock::new(1_000_000));
        let config = LogConfig {
            min_compaction_lag_ms: 0,
            // Larger than a release step, so each replaced file is held.
            segment_size_bytes: 5 << 20,
            write_chunk_bytes: 64 << 10,
            unwritten_bytes_max: (1 << 20) + (64 << 10),
            index_interval_bytes: 4096,
            ..config()
        };
        let log = open(dir.path(), config.clone(), &clock).await;
        let releaser = SpaceReleaser::start(64 << 20);
        log.release_space_through(releaser.clone());
        let mut finals = HashMap::new();
        for round in 0..160u64 {
            let records: Vec<(u8, bool)> = (0..KEYS).map(|k| (k, false)).collect();
            let (bytes, _) = keyed_batch(&records, 8_000, false, clock.now_ms(), round);
            let info = log.append(&bytes, LeaderEpoch(1)).await.unwrap();
            for k in 0..KEYS {
                finals.insert(k, info.base_offset.0 + i64::from(k));
            }
            clock.advance(10);
        }
        log.flush().await.unwrap();
        assert!(log.segment_bases().len() >= 3, "{:?}", log.segment_bases());
        let report = log.clean(&pass(&log, 1 << 15, None)).await.unwrap();
        assert!(report.segments_rewritten >= 2, "{report:?}");
        let mut waited_ms = 0;
        // A file counts as released once closed, after its last step.
        while releaser.stats().pending_bytes > 0 || releaser.stats().released_files < 2 {
            assert!(waited_ms < 30_000, "{:?}", releaser.stats());
            broker::runtime::sleep(std::time::Duration::from_millis(10)).await;
            waited_ms += 10;
        }
        let released = releaser.stats();
        assert!(released.released_bytes >= 2 * (4 << 20), "{released:?}");
        assert_eq!(released.failures, 0);
        log.close().await.unwrap();
        drop(log);
        let verified =
            verify_partition_dir(dir.path(), VerifyOptions::default(), &mut std::io::sink())
                .await
                .unwrap();
        assert_eq!(
            verified.first_problem(),
            None,
            "verify-log finds no problem"
        );
        let log = open(dir.path(), config, &clock).await;
        let read = read_all(&log).await;
        for (key, offset) in &finals {
            assert!(
                read.iter().any(|(o, r)| o == offset && r.key == *key),
                "key {key} at {offset}"
            );
        }
        assert_eq!(log.log_end_offset(), Offset(160 * i64::from(KEYS)));
    });
}

#[test]
fn a_compacted_log_refuses_records_without_a_key() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let clock = Rc::new(ManualClock::new(1_000_000));
        let log = open(dir.path(), config(), &clock).await;
        let mut builder = BatchBuilder::new(Compression::Zstd);
        for key in [Some(&b"a"[..]), None] {
            builder.push(&Record {
                timestamp_ms: 1,
                key,
                value: Some(b"v"),
                headers: &[],
            });
        }
        let error = log
            .append(&builder.build().unwrap(), LeaderEpoch(1))
            .await
            .unwrap_err();
        assert!(
            matches!(&error, broker::log::LogError::InvalidRecord(why) if why.contains("key")),
            "{error}"
        );
        assert_eq!(log.log_end_offset(), Offset::ZERO, "nothing appended");
        let delete_only = open(
            tempfile::tempdir().unwrap().path(),
            LogConfig::default(),
            &clock,
        )
        .await;
        let mut builder = BatchBuilder::new(Compression::None);
        builder.push(&Record {
            timestamp_ms: 1,
            key: None,
            value: Some(b"v"),
            headers: &[],
        });
        delete_only
            .append(&builder.build().unwrap(), LeaderEpoch(1))
            .await
            .unwrap();
    });
}

/// A pass that meets a corrupt stored batch fails with a storage error,
/// leaves no staged file behind and changes nothing: the segments it would
/// have replaced are all still there.
#[test]
fn a_corrupt_segment_fails_the_pass_and_changes_nothing() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let clock = Rc::new(ManualClock::new(1_000_000));
        let config = LogConfig {
            min_compaction_lag_ms: 0,
            ..config()
        };
        let log = open(dir.path(), config.clone(), &clock).await;
        for round in 0..20u64 {
            let records: Vec<(u8, bool)> = (0..KEYS).map(|k| (k, false)).collect();
            let (bytes, _) = keyed_batch(&records, 60, false, clock.now_ms(), round);
            log.append(&bytes, LeaderEpoch(1)).await.unwrap();
        }
        log.close().await.unwrap();
        drop(log);
        // Flip a byte under the CRC in the second segment.
        let second = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .nth(1)
            .unwrap();
        let mut bytes = std::fs::read(&second).unwrap();
        bytes[100] ^= 0xff;
        std::fs::write(&second, &bytes).unwrap();
        let log = open(dir.path(), config, &clock).await;
        let bases = log.segment_bases();
        let error = log.clean(&pass(&log, 1 << 15, None)).await.unwrap_err();
        assert!(
            matches!(error, broker::log::LogError::Corrupt { .. }),
            "{error}"
        );
        assert_eq!(log.segment_bases(), bases);
        let staged: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".cleaned") || n.ends_with(".swap"))
            .collect();
        assert!(staged.is_empty(), "{staged:?}");
        assert_eq!(
            std::fs::read(&second).unwrap(),
            bytes,
            "the damaged segment is untouched"
        );
    });
}

/// A follower copies a compacted leader's batches as they are: a batch that
/// starts past its log end (a hole) and a batch emptied by compaction are
/// appended, read back in order and survive a restart.
#[test]
fn a_replica_appends_across_a_compacted_hole() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let clock = Rc::new(ManualClock::new(1_000_000));
        let log = open(dir.path(), config(), &clock).await;
        let stamped = |records: &[(u8, bool)], base: i64, tag: u64| {
            let (mut bytes, _) = keyed_batch(records, 30, tag.is_multiple_of(2), 1_000_000, tag);
            protocol::record_batch::stamp(&mut bytes, Offset(base), LeaderEpoch(2));
            bytes
        };
        // Offsets 0..=2, then the leader's batch 3..=5 was dropped whole, then
        // 6..=8 with only its last record kept, then an emptied 9..=10.
        log.append_replica(&stamped(&[(1, false), (2, false), (3, false)], 0, 1))
            .await
            .unwrap();
        let full = stamped(&[(4, false), (5, false), (6, false)], 6, 2);
        let parsed = RecordBatch::parse(&full, 1 << 20).unwrap();
        let protocol::Retained::Rewritten(shortened) =
            protocol::record_batch::retain_records(&parsed, 1 << 20, 1, |r| r.offset == Offset(8))
                .unwrap()
        else {
            panic!("records were dropped");
        };
        let info = log.append_replica(&shortened).await.unwrap();
        assert_eq!(
            (info.base_offset, info.log_end_offset),
            (Offset(6), Offset(9))
        );
        let two = stamped(&[(7, false), (8, false)], 9, 3);
        let parsed = RecordBatch::parse(&two, 1 << 20).unwrap();
        let protocol::Retained::Rewritten(emptied) =
            protocol::record_batch::retain_records(&parsed, 1 << 20, 1, |_| false).unwrap()
        else {
            panic!("records were dropped");
        };
        log.append_replica(&emptied).await.unwrap();
        assert_eq!(log.log_end_offset(), Offset(11));
        let error = log
            .append_replica(&stamped(&[(9, false)], 10, 4))
            .await
            .unwrap_err();
        assert!(
            matches!(error, broker::log::LogError::NonContiguousReplica { .. }),
            "{error}"
        );
        log.close().await.unwrap();
        drop(log);
        let log = open(dir.path(), config(), &clock).await;
        let offsets: Vec<i64> = read_all(&log).await.into_iter().map(|(o, _)| o).collect();
        assert_eq!(offsets, vec![0, 1, 2, 8]);
        // A read that starts in the hole gets the next batch.
        let fetched = log
            .read(Offset(4), 1 << 20, log.log_end_offset())
            .await
            .unwrap();
        let first = RecordBatch::parse_prefix(&fetched.bytes, 1 << 20)
            .unwrap()
            .0;
        assert_eq!(first.header().base_offset, Offset(6));
        assert_eq!(log.log_end_offset(), Offset(11));
    });
}

/// A compaction swap fences the journal's records of the segments it
/// replaces: a replay after a crash never writes the old segments' images
/// into the compacted files, which would put removed records back over
/// the kept ones and break the log at the first mismatch.
#[test]
fn a_swap_fences_the_journal_so_a_replay_leaves_compacted_segments_alone() {
    use broker::log::journal_replay::{replay_journals, JOURNAL_DIR};
    use broker::log::shard_journal::ShardJournal;

    let data = tempfile::tempdir().unwrap();
    let dir = data.path().join("topics").join("c-0");
    let config = LogConfig {
        min_compaction_lag_ms: 0,
        flush_policy: FlushPolicy::Always,
        ..config()
    };
    let clock = Rc::new(ManualClock::new(1_000_000));
    let mut finals = HashMap::new();
    let mut active_base = Offset(0);
    {
        let (data, dir, config, clock, finals, active_base) = (
            data.path(),
            dir.clone(),
            config.clone(),
            clock.clone(),
            &mut finals,
            &mut active_base,
        );
        run(async move {
            let journal = ShardJournal::open(&data.join(JOURNAL_DIR), "shard-0", 4 << 20)
                .await
                .unwrap();
            let log = open(&dir, config, &clock).await;
            log.attach_journal(journal).await.unwrap();
            for round in 0..60u64 {
                let records: Vec<(u8, bool)> = (0..KEYS).map(|k| (k, false)).collect();
                let (bytes, _) = keyed_batch(&records, 40, round % 2 == 0, clock.now_ms(), round);
                let info = log.append(&bytes, LeaderEpoch(1)).await.unwrap();
                log.wait_for_ack(info.log_end_offset).await.unwrap();
                for k in 0..KEYS {
                    finals.insert(k, info.base_offset.0 + i64::from(k));
                }
                clock.advance(10);
            }
            assert!(log.stats().journal_commits > 0);
            // Rolled segments sealed (synced), then compacted.
            log.flush().await.unwrap();
            let report = log.clean(&pass(&log, 1 << 15, None)).await.unwrap();
            assert!(report.segments_rewritten > 1, "{report:?}");
            assert!(report.records_removed > 0, "{report:?}");
            *active_base = *log.segment_bases().last().unwrap();
            // Dropped unclosed: a crash, with every record still in the ring.
        });
    }
    let replayed = replay_journals(data.path()).unwrap();
    assert!(replayed.records > 0);
    run(async {
        let log = open(&dir, config, &clock).await;
        assert_eq!(log.log_end_offset(), Offset(60 * i64::from(KEYS)));
        let read = read_all(&log).await;
        for (key, offset) in &finals {
            assert!(
                read.iter().any(|(o, r)| o == offset && r.key == *key),
                "key {key}'s last value at {offset}"
            );
        }
        // The compaction stands: below the active segment, each key once.
        let mut seen = HashMap::new();
        for (offset, record) in read.iter().filter(|(o, _)| *o < active_base.0) {
            if let Some(first) = seen.insert(record.key, *offset) {
                panic!("key {} at {first} and again at {offset}", record.key);
            }
        }
        log.close().await.unwrap();
    });
    let found = run(async {
        verify_partition_dir(&dir, VerifyOptions::default(), &mut std::io::sink()).await
    })
    .unwrap();
    assert!(found.problems.is_empty(), "{:?}", found.problems);
}
