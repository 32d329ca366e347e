//! `StateMachineStore`: applies committed Raft entries to the pure `ClusterState`
//! and keeps its durable snapshot. Implements openraft's `RaftStateMachine`.
//!
//! The state lives in memory and is made durable only by snapshots: after a
//! restart it is loaded from the last snapshot and openraft re-applies the
//! committed entries after it from the log.
//!
//! `snapshot.bin`: magic `RLSNAP01`, a frame with the `SnapshotMeta` (JSON), a
//! frame with the snapshot data: `SnapshotData` as JSON, which is also the exact
//! byte stream openraft sends to followers. Replaced atomically.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::RaftStateMachine;
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, Snapshot,
    SnapshotMeta, StorageError, StoredMembership,
};
use serde::{Deserialize, Serialize};

use crate::command::{Outcome, Reply};
use crate::state::{ClusterState, StateLimits};
use crate::store::error::StoreError;
use crate::store::frame::{self, MAGIC_BYTES};
use crate::store::full_disk::{retry_while_full, RoomWait};
use crate::store::TypeConfig;

const SNAPSHOT_FILE_NAME: &str = "snapshot.bin";
const SNAPSHOT_MAGIC: &[u8; MAGIC_BYTES] = b"RLSNAP01";

/// The snapshot payload: the whole state machine.
#[derive(Debug, Serialize, Deserialize)]
struct SnapshotData {
    last_applied_log_id: Option<LogId<u64>>,
    last_membership: StoredMembership<u64, BasicNode>,
    state: ClusterState,
}

#[derive(Clone, Debug)]
struct StoredSnapshot {
    meta: SnapshotMeta<u64, BasicNode>,
    data: Vec<u8>,
}

/// Cheap to clone: clones share one state machine. openraft uses a clone as the
/// snapshot builder.
#[derive(Clone, Debug)]
pub struct StateMachineStore {
    inner: Arc<Mutex<StateMachineInner>>,
    /// Shared with the node's log store (`store::open`).
    pub(crate) room: RoomWait,
}

#[derive(Debug)]
struct StateMachineInner {
    snapshot_path: PathBuf,
    state: ClusterState,
    last_applied_log_id: Option<LogId<u64>>,
    last_membership: StoredMembership<u64, BasicNode>,
    current_snapshot: Option<StoredSnapshot>,
    /// Makes snapshot ids unique within this process.
    snapshot_sequence: u64,
}

impl StateMachineStore {
    /// Opens the state machine in `dir`, restored from its snapshot if there is one,
    /// else empty with `limits` (which must be the same on every controller).
    pub fn open(dir: &Path, limits: StateLimits) -> Result<StateMachineStore, StoreError> {
        std::fs::create_dir_all(dir).map_err(StoreError::io("create dir", dir))?;
        let snapshot_path = dir.join(SNAPSHOT_FILE_NAME);
        let mut inner = StateMachineInner {
            snapshot_path,
            state: ClusterState::new(limits),
            last_applied_log_id: None,
            last_membership: StoredMembership::default(),
            current_snapshot: None,
            snapshot_sequence: 0,
        };
        if let Some(frames) = frame::read_whole(&inner.snapshot_path, SNAPSHOT_MAGIC, 2)? {
            let path = &inner.snapshot_path;
            let meta: SnapshotMeta<u64, BasicNode> = serde_json::from_slice(&frames[0])
                .map_err(|e| StoreError::corrupt(path, e.to_string()))?;
            let snapshot = StoredSnapshot {
                meta,
                data: frames[1].clone(),
            };
            inner.install(snapshot, false)?;
        }
        Ok(StateMachineStore {
            inner: Arc::new(Mutex::new(inner)),
            room: RoomWait::default(),
        })
    }

    /// The process stops: a write of this node's stores waiting for room on
    /// a full disk fails now (openraft then stops its core), so the shutdown
    /// does not wait for the disk.
    pub fn stop_waiting_for_room(&self) {
        self.room.give_up();
    }

    fn lock(&self) -> MutexGuard<'_, StateMachineInner> {
        self.inner
            .lock()
            .expect("state machine mutex poisoned by a panic")
    }

    /// Runs `f` on the current state: how a controller answers metadata reads.
    pub fn with_state<T>(&self, f: impl FnOnce(&ClusterState) -> T) -> T {
        f(&self.lock().state)
    }

    pub fn last_applied_log_id(&self) -> Option<LogId<u64>> {
        self.lock().last_applied_log_id
    }
}

