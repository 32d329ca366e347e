//! The leader epoch history of one replica: where each epoch's records start.
//! A leader answers "where does epoch E end in your log?" from it, and a
//! follower uses the answer to cut a suffix that diverged after a leader
//! change. Kept in `leader-epoch.checkpoint` next to the segments, rewritten
//! durably (rarely: once per leader change or truncation) by the shard's
//! `EpochSaver`, before any record of a new epoch is appended.

use std::path::{Path, PathBuf};

use protocol::ids::{LeaderEpoch, Offset};

/// The file in a partition directory holding the epoch history.
pub const EPOCH_FILE: &str = "leader-epoch.checkpoint";
/// Entries kept; older epochs are merged into the first kept one.
pub const EPOCH_ENTRIES_MAX: usize = 4096;

/// (epoch, first offset of that epoch), both increasing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EpochHistory {
    entries: Vec<(LeaderEpoch, Offset)>,
}

impl EpochHistory {
    pub fn from_entries(entries: Vec<(LeaderEpoch, Offset)>) -> EpochHistory {
        let history = EpochHistory { entries };
        history.check();
        history
    }

    pub fn entries(&self) -> &[(LeaderEpoch, Offset)] {
        &self.entries
    }

    /// The latest epoch, if any record or leadership was seen.
    pub fn latest_epoch(&self) -> Option<LeaderEpoch> {
        self.entries.last().map(|e| e.0)
    }

    /// Where `epoch` starts, if it is in the history.
    pub fn start_of(&self, epoch: LeaderEpoch) -> Option<Offset> {
        self.entries.iter().find(|e| e.0 == epoch).map(|e| e.1)
    }

    /// Records that `epoch` starts at `start_offset`, if it is newer than the
    /// latest. Returns whether the history changed.
    pub fn assign(&mut self, epoch: LeaderEpoch, start_offset: Offset) -> bool {
        match self.entries.last() {
            Some(&(last, _)) if last >= epoch => false,
            Some(&(_, last_start)) if last_start >= start_offset => {
                // The previous epoch has no records: this one replaces it.
                self.entries.pop();
                self.entries.push((epoch, start_offset));
                self.bound();
                true
            }
            _ => {
                self.entries.push((epoch, start_offset));
                self.bound();
                true
            }
        }
    }

    /// Forgets epochs that start at or after `offset` (the log was cut there).
    pub fn truncate_to(&mut self, offset: Offset) -> bool {
        let before = self.entries.len();
        self.entries.retain(|e| e.1 < offset);
        self.entries.len() != before
    }

    /// The largest epoch `<= epoch` in this history and the offset where it
    /// ends (the next epoch's start, or `log_end` for the latest). With no
    /// such epoch: `(LeaderEpoch::NONE, first start)`, or
    /// `(LeaderEpoch::NONE, log_end)` for an empty history.
    pub fn end_offset_for(&self, epoch: LeaderEpoch, log_end: Offset) -> (LeaderEpoch, Offset) {
        let index = self.entries.partition_point(|e| e.0 <= epoch);
        if index == 0 {
            return (
                LeaderEpoch::NONE,
                self.entries.first().map_or(log_end, |e| e.1),
            );
        }
        let found = self.entries[index - 1].0;
        let end = self.entries.get(index).map_or(log_end, |e| e.1);
        (found, end.min(log_end))
    }

    fn bound(&mut self) {
        if self.entries.len() > EPOCH_ENTRIES_MAX {
            let excess = self.entries.len() - EPOCH_ENTRIES_MAX;
            self.entries.drain(..excess);
        }
        self.check();
    }

    fn check(&self) {
        assert!(
            Self::increasing(&self.entries),
            "epoch history must increase: {:?}",
            self.entries
        );
    }

    fn increasing(entries: &[(LeaderEpoch, Offset)]) -> bool {
        entries
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1)
    }

    fn path(dir: &Path) -> PathBuf {
        dir.join(EPOCH_FILE)
    }

    /// Loads the history of a partition directory, dropping epochs at or past
    /// `log_end`. A missing or unreadable file yields `fallback`.
    pub fn load(dir: &Path, log_end: Offset, fallback: EpochHistory) -> EpochHistory {
        let Ok(text) = std::fs::read_to_string(Self::path(dir)) else {
            return fallback;
        };
        let mut entries = Vec::new();
        for line in text.lines() {
            let mut parts = line.split_whitespace();
            let parsed = (|| {
                let epoch = parts.next()?.parse::<i32>().ok()?;
                let start = parts.next()?.parse::<i64>().ok()?;
                Some((LeaderEpoch(epoch), Offset(start)))
            })();
            match parsed {
                Some(entry) => entries.push(entry),
                None => return fallback,
            }
        }
        EpochHistory::recovered(entries, log_end).unwrap_or(fallback)
    }

    /// The history saved as `entries`, for a log that ends at `log_end`
    /// after recovery: epochs starting past the end are dropped. `None` if
    /// the entries do not increase (a damaged file).
    pub fn recovered(entries: Vec<(LeaderEpoch, Offset)>, log_end: Offset) -> Option<EpochHistory> {
        if !Self::increasing(&entries) {
            return None;
        }
        let mut history = EpochHistory { entries };
        // An epoch may start exactly at the log end (a leader with no records yet).
        history.entries.retain(|e| e.1 <= log_end);
        Some(history)
    }

    /// Writes the history durably.
    pub fn save(&self, dir: &Path) -> std::io::Result<()> {
        crate::log::write_atomically(dir, EPOCH_FILE, self.encode().as_bytes())
    }

    /// The history as `EPOCH_FILE` holds it, which `load` reads.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        for (epoch, start) in &self.entries {
            text.push_str(&format!("{epoch} {start}\n"));
        }
        text
    }
}

