//! Crash recovery: torn tails at every kind of boundary, flipped bytes in
//! closed and active segments, damaged and missing index files. Reopening
//! must keep exactly the longest valid prefix, never serve an invalid batch,
//! and `verify-log` must name the damage.

mod support;

use std::path::{Path, PathBuf};
use std::rc::Rc;

use broker::clock::ManualClock;
use broker::log::segment::{segment_path, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX};
use broker::log::verify::{verify_partition_dir, VerifyOptions};
use broker::log::{LogConfig, LogError};
use protocol::{LeaderEpoch, Offset, RecordBatch};
use support::*;

const BATCHES: u64 = 120;
const RECORDS: usize = 4;

fn config() -> LogConfig {
    LogConfig {
        segment_size_bytes: 16 * 1024,
        ..small_config()
    }
}

/// Writes a log of several segments and closes it cleanly.
fn build_log(dir: &Path) {
    run(async {
        let clock = Rc::new(ManualClock::new(1_000));
        let log = open(dir, config(), &clock).await;
        for tag in 0..BATCHES {
            log.append(
                &batch(tag, RECORDS, 1_000 + tag as i64, 150),
                LeaderEpoch(3),
            )
            .await
            .unwrap();
        }
        log.close().await.unwrap();
    });
}

fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    files.sort();
    files
}

/// (position, base offset) of each batch in a segment file.
fn batch_positions(path: &Path) -> Vec<(u64, i64)> {
    let bytes = std::fs::read(path).unwrap();
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let (batch, used) = RecordBatch::parse_prefix(&bytes[at..], 1 << 20).unwrap();
        out.push((at as u64, batch.header().base_offset.0));
        at += used;
    }
    out
}

/// Shortens `path` to `len` bytes, as a crash that lost its later writes does.
fn cut_file(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

fn simulate_crash(dir: &Path) {
    let _ = std::fs::remove_file(dir.join("clean-shutdown"));
}

fn verify(dir: &Path) -> broker::log::verify::VerifyReport {
    run(async {
        verify_partition_dir(dir, VerifyOptions::default(), &mut std::io::sink())
            .await
            .unwrap()
    })
}

/// Reopens and returns (log start, log end, every batch base readable).
fn reopen_and_read(dir: &Path) -> (Offset, Offset, Vec<i64>) {
    run(async {
        let clock = Rc::new(ManualClock::new(1_000));
        let log = open(dir, config(), &clock).await;
        let (start, end) = (log.log_start_offset(), log.log_end_offset());
        let mut next = start;
        let mut bases = Vec::new();
        while next < end {
            let fetched = log.read(next, 1 << 20, end).await.unwrap();
            bases.extend(decode(&fetched.bytes).into_iter().map(|(b, _)| b));
            next = fetched.next_offset;
        }
        log.check_invariants();
        log.close().await.unwrap();
        (start, end, bases)
    })
}

fn all_bases_below(end: i64) -> Vec<i64> {
    (0..BATCHES as i64)
        .map(|t| t * RECORDS as i64)
        .filter(|b| *b < end)
        .collect()
}

/// Cutting the active segment inside a header, inside the records, or at a
/// batch boundary leaves exactly the batches before the cut.
#[test]
fn torn_tail_of_the_active_segment_is_cut_at_the_last_whole_batch() {
    for (name, into_batch) in [
        ("inside header", 10u64),
        ("inside records", 80),
        ("at boundary", 0),
    ] {
        let dir = tempfile::tempdir().unwrap();
        build_log(dir.path());
        let active = segment_files(dir.path()).pop().unwrap();
        let positions = batch_positions(&active);
        let (position, base) = positions[positions.len() / 2];
        let cut = position + into_batch;
        cut_file(&active, cut);
        simulate_crash(dir.path());

        let report = verify(dir.path());
        if into_batch == 0 {
            assert!(
                report
                    .problems
                    .iter()
                    .all(|p| !p.file.ends_with(active.file_name().unwrap())
                        || p.reason.contains("entry")),
                "{name}: {:?}",
                report.problems
            );
        } else {
            let first = report
                .first_problem()
                .unwrap_or_else(|| panic!("{name}: damage reported"));
            assert_eq!(first.file, active, "{name}");
            assert_eq!(first.position, position, "{name}");
        }
        let (_, end, bases) = reopen_and_read(dir.path());
        assert_eq!(end, Offset(base), "{name}: log ends before the torn batch");
        assert_eq!(bases, all_bases_below(base), "{name}");
        let after = verify(dir.path());
        assert!(
            after.problems.is_empty(),
            "{name}: repaired: {:?}",
            after.problems
        );
    }
}

/// A flipped byte in the active segment truncates the log at that batch; one in
/// a closed segment below the recovery point is caught on read and never served.
#[test]
fn flipped_bytes_are_never_served() {
    // Active segment, unclean shutdown: rescanned and cut.
    let dir = tempfile::tempdir().unwrap();
    build_log(dir.path());
    let active = segment_files(dir.path()).pop().unwrap();
    let positions = batch_positions(&active);
    let (position, base) = positions[1];
    flip(&active, position + 70);
    simulate_crash(dir.path());
    let report = verify(dir.path());
    assert_eq!(
        report.first_problem().map(|p| (p.file.clone(), p.position)),
        Some((active.clone(), position))
    );
    let (_, end, bases) = reopen_and_read(dir.path());
    assert_eq!(end, Offset(base));
    assert_eq!(bases, all_bases_below(base));

    // Closed segment with the recovery point lost: rescanned, cut there, later segments dropped.
    let dir = tempfile::tempdir().unwrap();
    build_log(dir.path());
    let closed = segment_files(dir.path())[1].clone();
    let (position, base) = batch_positions(&closed)[2];
    flip(&closed, position + 30);
    simulate_crash(dir.path());
    std::fs::remove_file(dir.path().join("recovery-point")).unwrap();
    assert_eq!(
        verify(dir.path())
            .first_problem()
            .map(|p| (p.file.clone(), p.position)),
        Some((closed.clone(), position))
    );
    let (_, end, bases) = reopen_and_read(dir.path());
    assert_eq!(end, Offset(base));
    assert_eq!(bases, all_bases_below(base));
    assert_eq!(
        segment_files(dir.path()).len(),
        2,
        "segments after the damage are gone"
    );

    // Closed segment the recovery point vouches for: kept, but reads refuse it.
    let dir = tempfile::tempdir().unwrap();
    build_log(dir.path());
    let closed = segment_files(dir.path())[0].clone();
    let (position, base) = batch_positions(&closed)[3];
    flip(&closed, position + 30);
    assert_eq!(
        verify(dir.path()).first_problem().map(|p| p.position),
        Some(position)
    );
    run(async {
        let clock = Rc::new(ManualClock::new(1_000));
        let log = open(dir.path(), config(), &clock).await;
        let error = log
            .read(Offset(base), 1 << 20, log.log_end_offset())
            .await
            .unwrap_err();
        assert!(
            matches!(error, LogError::Corrupt { position: p, .. } if p == position),
            "{error}"
        );
        // Batches before it are still served.
        let before = log.read(Offset(0), 1, log.log_end_offset()).await.unwrap();
        assert_eq!(decode(&before.bytes)[0].0, 0);
    });
}

fn flip(path: &Path, position: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[position as usize] ^= 0x5a;
    std::fs::write(path, bytes).unwrap();
}

/// A torn index entry and missing index files are rebuilt; nothing is lost.
#[test]
fn damaged_and_missing_indexes_are_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    build_log(dir.path());
    let files = segment_files(dir.path());
    let index = files[0].with_extension(INDEX_SUFFIX);
    let len = std::fs::metadata(&index).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&index)
        .unwrap()
        .set_len(len - 3)
        .unwrap();
    std::fs::remove_file(files[1].with_extension(INDEX_SUFFIX)).unwrap();
    std::fs::remove_file(files[1].with_extension(TIME_INDEX_SUFFIX)).unwrap();
    let report = verify(dir.path());
    assert_eq!(
        report.first_problem().map(|p| p.file.clone()),
        Some(index.clone()),
        "{:?}",
        report.problems
    );
    assert_eq!(report.missing_indexes.len(), 2);

    let (start, end, bases) = reopen_and_read(dir.path());
    assert_eq!(
        (start, end),
        (Offset(0), Offset((BATCHES as usize * RECORDS) as i64))
    );
    assert_eq!(bases, all_bases_below(end.0));
    let report = verify(dir.path());
    assert!(
        report.problems.is_empty() && report.missing_indexes.is_empty(),
        "{report:?}"
    );
}

