//! The checker: what the cluster promised, checked after every step.
//!
//! - Committed records: every offset below a leader's high watermark is
//!   committed, and committed offsets hold one value forever. The first
//!   leader whose watermark passes an offset fixes its value; every later
//!   leader whose watermark passes it must hold the same record.
//! - acks=all: an acknowledged record is committed at the offset it was
//!   acknowledged at (and so, by the rule above, never lost).
//! - Consumers read committed records only, in order, each as committed.
//! - A leader's high watermark never goes backwards within its leadership.
//! - One leader per partition epoch: produced records of a leader epoch are
//!   appended by one broker incarnation only.

use std::collections::BTreeMap;

use protocol::{BrokerId, LeaderEpoch};

use crate::disk::Rec;
use crate::msg::Observation;

/// A leadership: partition, broker, incarnation, leader epoch.
type Leadership = (u32, BrokerId, u64, LeaderEpoch);

#[derive(Debug, Default)]
pub struct Checker {
    /// Per partition, the committed records by offset (a prefix of the log).
    committed: BTreeMap<u32, Vec<Rec>>,
    /// Per leadership: its highest watermark seen.
    watermarks: BTreeMap<Leadership, i64>,
    /// Who appended produced records at each (partition, leader epoch).
    writers: BTreeMap<(u32, LeaderEpoch), (BrokerId, u64)>,
    /// Acknowledged acks=all records: (partition, offset) -> value.
    pub acked_all: BTreeMap<(u32, i64), u64>,
    pub acked_one: u64,
    pub consumed: u64,
    /// The simulated time of the last acks=all success per partition.
    pub last_ack_all_ms: BTreeMap<u32, u64>,
}

/// A broken promise, with what shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation(pub String);

impl Checker {
    pub fn committed(&self, partition: u32) -> &[Rec] {
        self.committed.get(&partition).map_or(&[], Vec::as_slice)
    }

    /// A leader's state after a step: its high watermark and its log.
    pub fn leader(
        &mut self,
        leadership: Leadership,
        high_watermark: i64,
        log: &[Rec],
    ) -> Result<(), Violation> {
        let (partition, broker, incarnation, epoch) = leadership;
        // A new leadership is checked over its whole committed range once,
        // then only over what its watermark passes.
        let from = match self.watermarks.get(&leadership) {
            None => 0,
            Some(&seen) if high_watermark < seen => {
                return Err(Violation(format!(
                    "p{partition}: leader {broker} (incarnation {incarnation}, epoch {epoch}) moved its high watermark back from {seen} to {high_watermark}"
                )));
            }
            Some(&seen) => seen.max(0) as usize,
        };
        self.watermarks.insert(leadership, high_watermark);
        if high_watermark > log.len() as i64 {
            return Err(Violation(format!(
                "p{partition}: leader {broker} epoch {epoch} has high watermark {high_watermark} above its log end {}",
                log.len()
            )));
        }
        let committed = self.committed.entry(partition).or_default();
        for (offset, rec) in log
            .iter()
            .enumerate()
            .take(high_watermark as usize)
            .skip(from)
        {
            match committed.get(offset) {
                Some(c) if c != rec => {
                    return Err(Violation(format!(
                        "p{partition}: offset {offset} holds {rec:?} on leader {broker} (epoch {epoch}, watermark {high_watermark}) but {c:?} was committed"
                    )))
                }
                Some(_) => {}
                None => {
                    assert_eq!(committed.len(), offset, "committed is a prefix");
                    committed.push(*rec);
                }
            }
        }
        Ok(())
    }

    pub fn observe(&mut self, sim_ms: u64, observation: &Observation) -> Result<(), Violation> {
        match observation {
            Observation::LeaderAppend {
                partition,
                broker,
                incarnation,
                leader_epoch,
            } => {
                let writer = self
                    .writers
                    .entry((*partition, *leader_epoch))
                    .or_insert((*broker, *incarnation));
                if *writer != (*broker, *incarnation) {
                    return Err(Violation(format!(
                        "p{partition}: two leaders accepted writes at leader epoch {leader_epoch}: {writer:?} and {:?}",
                        (broker, incarnation)
                    )));
                }
            }
            Observation::Acked {
                partition,
                acks,
                base,
                values,
            } => {
                if *acks != -1 {
                    self.acked_one += values.len() as u64;
                    return Ok(());
                }
                let committed = self.committed.get(partition).map_or(&[][..], Vec::as_slice);
                for (i, value) in values.iter().enumerate() {
                    let offset = *base + i as i64;
                    match committed.get(offset as usize) {
                        Some(rec) if rec.value == *value => {}
                        other => {
                            return Err(Violation(format!(
                                "p{partition}: acks=all answered for value {value} at offset {offset}, but the committed record there is {other:?}"
                            )))
                        }
                    }
                    self.acked_all.insert((*partition, offset), *value);
                }
                self.last_ack_all_ms.insert(*partition, sim_ms);
            }
            Observation::Consumed {
                partition,
                offset,
                records,
            } => {
                let committed = self.committed(*partition);
                for (i, rec) in records.iter().enumerate() {
                    let at = *offset as usize + i;
                    if committed.get(at) != Some(rec) {
                        return Err(Violation(format!(
                            "p{partition}: a consumer read {rec:?} at offset {at}, but the committed record there is {:?}",
                            committed.get(at)
                        )));
                    }
                }
                self.consumed += records.len() as u64;
            }
            Observation::OutOfRange { partition, offset } => {
                return Err(Violation(format!(
                    "p{partition}: a leader's log ends before committed offset {offset} a consumer reached"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(values: &[u64]) -> Vec<Rec> {
        values
            .iter()
            .map(|&value| Rec { epoch: 1, value })
            .collect()
    }

    #[test]
    fn a_committed_offset_cannot_change_value() {
        let mut c = Checker::default();
        let a = (0, BrokerId(1), 1, LeaderEpoch(1));
        c.leader(a, 2, &log(&[10, 11, 12])).unwrap();
        let b = (0, BrokerId(2), 1, LeaderEpoch(2));
        assert!(
            c.leader(b, 1, &log(&[10, 99])).is_ok(),
            "below what it commits"
        );
        assert!(c.leader(b, 2, &log(&[10, 99])).is_err());
    }

    #[test]
    fn watermarks_move_forward_and_acks_must_be_committed() {
        let mut c = Checker::default();
        let a = (0, BrokerId(1), 1, LeaderEpoch(1));
        c.leader(a, 2, &log(&[10, 11])).unwrap();
        assert!(c.leader(a, 1, &log(&[10, 11])).is_err());
        let acked = |value| Observation::Acked {
            partition: 0,
            acks: -1,
            base: 1,
            values: vec![value],
        };
        assert!(c.observe(0, &acked(11)).is_ok());
        assert!(c.observe(0, &acked(12)).is_err());
        let two = Observation::LeaderAppend {
            partition: 0,
            broker: BrokerId(2),
            incarnation: 1,
            leader_epoch: LeaderEpoch(1),
        };
        let one = Observation::LeaderAppend {
            partition: 0,
            broker: BrokerId(1),
            incarnation: 1,
            leader_epoch: LeaderEpoch(1),
        };
        assert!(c.observe(0, &one).is_ok());
        assert!(c.observe(0, &two).is_err());
    }
}
