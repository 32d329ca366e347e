//! Durability of the Raft stores across reopen: entries, vote, truncation and
//! purge survive; a torn or corrupt tail is cut at the first bad frame; snapshots
//! restore the cluster state.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use controller::state::StateLimits;
use controller::store::{self, LogStore, StateMachineStore, TypeConfig};
use controller::{BrokerId, Command};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::testing::log_id;
use openraft::{Entry, EntryPayload, RaftLogReader, RaftSnapshotBuilder, Vote};
use tempfile::TempDir;

fn entry(term: u64, index: u64, command: Option<Command>) -> Entry<TypeConfig> {
    let payload = match command {
        Some(c) => EntryPayload::Normal(c),
        None => EntryPayload::Blank,
    };
    Entry {
        log_id: log_id(term, 0, index),
        payload,
    }
}

fn register(id: u32) -> Command {
    Command::RegisterBroker {
        broker_id: BrokerId(id),
        endpoints: crate::support::endpoints(id, 2),
        now_ms: 0,
        session_timeout_ms: 1_000,
        incarnation_id: 0,
    }
}

fn open_log(dir: &Path) -> (LogStore, store::LogRecovery) {
    LogStore::open(dir).expect("open log")
}

async fn append_blank(log: &mut LogStore, term: u64, indexes: std::ops::RangeInclusive<u64>) {
    let entries: Vec<_> = indexes.map(|i| entry(term, i, None)).collect();
    log.blocking_append(entries).await.expect("append");
}

// Appended entries, the vote, a truncation and a purge all survive a reopen.
#[tokio::test]
async fn log_and_vote_survive_reopen() {
    let dir = TempDir::new().expect("tempdir");
    {
        let (mut log, _) = open_log(dir.path());
        append_blank(&mut log, 1, 1..=10).await;
        log.save_vote(&Vote::new(3, 7)).await.expect("vote");
        log.truncate(log_id(1, 0, 8)).await.expect("truncate");
        log.purge(log_id(1, 0, 3)).await.expect("purge");
        append_blank(&mut log, 2, 8..=9).await;
    }
    let (mut log, recovery) = open_log(dir.path());
    assert_eq!(recovery.torn_bytes_truncated, 0);
    assert_eq!(log.summary(), ((4..=9).collect(), Some(log_id(1, 0, 3))));
    assert_eq!(log.read_vote().await.expect("vote"), Some(Vote::new(3, 7)));
    let state = log.get_log_state().await.expect("state");
    assert_eq!(state.last_log_id, Some(log_id(2, 0, 9)));
    let entries = log.try_get_log_entries(7..9).await.expect("read");
    assert_eq!(
        entries.iter().map(|e| e.log_id).collect::<Vec<_>>(),
        vec![log_id(1, 0, 7), log_id(2, 0, 8)]
    );
}

// A crash mid-write leaves a partial last frame; opening cuts it off, keeps every
// earlier entry, and later appends land after the cut.
#[tokio::test]
async fn torn_tail_is_truncated_on_open() {
    for cut_bytes in [1_u64, 5, 9, 20] {
        let dir = TempDir::new().expect("tempdir");
        let path = {
            let (mut log, _) = open_log(dir.path());
            append_blank(&mut log, 1, 1..=5).await;
            log.log_file_path()
        };
        let length = std::fs::metadata(&path).expect("stat").len();
        OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open")
            .set_len(length - cut_bytes)
            .expect("cut");

        let (mut log, recovery) = open_log(dir.path());
        assert!(recovery.torn_bytes_truncated > 0, "cut {cut_bytes}");
        assert_eq!(log.summary().0, vec![1, 2, 3, 4], "cut {cut_bytes}");
        append_blank(&mut log, 1, 5..=6).await;
        drop(log);
        let (log, recovery) = open_log(dir.path());
        assert_eq!(recovery.torn_bytes_truncated, 0);
        assert_eq!(log.summary().0, vec![1, 2, 3, 4, 5, 6]);
    }
}

// Garbage after the last complete frame (a bad CRC) is cut off the same way.
#[tokio::test]
async fn corrupt_tail_is_truncated_on_open() {
    let dir = TempDir::new().expect("tempdir");
    let path = {
        let (mut log, _) = open_log(dir.path());
        append_blank(&mut log, 1, 1..=3).await;
        log.log_file_path()
    };
    let mut file = OpenOptions::new().append(true).open(&path).expect("open");
    file.write_all(&[
        16, 0, 0, 0, 1, 2, 3, 4, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ])
    .expect("write garbage");
    drop(file);
    let (log, recovery) = open_log(dir.path());
    assert_eq!(recovery.torn_bytes_truncated, 24);
    assert_eq!(log.summary().0, vec![1, 2, 3]);
}

// Many purges rewrite the file down to the live entries, and the result reopens
// to the same log.
#[tokio::test]
async fn purges_compact_the_log_file() {
    let dir = TempDir::new().expect("tempdir");
    let path = {
        let (mut log, _) = open_log(dir.path());
        for round in 0..20_u64 {
            append_blank(&mut log, 1, round * 10 + 1..=round * 10 + 10).await;
            log.purge(log_id(1, 0, round * 10 + 5))
                .await
                .expect("purge");
        }
        log.log_file_path()
    };
    let (log, _) = open_log(dir.path());
    assert_eq!(
        log.summary(),
        ((196..=200).collect(), Some(log_id(1, 0, 195)))
    );
    let length = std::fs::metadata(&path).expect("stat").len();
    assert!(length < 10_000, "log file not compacted: {length} bytes");
}

// A built snapshot is durable: reopening the state machine restores the state and
// the last applied log id from it.
#[tokio::test]
async fn snapshot_restores_state_after_reopen() {
    let dir = TempDir::new().expect("tempdir");
    let version = {
        let mut sm = StateMachineStore::open(dir.path(), StateLimits::default()).expect("open");
        let replies = sm
            .apply([
                entry(1, 1, Some(register(1))),
                entry(1, 2, Some(register(2))),
                entry(1, 3, None),
            ])
            .await
            .expect("apply");
        assert_eq!(replies.len(), 3);
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("snapshot");
        sm.with_state(|s| s.metadata_version())
    };
    let (_, mut sm, _) = store::open(dir.path(), StateLimits::default()).expect("reopen");
    assert_eq!(
        sm.applied_state().await.expect("applied").0,
        Some(log_id(1, 0, 3))
    );
    assert_eq!(
        sm.with_state(|s| (s.metadata_version(), s.brokers().count())),
        (version, 2)
    );
    assert!(sm.get_current_snapshot().await.expect("snapshot").is_some());
}