/// A wrong index entry (pointing into the middle of a batch) is detected by
/// verify-log and does not mislead reads after reopen.
#[test]
fn index_entry_pointing_mid_batch_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    build_log(dir.path());
    let files = segment_files(dir.path());
    let index = files[0].with_extension(INDEX_SUFFIX);
    let mut bytes = std::fs::read(&index).unwrap();
    // Second entry's position (header 8 bytes, entry 8 bytes: offset then position).
    let at = 8 + 8 + 4;
    let position = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    bytes[at..at + 4].copy_from_slice(&(position + 1).to_be_bytes());
    std::fs::write(&index, bytes).unwrap();
    let report = verify(dir.path());
    assert_eq!(
        report.first_problem().map(|p| (p.file.clone(), p.position)),
        Some((index, 16))
    );
}

/// The verify-log binary exits 1 and names the file and byte of the damage.
#[test]
fn verify_log_cli_names_the_first_corruption() {
    let dir = tempfile::tempdir().unwrap();
    build_log(dir.path());
    let ok = std::process::Command::new(env!("CARGO_BIN_EXE_ringlog-broker"))
        .args(["verify-log", "--print"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.starts_with("baseOffset:"))
            .count(),
        BATCHES as usize
    );
    assert!(stdout.contains("codec: zstd") && stdout.contains("codec: none"));

    let active = segment_files(dir.path()).pop().unwrap();
    let (position, _) = batch_positions(&active)[1];
    flip(&active, position + 100);
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_ringlog-broker"))
        .args(["verify-log"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains(&format!("{} at byte {position}", active.display())),
        "{stderr}"
    );
}

const AGED: std::time::Duration = std::time::Duration::from_secs(1_000_000_000);

/// Dates every file of the directory back to `AGED`, so that one written
/// or truncated after this shows a newer modification time.
fn age_files(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let file = std::fs::File::options()
            .write(true)
            .open(entry.unwrap().path())
            .unwrap();
        file.set_modified(std::time::UNIX_EPOCH + AGED).unwrap();
    }
}

/// The files modified since `age_files`, besides the clean-shutdown marker.
fn touched_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name() != "clean-shutdown")
        .filter(|e| e.metadata().unwrap().modified().unwrap() != std::time::UNIX_EPOCH + AGED)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Opens the log after a clean close, checks it was trusted and holds
/// `end`, runs `between` on it, closes it and returns what was read.
fn reopen_close(
    dir: &Path,
    clock: &Rc<ManualClock>,
    end: Offset,
    between: impl AsyncFnOnce(&broker::log::PartitionLog),
) -> Vec<(protocol::BatchHeader, Vec<StoredRecord>)> {
    run(async {
        let log = open(dir, config(), clock).await;
        assert_eq!(log.stats().rescanned_segments, 0, "closed cleanly: trusted");
        assert_eq!(log.log_end_offset(), end);
        between(&log).await;
        let stored = read_stored(&log, 64 * 1024).await;
        log.close().await.unwrap();
        stored
    })
}