impl StateMachineInner {
    fn apply(&mut self, entry: Entry<TypeConfig>) -> Reply {
        if let Some(last) = self.last_applied_log_id {
            assert!(
                entry.log_id > last,
                "apply out of order: {} after {}",
                entry.log_id,
                last
            );
        }
        self.last_applied_log_id = Some(entry.log_id);
        match entry.payload {
            EntryPayload::Blank => self.no_op_reply(),
            EntryPayload::Normal(command) => self.state.apply(&command),
            EntryPayload::Membership(membership) => {
                self.last_membership = StoredMembership::new(Some(entry.log_id), membership);
                self.no_op_reply()
            }
        }
    }

    fn no_op_reply(&self) -> Reply {
        Reply {
            metadata_version: self.state.metadata_version(),
            result: Ok(Outcome::None),
        }
    }

    fn build_snapshot(&mut self) -> Result<StoredSnapshot, StoreError> {
        let data = SnapshotData {
            last_applied_log_id: self.last_applied_log_id,
            last_membership: self.last_membership.clone(),
            state: self.state.clone(),
        };
        let bytes = serde_json::to_vec(&data).map_err(StoreError::encode("snapshot"))?;
        self.snapshot_sequence += 1;
        let snapshot_id = match self.last_applied_log_id {
            Some(id) => format!("{}-{}-{}", id.leader_id, id.index, self.snapshot_sequence),
            None => format!("none-{}", self.snapshot_sequence),
        };
        let meta = SnapshotMeta {
            last_log_id: self.last_applied_log_id,
            last_membership: self.last_membership.clone(),
            snapshot_id,
        };
        let snapshot = StoredSnapshot { meta, data: bytes };
        self.persist(&snapshot)?;
        self.current_snapshot = Some(snapshot.clone());
        Ok(snapshot)
    }

    fn persist(&self, snapshot: &StoredSnapshot) -> Result<(), StoreError> {
        let meta =
            serde_json::to_vec(&snapshot.meta).map_err(StoreError::encode("snapshot meta"))?;
        frame::write_atomically(
            &self.snapshot_path,
            SNAPSHOT_MAGIC,
            &[&meta, &snapshot.data],
        )
    }

    /// Replaces the state with the snapshot's after checking it decodes, persisting
    /// it first when it did not come from the file.
    fn install(&mut self, snapshot: StoredSnapshot, persist: bool) -> Result<(), StoreError> {
        let path = &self.snapshot_path;
        let data: SnapshotData = serde_json::from_slice(&snapshot.data)
            .map_err(|e| StoreError::corrupt(path, e.to_string()))?;
        if data.last_applied_log_id != snapshot.meta.last_log_id {
            return Err(StoreError::corrupt(
                path,
                "snapshot data and meta disagree on the last log id",
            ));
        }
        data.state.check_invariants();
        if persist {
            self.persist(&snapshot)?;
        }
        self.state = data.state;
        self.last_applied_log_id = snapshot.meta.last_log_id;
        self.last_membership = snapshot.meta.last_membership.clone();
        self.current_snapshot = Some(snapshot);
        Ok(())
    }
}

fn to_openraft(snapshot: StoredSnapshot) -> Snapshot<TypeConfig> {
    Snapshot {
        meta: snapshot.meta,
        snapshot: Box::new(Cursor::new(snapshot.data)),
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<u64>> {
        let snapshot = retry_while_full("snapshot", &self.room, || self.lock().build_snapshot())
            .await
            .map_err(StoreError::into_write_snapshot)?;
        Ok(to_openraft(snapshot))
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = StateMachineStore;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<u64>>, StoredMembership<u64, BasicNode>), StorageError<u64>> {
        let inner = self.lock();
        Ok((inner.last_applied_log_id, inner.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Reply>, StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut inner = self.lock();
        Ok(entries
            .into_iter()
            .map(|entry| inner.apply(entry))
            .collect())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<u64>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<u64>> {
        let snapshot = StoredSnapshot {
            meta: meta.clone(),
            data: snapshot.into_inner(),
        };
        retry_while_full("installed snapshot", &self.room, || {
            self.lock().install(snapshot.clone(), true)
        })
        .await
        .map_err(StoreError::into_write_snapshot)
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<u64>> {
        Ok(self.lock().current_snapshot.clone().map(to_openraft))
    }
}