/// Where a follower cuts its log after the leader said it diverges: at the
/// leader's end of `diverging_epoch`, or earlier if the follower's own records
/// of that epoch end earlier; never past its own log end.
pub fn truncation_offset(
    own: &EpochHistory,
    own_log_end: Offset,
    diverging_epoch: LeaderEpoch,
    diverging_end_offset: Offset,
) -> Offset {
    let (found, own_end) = own.end_offset_for(diverging_epoch, own_log_end);
    let own_end = if found == diverging_epoch {
        own_end
    } else {
        // The follower has no records of that epoch: keep what precedes it.
        own_end.min(diverging_end_offset)
    };
    diverging_end_offset
        .min(own_end)
        .min(own_log_end)
        .max(Offset::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(epoch: i32) -> LeaderEpoch {
        LeaderEpoch(epoch)
    }

    fn o(offset: i64) -> Offset {
        Offset(offset)
    }

    fn hist(entries: &[(i32, i64)]) -> Vec<(LeaderEpoch, Offset)> {
        entries
            .iter()
            .map(|&(epoch, start)| (e(epoch), o(start)))
            .collect()
    }

    #[test]
    fn end_offsets_answer_where_each_epoch_ends() {
        let mut h = EpochHistory::default();
        assert_eq!(h.end_offset_for(e(3), o(0)), (LeaderEpoch::NONE, o(0)));
        assert!(h.assign(e(1), o(0)));
        assert!(h.assign(e(3), o(10)));
        assert!(!h.assign(e(2), o(12)), "older epochs are ignored");
        assert!(h.assign(e(5), o(20)));
        assert_eq!(h.end_offset_for(e(0), o(30)), (LeaderEpoch::NONE, o(0)));
        assert_eq!(h.end_offset_for(e(1), o(30)), (e(1), o(10)));
        assert_eq!(h.end_offset_for(e(2), o(30)), (e(1), o(10)));
        assert_eq!(h.end_offset_for(e(3), o(30)), (e(3), o(20)));
        assert_eq!(h.end_offset_for(e(9), o(30)), (e(5), o(30)));
        // An epoch that got no records is replaced by the next one.
        assert!(h.assign(e(6), o(20)));
        assert_eq!(h.entries(), hist(&[(1, 0), (3, 10), (6, 20)]));
        assert!(h.truncate_to(o(10)));
        assert_eq!(h.entries(), hist(&[(1, 0)]));
        assert_eq!(h.start_of(e(1)), Some(o(0)));
    }

    #[test]
    fn followers_cut_where_the_logs_part() {
        // Leader: epoch 1 at 0, epoch 2 at 10 (it led epoch 2).
        // Follower: epoch 1 at 0, then wrote epoch 1 up to 14 as an old leader
        // whose last 4 records were never replicated.
        let follower = EpochHistory::from_entries(hist(&[(1, 0)]));
        // The follower asks with last_fetched_epoch 1; the leader says epoch 1
        // ends at 10 in its log.
        assert_eq!(truncation_offset(&follower, o(14), e(1), o(10)), o(10));
        // A follower with epoch 3 records the leader never had.
        let ahead = EpochHistory::from_entries(hist(&[(1, 0), (3, 12)]));
        assert_eq!(truncation_offset(&ahead, o(20), e(1), o(10)), o(10));
        // A follower behind the leader's end of the epoch cuts nothing.
        assert_eq!(truncation_offset(&follower, o(8), e(1), o(10)), o(8));
        // The leader knows no older epoch: cut at its first start.
        assert_eq!(
            truncation_offset(&follower, o(14), LeaderEpoch::NONE, o(0)),
            o(0)
        );
    }

    #[test]
    fn history_survives_save_and_load() {
        let dir = tempfile::tempdir().unwrap();
        let h = EpochHistory::from_entries(hist(&[(0, 0), (2, 5), (4, 9)]));
        h.save(dir.path()).unwrap();
        let loaded = EpochHistory::load(dir.path(), o(100), EpochHistory::default());
        assert_eq!(loaded, h);
        // Epochs starting past the log end (cut before a crash) are dropped.
        let cut = EpochHistory::load(dir.path(), o(6), EpochHistory::default());
        assert_eq!(cut.entries(), hist(&[(0, 0), (2, 5)]));
        std::fs::write(dir.path().join(EPOCH_FILE), "garbage\n").unwrap();
        let fallback = EpochHistory::from_entries(hist(&[(7, 0)]));
        assert_eq!(
            EpochHistory::load(dir.path(), o(6), fallback.clone()),
            fallback
        );
    }
}