// A close that finds the log as a clean open left it rewrites none of its
// files (with thousands of partitions, that was most of a shutdown), and the
// log still opens trusted with everything in it. Any change since the open
// (an append, or producers expiring from the snapshot) seals it as before.
#[test]
fn a_log_unchanged_since_a_clean_open_closes_without_rewriting_its_files() {
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().join("t-0");
    build_log(&dir);
    let clock = Rc::new(ManualClock::new(2_000));
    let end = Offset((BATCHES as usize * RECORDS) as i64);
    age_files(&dir);
    let before = reopen_close(&dir, &clock, end, async |_| {});
    assert_eq!(
        touched_files(&dir),
        Vec::<String>::new(),
        "nothing rewritten"
    );
    assert!(dir.join("clean-shutdown").exists());
    assert_eq!(reopen_close(&dir, &clock, end, async |_| {}), before);

    // One more batch: the active segment is trimmed and synced, and its
    // indexes, the recovery point and a producer snapshot at the new end
    // are written.
    age_files(&dir);
    let after = reopen_close(&dir, &clock, end, async |log| {
        log.append(&batch(999, RECORDS, 5_000, 150), LeaderEpoch(3))
            .await
            .unwrap();
    });
    assert_eq!(after.len(), before.len() + 1);
    let new_end = Offset(end.0 + RECORDS as i64);
    let touched = touched_files(&dir);
    for name in [
        format!("{:020}.snapshot", new_end.0),
        "recovery-point".to_string(),
    ] {
        assert!(touched.contains(&name), "{name} in {touched:?}");
    }
    for suffix in ["log", INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
        assert!(
            touched.iter().any(|n| n.ends_with(&format!(".{suffix}"))),
            "{suffix} in {touched:?}"
        );
    }
    age_files(&dir);
    assert_eq!(reopen_close(&dir, &clock, new_end, async |_| {}), after);
    assert_eq!(touched_files(&dir), Vec::<String>::new());

    // A producer expires: the snapshot naming it is replaced by one that
    // does not, which the next open reads.
    let producer_batch = {
        let mut bytes = batch(1_000, 1, 6_000, 10);
        protocol::record_batch::stamp_producer(
            &mut bytes,
            protocol::ProducerId(7),
            protocol::ProducerEpoch(0),
            protocol::Sequence(0),
        );
        bytes
    };
    let with_producer = Offset(new_end.0 + 1);
    reopen_close(&dir, &clock, new_end, async |log| {
        log.append(&producer_batch, LeaderEpoch(3)).await.unwrap();
    });
    age_files(&dir);
    reopen_close(&dir, &clock, with_producer, async |log| {
        assert_eq!(log.producer_count(), 1, "from the snapshot");
        clock.set(6_000 + config().producer_id_expiration_ms + 1);
        log.maintain().await.unwrap();
        assert_eq!(log.producer_count(), 0);
    });
    let snapshot = format!("{:020}.snapshot", with_producer.0);
    assert!(touched_files(&dir).contains(&snapshot));
    reopen_close(&dir, &clock, with_producer, async |log| {
        assert_eq!(log.producer_count(), 0, "the new snapshot has none");
    });
}

// A new log that nobody wrote to closes without index files or a snapshot,
// and opens again trusted and empty.
#[test]
fn a_new_empty_log_closes_without_writing_and_reopens_trusted() {
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().join("t-0");
    let clock = Rc::new(ManualClock::new(1_000));
    run(async {
        let log = open(&dir, config(), &clock).await;
        log.close().await.unwrap();
    });
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["00000000000000000000.log", "clean-shutdown"]);
    reopen_close(&dir, &clock, Offset(0), async |log| {
        assert_eq!(log.log_start_offset(), Offset(0));
    });
    // Written to after that open: sealed in full, and read back.
    let stored = reopen_close(&dir, &clock, Offset(0), async |log| {
        log.append(&batch(1, RECORDS, 1_000, 150), LeaderEpoch(1))
            .await
            .unwrap();
    });
    assert_eq!(stored.len(), 1);
    assert!(dir.join("00000000000000000000.index").exists());
    assert_eq!(
        reopen_close(&dir, &clock, Offset(RECORDS as i64), async |_| {}),
        stored
    );
}

/// A roll's finish (padding cut, index files, recovery point, producer
/// snapshot) is maintenance's work, not the acknowledgement path's: records
/// of the next segment are acknowledged, synced, while the rolled one still
/// ends in alignment padding. A crash right then keeps every one of them, and
/// the directory verifies clean after the restart.
#[test]
fn records_after_a_roll_are_acknowledged_before_the_rolled_segment_is_finished() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Rc::new(ManualClock::new(1_000));
    let always = LogConfig {
        flush_policy: broker::log::FlushPolicy::Always,
        ..config()
    };
    let acked_end = run(async {
        let log = open(dir.path(), always.clone(), &clock).await;
        let mut tag = 0;
        let mut append = async || {
            tag += 1;
            let info = log
                .append(&batch(tag, RECORDS, 1_000, 150), LeaderEpoch(1))
                .await
                .unwrap();
            log.wait_for_ack(info.log_end_offset).await.unwrap();
            info.log_end_offset
        };
        while log.segment_count() < 2 {
            append().await;
        }
        let end = append().await;
        let bases = log.segment_bases();
        assert!(
            !segment_path(dir.path(), bases[0], INDEX_SUFFIX).exists(),
            "the rolled segment was finished before the next one's records were acknowledged"
        );
        assert!(log.recovery_point() <= bases[0]);
        drop(log);
        end
    });
    let files = segment_files(dir.path());
    assert_eq!(files.len(), 2);
    let rolled = &files[0];
    let data_bytes = {
        let positions = batch_positions_within(rolled);
        positions.last().copied().unwrap()
    };
    let file_bytes = std::fs::metadata(rolled).unwrap().len();
    assert!(
        file_bytes > data_bytes,
        "the rolled segment still ends in padding ({file_bytes} bytes, {data_bytes} of data)"
    );
    simulate_crash(dir.path());

    let (start, end, bases) = reopen_and_read(dir.path());
    assert_eq!((start, end), (Offset(0), acked_end));
    assert_eq!(bases, all_bases_below(acked_end.0));
    assert_eq!(std::fs::metadata(rolled).unwrap().len(), data_bytes);
    let report = verify(dir.path());
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert!(
        report.missing_indexes.is_empty(),
        "{:?}",
        report.missing_indexes
    );
}

