//! Judging a run by what the log holds afterwards: the records read back
//! from every partition's earliest offset (after every broker restarted)
//! against what producers had acknowledged and what consumers had read during
//! the run, plus `verify-log` over every replica directory. Pure but for
//! `verify_log`, which runs the broker binary.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use loadgen::value_id::ValueId;
use loadgen::verify::{verify, HistoryRecord, Position};
use serde::Serialize;

/// What the read-back shows about one run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReadBackCounts {
    pub acknowledged: u64,
    pub read_back: u64,
    /// Acknowledged, and not in the log afterwards.
    pub lost: u64,
    /// In the log at two or more offsets: a retried send whose first try was
    /// written after all. The load generator is an idempotent producer, so
    /// the leader must have recognized every retry.
    pub duplicated: u64,
    /// An offset acknowledged or read with one value and holding another.
    pub offsets_with_two_values: u64,
    /// Acknowledged at one offset, in the log at another.
    pub acked_offset_mismatches: u64,
    /// Read by a consumer during the run (so below a high watermark) and
    /// not in the log at that offset afterwards.
    pub vanished_reads: u64,
}

impl ReadBackCounts {
    /// Nothing the log promised was broken, idempotence included.
    pub fn is_clean(&self) -> bool {
        self.lost == 0
            && self.duplicated == 0
            && self.offsets_with_two_values == 0
            && self.acked_offset_mismatches == 0
            && self.vanished_reads == 0
    }
}

pub fn compare(
    acked: &[HistoryRecord],
    consumed: &[HistoryRecord],
    read_back: &[HistoryRecord],
) -> ReadBackCounts {
    let report = verify(acked, read_back);
    let in_log: HashMap<Position, ValueId> =
        read_back.iter().map(|r| (r.position, r.value_id)).collect();
    let vanished_reads = consumed
        .iter()
        .filter(|r| in_log.get(&r.position) != Some(&r.value_id))
        .count() as u64;
    ReadBackCounts {
        acknowledged: report.acked_records,
        read_back: read_back.len() as u64,
        lost: report.lost,
        duplicated: report.duplicated,
        offsets_with_two_values: report.offsets_with_two_values,
        acked_offset_mismatches: report.acked_offset_mismatches,
        vanished_reads,
    }
}

/// Runs `ringlog-broker verify-log` on a partition directory; the problem
/// it names, if any.
pub fn verify_log(broker: &Path, dir: &Path) -> Option<String> {
    let output = match Command::new(broker).arg("verify-log").arg(dir).output() {
        Ok(output) => output,
        Err(e) => return Some(format!("{}: verify-log did not run: {e}", dir.display())),
    };
    if output.status.success() {
        return None;
    }
    Some(format!(
        "{}: {}{}",
        dir.display(),
        String::from_utf8_lossy(&output.stdout).trim(),
        String::from_utf8_lossy(&output.stderr).trim()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(partition: u32, offset: u64, producer: u32, sequence: u64) -> HistoryRecord {
        HistoryRecord::new(partition, offset, ValueId::new(producer, sequence))
    }

    /// The read-back judges: a lost acknowledged record, a record read during
    /// the run and gone afterwards, and an offset that changed value are each
    /// counted; a clean history counts nothing.
    #[test]
    fn read_back_counts_each_kind_of_damage() {
        let acked = vec![record(0, 0, 1, 0), record(0, 1, 1, 1), record(1, 0, 1, 2)];
        let consumed = acked.clone();
        assert!(compare(&acked, &consumed, &acked).is_clean());

        let lost_one = vec![record(0, 0, 1, 0), record(1, 0, 1, 2)];
        let counts = compare(&acked, &consumed, &lost_one);
        assert_eq!(counts.lost, 1);
        assert_eq!(counts.vanished_reads, 1);

        let replaced = vec![record(0, 0, 1, 0), record(0, 1, 2, 9), record(1, 0, 1, 2)];
        let counts = compare(&acked, &consumed, &replaced);
        assert_eq!(counts.lost, 1);
        assert_eq!(counts.offsets_with_two_values, 1);
        assert_eq!(counts.vanished_reads, 1);
        assert!(!counts.is_clean());
    }
}
