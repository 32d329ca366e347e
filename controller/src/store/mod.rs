//! Durable Raft storage for the controller quorum on openraft 0.9: the log and
//! vote (`LogStore`) and the state machine with its snapshot (`StateMachineStore`),
//! both in one data directory. No networking; the Raft node is built by the caller.

mod error;
mod frame;
mod full_disk;
mod log_store;
mod state_machine;

use std::io::Cursor;
use std::path::Path;

pub use error::StoreError;
pub use full_disk::{FULL_DISK_RETRY_MS_MAX, FULL_DISK_RETRY_MS_MIN, FULL_DISK_WARN_INTERVAL_MS};
pub use log_store::{LogRecovery, LogStore};
pub use state_machine::StateMachineStore;

use crate::command::{Command, Reply};
use crate::state::StateLimits;

openraft::declare_raft_types!(
    /// openraft's type configuration for the controller: log entries carry
    /// `Command`s, applying one yields a `Reply`, nodes are numbered `u64`.
    pub TypeConfig:
        D = Command,
        R = Reply,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// The Raft node type the controller runs.
pub type ControllerRaft = openraft::Raft<TypeConfig>;

/// Opens both stores in `dir` (created if missing), recovering the log.
pub fn open(
    dir: &Path,
    limits: StateLimits,
) -> Result<(LogStore, StateMachineStore, LogRecovery), StoreError> {
    let (mut log, recovery) = LogStore::open(dir)?;
    let mut state_machine = StateMachineStore::open(dir, limits)?;
    // One wait for room for the node, given up once for both stores.
    let room = full_disk::RoomWait::default();
    log.room = room.clone();
    state_machine.room = room;
    Ok((log, state_machine, recovery))
}