/// Maintenance finishes a rolled segment: its padding is cut, its index
/// files are written and the recovery point passes it.
#[test]
fn maintenance_finishes_a_rolled_segment() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Rc::new(ManualClock::new(1_000));
    run(async {
        let log = open(dir.path(), config(), &clock).await;
        let mut tag = 0;
        while log.segment_count() < 2 {
            tag += 1;
            let info = log
                .append(&batch(tag, RECORDS, 1_000, 150), LeaderEpoch(1))
                .await
                .unwrap();
            log.wait_for_ack(info.log_end_offset).await.unwrap();
        }
        let bases = log.segment_bases();
        assert!(log.maintenance_due(1_000));
        log.maintain().await.unwrap();
        assert!(segment_path(dir.path(), bases[0], INDEX_SUFFIX).exists());
        assert!(segment_path(dir.path(), bases[0], TIME_INDEX_SUFFIX).exists());
        assert!(log.recovery_point() >= bases[1]);
        let rolled = segment_path(dir.path(), bases[0], LOG_SUFFIX);
        let data_bytes = batch_positions_within(&rolled).last().copied().unwrap();
        assert_eq!(std::fs::metadata(&rolled).unwrap().len(), data_bytes);
        log.close().await.unwrap();
    });
}

/// End positions of the whole batches at the start of a segment file,
/// stopping at the first bytes that are not one (padding).
fn batch_positions_within(path: &Path) -> Vec<u64> {
    let bytes = std::fs::read(path).unwrap();
    let mut ends = vec![0];
    let mut at = 0;
    while let Ok((_, used)) = RecordBatch::parse_prefix(&bytes[at..], 1 << 20) {
        at += used;
        ends.push(at as u64);
    }
    ends
}

/// The active segment's file is extended with allocated space ahead of its
/// writes, so it reads as zeros past the data. A crash leaves that space:
/// the restart cuts it after the last whole batch and keeps every
/// acknowledged record; a clean close trims it, and the next open trusts
/// the file as it is.
#[test]
fn space_allocated_ahead_of_the_writes_is_cut_after_a_crash_and_trimmed_at_close() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Rc::new(ManualClock::new(1_000));
    let big = LogConfig {
        flush_policy: broker::log::FlushPolicy::Always,
        segment_size_bytes: 8 << 20,
        ..small_config()
    };
    let batches = 40;
    let acked_end = run(async {
        let log = open(dir.path(), big.clone(), &clock).await;
        let mut end = Offset(0);
        for tag in 0..batches {
            let info = log
                .append(&batch(tag, RECORDS, 1_000, 150), LeaderEpoch(1))
                .await
                .unwrap();
            log.wait_for_ack(info.log_end_offset).await.unwrap();
            end = info.log_end_offset;
        }
        assert!(log.stats().preallocations > 0, "{:?}", log.stats());
        assert_eq!(log.segment_count(), 1);
        drop(log);
        end
    });
    let active = segment_path(dir.path(), Offset(0), LOG_SUFFIX);
    let data_bytes = *batch_positions_within(&active).last().unwrap();
    let file_bytes = std::fs::metadata(&active).unwrap().len();
    assert!(
        file_bytes >= data_bytes + 32 * 1024,
        "space allocated past the data ({file_bytes} bytes, {data_bytes} of data)"
    );
    simulate_crash(dir.path());

    let reopened_end = run(async {
        let log = open(dir.path(), big.clone(), &clock).await;
        assert_eq!(log.log_end_offset(), acked_end);
        let fetched = log.read(Offset(0), 16 << 20, acked_end).await.unwrap();
        let bases: Vec<i64> = decode(&fetched.bytes).into_iter().map(|(b, _)| b).collect();
        let expected: Vec<i64> = (0..batches as i64).map(|t| t * RECORDS as i64).collect();
        assert_eq!(bases, expected);
        assert_eq!(std::fs::metadata(&active).unwrap().len(), data_bytes);
        // More appends allocate ahead again; the clean close trims it.
        let info = log
            .append(&batch(batches, RECORDS, 1_000, 150), LeaderEpoch(1))
            .await
            .unwrap();
        log.wait_for_ack(info.log_end_offset).await.unwrap();
        assert!(std::fs::metadata(&active).unwrap().len() > data_bytes + 4096);
        log.close().await.unwrap();
        info.log_end_offset
    });
    let closed_bytes = std::fs::metadata(&active).unwrap().len();
    assert_eq!(
        closed_bytes,
        *batch_positions_within(&active).last().unwrap()
    );
    run(async {
        let log = open(dir.path(), big.clone(), &clock).await;
        assert_eq!(log.stats().rescanned_segments, 0, "closed cleanly: trusted");
        assert_eq!(log.log_end_offset(), reopened_end);
        log.close().await.unwrap();
    });
    let report = verify(dir.path());
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

