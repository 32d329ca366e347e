//! A replica's simulated disk: the records of its log (each with the leader
//! epoch it was written in and the value the checker follows), how many of
//! them are synced, the one sync in flight, and the leader-epoch file (written
//! durably at once, as the broker does). A crash keeps the synced records and
//! a random prefix of the rest: unsynced writes may be lost and the tail may
//! be torn, and recovery keeps the longest valid prefix.

use protocol::{LeaderEpoch, Offset};

use crate::rng::Rng;

/// One record as the simulator follows it. Values are unique per produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rec {
    pub epoch: i32,
    pub value: u64,
}

#[derive(Clone, Debug, Default)]
pub struct Disk {
    records: Vec<Rec>,
    /// Records below this index are synced.
    durable: usize,
    /// The end a sync in flight will make durable (lowered by a cut meanwhile).
    sync_target: Option<usize>,
    /// The leader-epoch history as last saved: (epoch, start offset).
    pub epoch_file: Vec<(LeaderEpoch, Offset)>,
}

impl Disk {
    pub fn records(&self) -> &[Rec] {
        &self.records
    }

    pub fn log_end(&self) -> i64 {
        self.records.len() as i64
    }

    pub fn durable_end(&self) -> i64 {
        self.durable as i64
    }

    pub fn append(&mut self, recs: &[Rec]) {
        self.records.extend_from_slice(recs);
    }

    /// Cuts the log so it ends at `offset`; the cut itself is synced.
    pub fn truncate(&mut self, offset: i64) {
        let end = usize::try_from(offset.max(0)).expect("non-negative");
        if end < self.records.len() {
            self.records.truncate(end);
        }
        self.durable = self.durable.min(end);
        if let Some(target) = self.sync_target.as_mut() {
            *target = (*target).min(end);
        }
    }

    /// Starts a sync of everything written so far unless one is in flight;
    /// true if one started (the caller schedules its completion).
    pub fn start_sync(&mut self) -> bool {
        if self.sync_target.is_some() || self.durable == self.records.len() {
            return false;
        }
        self.sync_target = Some(self.records.len());
        true
    }

    /// The sync in flight completed; true if more is left to sync.
    pub fn sync_done(&mut self) -> bool {
        if let Some(target) = self.sync_target.take() {
            self.durable = self.durable.max(target.min(self.records.len()));
        }
        self.durable < self.records.len()
    }

    /// A crash: synced records stay, a random prefix of the rest survives
    /// (possibly none, possibly torn in the middle, which recovery drops).
    pub fn crash(&mut self, rng: &mut Rng) {
        let unsynced = self.records.len() - self.durable;
        let kept = self.durable + rng.between(0, unsynced as u64) as usize;
        self.records.truncate(kept);
        self.sync_target = None;
        // Recovery syncs what it rescanned before it vouches for it.
        self.durable = kept;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recs(n: u64) -> Vec<Rec> {
        (0..n).map(|value| Rec { epoch: 0, value }).collect()
    }

    #[test]
    fn a_crash_keeps_what_was_synced() {
        let mut rng = Rng::new(3);
        for _ in 0..100 {
            let mut d = Disk::default();
            d.append(&recs(5));
            assert!(d.start_sync());
            d.append(&recs(5));
            assert!(d.sync_done(), "five more to sync");
            d.crash(&mut rng);
            assert!(d.log_end() >= 5 && d.log_end() <= 10);
            assert_eq!(d.durable_end(), d.log_end());
        }
    }

    #[test]
    fn a_cut_during_a_sync_is_not_made_durable_by_it() {
        let mut d = Disk::default();
        d.append(&recs(10));
        assert!(d.start_sync());
        d.truncate(4);
        d.append(&recs(6));
        assert!(d.sync_done());
        assert_eq!(d.durable_end(), 4, "the new records were not in that sync");
    }
}
