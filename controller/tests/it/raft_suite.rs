//! openraft's `Suite::test_all` against the durable stores, each test in a fresh
//! temporary directory.

use controller::state::StateLimits;
use controller::store::{self, LogStore, StateMachineStore, TypeConfig};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{StorageError, StorageIOError};
use tempfile::TempDir;

struct DiskStoreBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for DiskStoreBuilder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError<u64>> {
        let dir = TempDir::new().map_err(|e| StorageIOError::write(&e))?;
        let (log, state_machine, _) = store::open(dir.path(), StateLimits::default())
            .map_err(|e| StorageIOError::write(&e))?;
        Ok((dir, log, state_machine))
    }
}

// The stores meet every requirement openraft's conformance suite checks.
#[test]
fn openraft_storage_suite() {
    if let Err(e) = Suite::test_all(DiskStoreBuilder) {
        panic!("storage suite failed: {e}");
    }
}