/// The tail of a segment lost in a crash (its writes never synced) comes back
/// from a shard journal replayed at start: the log recovers every batch,
/// where the same loss without the journal leaves only the batches before it.
#[test]
fn a_journal_replayed_at_start_restores_a_tail_the_segment_lost() {
    use broker::log::journal::{JournalSeq, RecordSpec, RingWriter, JOURNAL_BLOCK_BYTES};
    use broker::log::journal_replay::{replay_journals, JOURNAL_DIR, JOURNAL_SUFFIX};

    let lose_tail = |data: &Path| -> (PathBuf, i64, u64, Vec<u8>) {
        let dir = data.join("topics").join("t-0");
        std::fs::create_dir_all(&dir).unwrap();
        build_log(&dir);
        let active = segment_files(&dir).pop().unwrap();
        let bytes = std::fs::read(&active).unwrap();
        let positions = batch_positions(&active);
        let base = positions[0].1;
        let cut = positions[positions.len() / 2].0 / JOURNAL_BLOCK_BYTES * JOURNAL_BLOCK_BYTES;
        let mut chunk = bytes[cut as usize..].to_vec();
        chunk.resize(
            chunk.len().next_multiple_of(JOURNAL_BLOCK_BYTES as usize),
            0,
        );
        cut_file(&active, cut);
        // The clean-shutdown marker stays: replay must take it away.
        // The recovery point only ever vouches for what the segment files
        // hold synced, never for what only the journal holds.
        let _ = std::fs::remove_file(dir.join("recovery-point"));
        (dir, base, cut, chunk)
    };

    let without = tempfile::tempdir().unwrap();
    let (dir, _, _, _) = lose_tail(without.path());
    simulate_crash(&dir);
    let (_, lost_end, _) = reopen_and_read(&dir);

    let with = tempfile::tempdir().unwrap();
    let (dir, base, cut, chunk) = lose_tail(with.path());
    let journal_dir = with.path().join(JOURNAL_DIR);
    std::fs::create_dir_all(&journal_dir).unwrap();
    let mut ring = RingWriter::new(64 * 1024, JournalSeq(1), 0x1d).unwrap();
    let mut image = vec![0u8; 64 * 1024];
    image[..JOURNAL_BLOCK_BYTES as usize].copy_from_slice(&ring.header().encode_block(None));
    let round = ring
        .round(&[RecordSpec::write("t-0", Offset(base), cut, &chunk)])
        .unwrap();
    let at = round.position as usize;
    image[at..at + round.bytes.len()].copy_from_slice(&round.bytes);
    std::fs::write(journal_dir.join(format!("shard-0.{JOURNAL_SUFFIX}")), image).unwrap();

    let report = replay_journals(with.path()).unwrap();
    assert_eq!(report.writes, 1);
    assert!(
        !dir.join("clean-shutdown").exists(),
        "a log replay wrote into is rescanned"
    );
    let (start, end, bases) = reopen_and_read(&dir);
    let full_end = (BATCHES * RECORDS as u64) as i64;
    assert!(
        lost_end.0 < full_end,
        "the cut lost batches without the journal"
    );
    assert_eq!((start, end), (Offset(0), Offset(full_end)));
    assert_eq!(bases, all_bases_below(full_end));
    let verified = verify(&dir);
    assert!(verified.problems.is_empty(), "{:?}", verified.problems);
}

/// The shard journal `shard-0` of the data dir `data`, a 4 MiB ring.
async fn journal_in(data: &Path) -> Rc<broker::log::shard_journal::ShardJournal> {
    let dir = data.join(broker::log::journal_replay::JOURNAL_DIR);
    broker::log::shard_journal::ShardJournal::open(&dir, "shard-0", 4 << 20)
        .await
        .unwrap()
}

/// The log in `dir` under `config()`, its commits through `journal`.
async fn journaled_log(
    dir: &Path,
    journal: &Rc<broker::log::shard_journal::ShardJournal>,
) -> Rc<broker::log::PartitionLog> {
    let clock = Rc::new(ManualClock::new(1_000));
    let log = open(dir, config(), &clock).await;
    log.attach_journal(journal.clone()).await.unwrap();
    log
}

/// Appends `bytes` (epoch 3) and waits for its acknowledgement.
async fn append_acked(log: &broker::log::PartitionLog, bytes: &[u8]) -> broker::log::AppendInfo {
    let info = log.append(bytes, LeaderEpoch(3)).await.unwrap();
    log.wait_for_ack(info.log_end_offset).await.unwrap();
    info
}

/// Every segment file of `dir`, by name, with its size now.
fn segment_sizes(dir: &Path) -> Vec<(PathBuf, u64)> {
    segment_files(dir)
        .into_iter()
        .map(|path| {
            let len = std::fs::metadata(&path).unwrap().len();
            (path, len)
        })
        .collect()
}

/// A power loss that lost every write since `synced` (the segment files'
/// sizes when everything was last synced): files are cut back to those
/// sizes, and files made since lose every byte.
fn lose_writes_since(dir: &Path, synced: &[(PathBuf, u64)]) {
    for path in segment_files(dir) {
        let len = synced
            .iter()
            .find(|(p, _)| *p == path)
            .map_or(0, |(_, len)| *len);
        cut_file(&path, len);
    }
}

