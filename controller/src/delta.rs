//! The bounded history of metadata changes, so a broker at version V can catch up
//! with "changes since V" instead of reloading the whole image.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::ids::MetadataVersion;
pub use protocol::control::records::{Delta, VersionedDelta};

/// The requested version is older than the retained history (or newer than the
/// state): the caller must load the whole metadata image instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("deltas since version {requested} are not retained (oldest retained base {oldest_base}, current {current}); load the full image")]
pub struct NeedSnapshot {
    pub requested: MetadataVersion,
    pub oldest_base: MetadataVersion,
    pub current: MetadataVersion,
}

/// Deltas in version order, at most `deltas_retained_max` of them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeltaLog {
    deltas: VecDeque<VersionedDelta>,
    /// Every change after this version is retained; changes at or before it may not be.
    base_version: MetadataVersion,
    deltas_retained_max: usize,
}

impl DeltaLog {
    pub fn new(deltas_retained_max: usize) -> DeltaLog {
        assert!(deltas_retained_max > 0);
        DeltaLog {
            deltas: VecDeque::new(),
            base_version: MetadataVersion(0),
            deltas_retained_max,
        }
    }

    pub fn push(&mut self, version: MetadataVersion, delta: Delta) {
        if let Some(last) = self.deltas.back() {
            assert!(
                last.version <= version,
                "deltas must be pushed in version order"
            );
        }
        assert!(version > self.base_version);
        self.deltas.push_back(VersionedDelta { version, delta });
        while self.deltas.len() > self.deltas_retained_max {
            let dropped = self.deltas.pop_front().expect("non-empty");
            // Drop every delta of the same version, so a version is retained whole or not at all.
            self.base_version = dropped.version;
            while self
                .deltas
                .front()
                .is_some_and(|d| d.version == dropped.version)
            {
                self.deltas.pop_front();
            }
        }
    }

    /// All deltas with a version greater than `since`, in order.
    pub fn since(
        &self,
        since: MetadataVersion,
        current: MetadataVersion,
    ) -> Result<Vec<VersionedDelta>, NeedSnapshot> {
        if since < self.base_version || since > current {
            return Err(NeedSnapshot {
                requested: since,
                oldest_base: self.base_version,
                current,
            });
        }
        let start = self.deltas.partition_point(|d| d.version <= since);
        Ok(self.deltas.range(start..).cloned().collect())
    }

    pub fn len(&self) -> usize {
        self.deltas.len()
    }

    pub fn is_empty(&self) -> bool {
        self.deltas.is_empty()
    }

    pub fn check_invariants(&self, current: MetadataVersion) {
        assert!(self.deltas.len() <= self.deltas_retained_max);
        assert!(self.base_version <= current);
        let mut previous = self.base_version;
        for d in &self.deltas {
            assert!(d.version > self.base_version && d.version <= current);
            assert!(d.version >= previous, "deltas out of order");
            previous = d.version;
        }
    }
}
