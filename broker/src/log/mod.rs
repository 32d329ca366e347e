//! The partition log storage engine: segments of record batches on direct I/O
//! with sparse offset and time indexes, recovery, retention and truncation.
//! It never touches the network and runs on one executor without locks.

mod checkpoint;
pub mod compaction;
pub mod config;
mod create;
pub mod error;
pub mod index;
pub mod journal;
pub mod journal_replay;
mod partition_log;
pub mod policy;
pub mod producer_state;
mod recovery;
pub mod scan;
pub mod segment;
pub mod shard_journal;
pub mod space_release;
mod swap;
mod tail;
pub mod txn_index;
pub mod verify;

pub use checkpoint::{
    create_dir_durably, record_dir_syncs, sync_dir, sync_file_system, take_clean_logs,
    write_all_atomically, write_atomically, write_clean_logs, SyncSet, SYNC_EACH_FILES_MAX,
};
pub use config::{CleanupPolicy, FlushPolicy, LogConfig, LogConfigError};
pub use create::{create_empty_logs, EmptyLog};
pub use error::{LogError, LogResult};
pub use partition_log::{
    AppendInfo, CleanReport, CleanRequest, FetchedBatches, LogStats, PartitionLog,
    DISK_READ_BYTES_MAX, RECOVERY_POINT_CHECKPOINT_MS, SNAPSHOT_SUFFIX,
};
pub use swap::SwapStep;