/// The tag of each batch of the log in `dir`, by base offset, after a
/// reopen, and its end.
fn tags_after_reopen(dir: &Path) -> (Vec<(i64, u64)>, Offset) {
    run(async {
        let clock = Rc::new(ManualClock::new(1_000));
        let log = open(dir, config(), &clock).await;
        let end = log.log_end_offset();
        let mut next = log.log_start_offset();
        let mut tags = Vec::new();
        while next < end {
            let fetched = log.read(next, 1 << 20, end).await.unwrap();
            tags.extend(decode(&fetched.bytes).into_iter().map(|(base, values)| {
                let value = String::from_utf8_lossy(&values[0]).into_owned();
                let tag = value.split(':').next().unwrap().parse().unwrap();
                (base, tag)
            }));
            next = fetched.next_offset;
        }
        log.close().await.unwrap();
        (tags, end)
    })
}

/// Under `always` with a shard journal attached, an acknowledgement waits
/// for the journal's round, not for a sync of the segment files: a power
/// loss may take every byte the files were given since the log opened, and
/// the replay at start brings each acknowledged batch back. Without the
/// replay the same loss empties the log.
#[test]
fn acks_through_the_journal_survive_the_loss_of_every_unsynced_segment_byte() {
    use broker::log::journal_replay::{replay_journals, JOURNAL_DIR};

    let run_and_lose = |data: &Path| -> PathBuf {
        let dir = data.join("topics").join("t-0");
        let (data, log_dir) = (data.to_path_buf(), dir.clone());
        run(async move {
            let log = journaled_log(&log_dir, &journal_in(&data).await).await;
            for tag in 0..BATCHES {
                let info = log
                    .append(
                        &batch(tag, RECORDS, 1_000 + tag as i64, 150),
                        LeaderEpoch(3),
                    )
                    .await
                    .unwrap();
                log.wait_for_ack(info.log_end_offset).await.unwrap();
            }
            let stats = log.stats();
            assert!(stats.journal_commits > 0, "{stats:?}");
            assert_eq!(stats.data_syncs, 0, "no segment file was synced for an ack");
            assert!(segment_files(&log_dir).len() > 2, "the log rolled");
            // Dropped unclosed: a crash. Nothing was synced since the open
            // (no rolled segment was finished, the ring never checkpointed).
        });
        lose_writes_since(&dir, &[]);
        dir
    };

    let without = tempfile::tempdir().unwrap();
    let dir = run_and_lose(without.path());
    std::fs::remove_dir_all(without.path().join(JOURNAL_DIR)).unwrap();
    let (tags, end) = tags_after_reopen(&dir);
    assert!(
        tags.is_empty() && end == Offset(0),
        "the loss empties the log"
    );

    let with = tempfile::tempdir().unwrap();
    let dir = run_and_lose(with.path());
    let report = replay_journals(with.path()).unwrap();
    assert!(report.writes > 0);
    let (tags, end) = tags_after_reopen(&dir);
    let want: Vec<(i64, u64)> = (0..BATCHES)
        .map(|t| (t as i64 * RECORDS as i64, t))
        .collect();
    assert_eq!(tags, want);
    assert_eq!(end, Offset(BATCHES as i64 * RECORDS as i64));
    let verified = verify(&dir);
    assert!(verified.problems.is_empty(), "{:?}", verified.problems);
}

/// A truncation fences the log's journal records after syncing what it
/// keeps: a replay after a later crash never writes the cut batches' images
/// back (which would bring back records a follower cut as divergent), and
/// writes back what was acknowledged after the cut.
#[test]
fn a_truncation_fences_the_journal_so_a_replay_never_brings_cut_batches_back() {
    use broker::log::journal_replay::replay_journals;

    let cut = Offset((BATCHES / 2) as i64 * RECORDS as i64);
    // Crashed right after the cut, then with a few batches acknowledged after it.
    for later in [0u64, 3] {
        let data = tempfile::tempdir().unwrap();
        let dir = data.path().join("topics").join("t-0");
        let (data_path, log_dir) = (data.path().to_path_buf(), dir.clone());
        let synced = run(async move {
            let log = journaled_log(&log_dir, &journal_in(&data_path).await).await;
            let ack = |tag: u64| {
                let log = log.clone();
                async move {
                    let info = log
                        .append(
                            &batch(tag, RECORDS, 1_000 + tag as i64, 150),
                            LeaderEpoch(3),
                        )
                        .await
                        .unwrap();
                    log.wait_for_ack(info.log_end_offset).await.unwrap();
                }
            };
            for tag in 0..BATCHES {
                ack(tag).await;
            }
            assert_eq!(log.truncate_to(cut).await.unwrap(), cut);
            // Everything the log keeps is synced now.
            let synced = segment_sizes(&log_dir);
            // New batches over the cut ones' offsets, tagged apart from them.
            for tag in 1_000..1_000 + later {
                ack(tag).await;
            }
            synced
        });
        lose_writes_since(&dir, &synced);
        replay_journals(data.path()).unwrap();
        let (tags, end) = tags_after_reopen(&dir);
        let want: Vec<(i64, u64)> = (0..BATCHES / 2)
            .chain(1_000..1_000 + later)
            .enumerate()
            .map(|(i, t)| (i as i64 * RECORDS as i64, t))
            .collect();
        assert_eq!(tags, want, "{later} batches after the cut");
        assert_eq!(end, Offset((BATCHES / 2 + later) as i64 * RECORDS as i64));
        let verified = verify(&dir);
        assert!(verified.problems.is_empty(), "{:?}", verified.problems);
    }
}

/// A rolled segment sealed (synced) before any commit handed its last page
/// to the journal, while an older image of that page is there: the seal
/// fences the segment's records, or a replay would write the old page over
/// records the seal made durable and acknowledged.
#[test]
fn a_seal_fences_older_page_images_the_journal_still_holds() {
    use broker::log::journal_replay::replay_journals;

    let data = tempfile::tempdir().unwrap();
    let dir = data.path().join("topics").join("t-0");
    let (data_path, log_dir) = (data.path().to_path_buf(), dir.clone());
    let (r2_base, r2_tag) = run(async move {
        let log = journaled_log(&log_dir, &journal_in(&data_path).await).await;
        let small = |tag: u64| batch(tag, 1, 1_000 + tag as i64, 20);
        let segment_bytes = config().segment_size_bytes;
        let mut tag = 0;
        // Acknowledged one by one (each commit journals the last page)
        // until the segment is nearly full.
        while log.size_bytes() + 4 * (small(tag).len() as u64) < segment_bytes {
            append_acked(&log, &small(tag)).await;
            tag += 1;
        }
        // r2 joins the last page, unacknowledged; then appends roll.
        let r2 = log.append(&small(tag), LeaderEpoch(3)).await.unwrap();
        let r2_tag = tag;
        while log.segment_count() < 2 {
            tag += 1;
            log.append(&small(tag), LeaderEpoch(3)).await.unwrap();
        }
        // Writes everything and finishes the rolled segment, then cuts
        // nothing: no commit ran since r2 joined the page.
        let cut = log
            .truncate_to_if(Offset(0), Rc::new(|| false))
            .await
            .unwrap();
        assert_eq!(cut, None);
        assert!(
            log.durable_offset() >= r2.log_end_offset,
            "the seal made r2 durable"
        );
        log.wait_for_ack(r2.log_end_offset).await.unwrap();
        (r2.base_offset.0, r2_tag)
        // Dropped unclosed: a crash.
    });
    replay_journals(data.path()).unwrap();
    let (tags, _) = tags_after_reopen(&dir);
    assert!(
        tags.contains(&(r2_base, r2_tag)),
        "acknowledged batch {r2_tag} at {r2_base} lost: {tags:?}"
    );
    let verified = verify(&dir);
    assert!(verified.problems.is_empty(), "{:?}", verified.problems);
}

/// A log removed without a close (say its close failed) and made again
/// under the same name in the same run: opening it fences the earlier log's
/// records, or a replay after a crash would write them into the new log's
/// files, where batches of the same sizes and offsets pass every check.
#[test]
fn a_log_made_again_under_its_name_fences_the_earlier_logs_records() {
    use broker::log::journal_replay::{replay_journals, JOURNAL_DIR};
    use broker::log::shard_journal::ShardJournal;

    let data = tempfile::tempdir().unwrap();
    let dir = data.path().join("topics").join("t-0");
    let (data_path, log_dir) = (data.path().to_path_buf(), dir.clone());
    // Uncompressed (even tags), all the same size, four to a page: the new
    // log's last page is then whole, and the earlier log's later pages
    // follow it at the offsets the new log would give them next.
    let value_bytes = (100..2_000)
        .find(|v| batch(0, 1, 1_000, *v).len() == 1024 && batch(200, 1, 1_000, *v).len() == 1024)
        .expect("a value size makes a 1 KiB batch");
    let uniform = move |tag: u64| batch(tag * 2, 1, 1_000, value_bytes);
    run(async move {
        let journal = ShardJournal::open(&data_path.join(JOURNAL_DIR), "shard-0", 4 << 20)
            .await
            .unwrap();
        let clock = Rc::new(ManualClock::new(1_000));
        for (first, count) in [(0u64, 10u64), (100, 4)] {
            let log = open(&log_dir, config(), &clock).await;
            log.attach_journal(journal.clone()).await.unwrap();
            for tag in first..first + count {
                append_acked(&log, &uniform(tag)).await;
            }
            // Gone without a close, then made again.
            drop(log);
            if first == 0 {
                std::fs::remove_dir_all(&log_dir).unwrap();
            }
        }
    });
    replay_journals(data.path()).unwrap();
    let (tags, end) = tags_after_reopen(&dir);
    let want: Vec<(i64, u64)> = (100..104u64)
        .enumerate()
        .map(|(i, t)| (i as i64, t * 2))
        .collect();
    assert_eq!(tags, want);
    assert_eq!(end, Offset(4));
}

/// A log leaves `always` while a chunk written under it was never handed
/// to the journal, which holds an older image of its page: an
/// acknowledgement under the new policy (the write alone) waits for a sync
/// and a fence first, or a replay after a kill would write the old page
/// over the acknowledged batch.
#[test]
fn leaving_always_fences_the_journal_before_the_next_acknowledgement() {
    use broker::log::journal_replay::replay_journals;
    use broker::log::FlushPolicy;

    let data = tempfile::tempdir().unwrap();
    let dir = data.path().join("topics").join("t-0");
    let (data_path, log_dir) = (data.path().to_path_buf(), dir.clone());
    let (last_base, last_tag) = run(async move {
        let log = journaled_log(&log_dir, &journal_in(&data_path).await).await;
        let small = |tag: u64| batch(tag, 1, 1_000 + tag as i64, 20);
        for tag in 0..3 {
            append_acked(&log, &small(tag)).await;
        }
        // Written (its page's newer image), not committed, then the policy changes.
        let last = log.append(&small(3), LeaderEpoch(3)).await.unwrap();
        log.write_to(last.log_end_offset).await.unwrap();
        log.set_config(LogConfig {
            flush_policy: FlushPolicy::None,
            ..config()
        })
        .unwrap();
        log.wait_for_ack(last.log_end_offset).await.unwrap();
        (last.base_offset.0, 3)
        // Dropped unclosed: a kill -9, the page cache keeps every write.
    });
    replay_journals(data.path()).unwrap();
    let (tags, _) = tags_after_reopen(&dir);
    assert!(
        tags.contains(&(last_base, last_tag)),
        "acknowledged batch {last_tag} at {last_base} lost: {tags:?}"
    );
}

/// Retention hands removed segment files to the shard's releaser, which
/// empties them in steps after their names are gone: nothing it truncates
/// may be a file the log still reads. Appends interleaved with retention
/// passes (and rolls) under `always`, every removed file emptied, then a
/// reopen reads back every batch past the log start from disk, and
/// `verify-log` passes.
#[test]
fn space_released_after_retention_takes_nothing_the_log_keeps() {
    use broker::log::space_release::SpaceReleaser;
    use broker::log::FlushPolicy;
    use std::time::Duration;

    let data = tempfile::tempdir().unwrap();
    let dir = data.path().join("topics").join("t-0");
    let log_dir = dir.clone();
    let kept = run(async move {
        let clock = Rc::new(ManualClock::new(1_000));
        let config = LogConfig {
            // Larger than a release step, so each removed file is held.
            segment_size_bytes: 5 << 20,
            retention_bytes: Some(12 << 20),
            flush_policy: FlushPolicy::Always,
            ..small_config()
        };
        let log = open(&log_dir, config, &clock).await;
        let releaser = SpaceReleaser::start(64 << 20);
        log.release_space_through(releaser.clone());
        let mut acked = Vec::new();
        for n in 0..240u64 {
            // Even tags: uncompressed, about 128 KB each.
            let tag = n * 2;
            let info = append_acked(&log, &batch(tag, 16, 1_000 + n as i64, 8_000)).await;
            acked.push((info.base_offset.0, tag));
            if n % 60 == 59 {
                // Rolled segments are finished (closed) by then.
                log.flush().await.unwrap();
                log.enforce_retention(log.log_end_offset()).await.unwrap();
            }
        }
        let mut waited_ms = 0;
        while releaser.stats().pending_bytes > 0 {
            assert!(waited_ms < 30_000, "{:?}", releaser.stats());
            broker::runtime::sleep(Duration::from_millis(10)).await;
            waited_ms += 10;
        }
        assert!(
            releaser.stats().released_files >= 2,
            "{:?}",
            releaser.stats()
        );
        let start = log.log_start_offset().0;
        assert!(start > 0, "retention removed segments");
        log.close().await.unwrap();
        acked
            .into_iter()
            .filter(|(base, _)| *base >= start)
            .collect::<Vec<_>>()
    });
    let (tags, end) = tags_after_reopen(&dir);
    assert_eq!(end, Offset(240 * 16));
    assert_eq!(tags, kept);
    let verified = verify(&dir);
    assert!(verified.problems.is_empty(), "{:?}", verified.problems);
}

/// Once the shard's journal has failed (its ring cannot be written), a log
/// it holds records of fails its acknowledgements until a restart replays
/// them, but a log it holds nothing of commits by syncing its own files,
/// and what it acknowledged is read back from disk after a reopen.
#[test]
fn a_log_the_failed_journal_holds_nothing_of_still_commits_by_syncing_its_files() {
    let data = tempfile::tempdir().unwrap();
    let (dir_a, dir_b) = (
        data.path().join("topics").join("a-0"),
        data.path().join("topics").join("b-0"),
    );
    let (data_path, log_a, log_b) = (data.path().to_path_buf(), dir_a.clone(), dir_b.clone());
    let (acked_base, acked_tag) = run(async move {
        let journal = journal_in(&data_path).await;
        let a = journaled_log(&log_a, &journal).await;
        append_acked(&a, &batch(1, 1, 1_000, 20)).await;
        let _immutable = Immutable::new(journal.path());
        let info = a
            .append(&batch(2, 1, 1_001, 20), LeaderEpoch(3))
            .await
            .unwrap();
        assert!(
            a.wait_for_ack(info.log_end_offset).await.is_err(),
            "acknowledged through a ring that cannot be written"
        );
        assert!(journal.is_failed());
        let b = journaled_log(&log_b, &journal).await;
        let acked = append_acked(&b, &batch(3, 1, 1_002, 20)).await;
        b.close().await.unwrap();
        (acked.base_offset.0, 3)
    });
    let (tags, _) = tags_after_reopen(&dir_b);
    assert_eq!(tags, vec![(acked_base, acked_tag)]);
    let verified = verify(&dir_b);
    assert!(verified.problems.is_empty(), "{:?}", verified.problems);
}

/// A log that leaves `always` while the journal may hold older images of
/// pages it wrote owes a fence before its next acknowledgement; if the
/// fence cannot be written (the journal failed), every later wait for that
/// acknowledgement fails too, not only the first: the sync before the
/// fence must not pass for it.
#[test]
fn a_fence_that_failed_is_still_owed() {
    use broker::log::FlushPolicy;

    let data = tempfile::tempdir().unwrap();
    let dir = data.path().join("topics").join("t-0");
    let (data_path, log_dir) = (data.path().to_path_buf(), dir.clone());
    run(async move {
        let journal = journal_in(&data_path).await;
        let log = journaled_log(&log_dir, &journal).await;
        append_acked(&log, &batch(0, 1, 1_000, 20)).await;
        let last = log
            .append(&batch(1, 1, 1_001, 20), LeaderEpoch(3))
            .await
            .unwrap();
        log.write_to(last.log_end_offset).await.unwrap();
        let _immutable = Immutable::new(journal.path());
        log.set_config(LogConfig {
            flush_policy: FlushPolicy::None,
            ..config()
        })
        .unwrap();
        for attempt in 0..2 {
            assert!(
                log.wait_for_ack(last.log_end_offset).await.is_err(),
                "attempt {attempt}: acknowledged without the fence it owes"
            );
        }
    });
}
