//! The history checker behind `ringlog-loadgen verify`: given what the
//! broker acknowledged and what consumers read, each as (partition, offset,
//! value id), count the anomalies a Jepsen-style checker reports. A pure
//! function over two slices; reading files is the caller's job (a small
//! text parser is provided for the CLI).
//!
//! Definitions (each counted once):
//! - lost: a value acknowledged but never read at any position;
//! - duplicated: a value read at two or more distinct positions (re-reading
//!   the same position is not a duplicate);
//! - out of order: within a partition, walking reads by offset, a value
//!   whose producer sequence is below one already seen from that producer
//!   (first occurrences only, so a duplicate is not also counted here);
//! - offsets with two values: a position that holds more than one value
//!   across all reads and acknowledgements;
//! - acked offset mismatches: a value read, but never at the position its
//!   acknowledgement named;
//! - read unacked: values read that were never acknowledged (not an error:
//!   the ack may have been lost in a timeout).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde::Serialize;
use thiserror::Error;

use crate::value_id::ValueId;

/// Bound on records read from one history file.
pub const RECORDS_MAX: usize = 100_000_000;

/// A record's place in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Position {
    pub partition: u32,
    pub offset: u64,
}

/// One acknowledged or consumed record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HistoryRecord {
    pub position: Position,
    pub value_id: ValueId,
}

impl HistoryRecord {
    pub fn new(partition: u32, offset: u64, value_id: ValueId) -> HistoryRecord {
        HistoryRecord {
            position: Position { partition, offset },
            value_id,
        }
    }
}

/// The checker's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct VerifyReport {
    pub acked_records: u64,
    pub consumed_records: u64,
    pub distinct_values_read: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub out_of_order: u64,
    pub offsets_with_two_values: u64,
    pub acked_offset_mismatches: u64,
    pub read_unacked: u64,
}

impl VerifyReport {
    /// No anomaly that breaks the log's contract (read_unacked is allowed).
    pub fn is_clean(&self) -> bool {
        self.lost == 0
            && self.duplicated == 0
            && self.out_of_order == 0
            && self.offsets_with_two_values == 0
            && self.acked_offset_mismatches == 0
    }

    /// Adds the counts of another, independent check (another consumer
    /// group's reads against the same acks): the sum is clean only if both
    /// were.
    pub fn add(&mut self, other: &VerifyReport) {
        self.acked_records += other.acked_records;
        self.consumed_records += other.consumed_records;
        self.distinct_values_read += other.distinct_values_read;
        self.lost += other.lost;
        self.duplicated += other.duplicated;
        self.out_of_order += other.out_of_order;
        self.offsets_with_two_values += other.offsets_with_two_values;
        self.acked_offset_mismatches += other.acked_offset_mismatches;
        self.read_unacked += other.read_unacked;
    }

    pub fn render_text(&self) -> String {
        format!(
            "acked {} · consumed {} ({} distinct values)\nlost {}\nduplicated {}\nout of order {}\noffsets with two values {}\nacked offset mismatches {}\nread but never acked {}\nverdict: {}\n",
            self.acked_records,
            self.consumed_records,
            self.distinct_values_read,
            self.lost,
            self.duplicated,
            self.out_of_order,
            self.offsets_with_two_values,
            self.acked_offset_mismatches,
            self.read_unacked,
            if self.is_clean() { "clean" } else { "ANOMALIES" }
        )
    }
}

/// Checks a history. O(n log n) time, O(n) memory.
pub fn verify(acked: &[HistoryRecord], consumed: &[HistoryRecord]) -> VerifyReport {
    let mut values_at: BTreeMap<Position, BTreeSet<ValueId>> = BTreeMap::new();
    let mut read_at: HashMap<ValueId, HashSet<Position>> = HashMap::new();
    for record in consumed {
        values_at
            .entry(record.position)
            .or_default()
            .insert(record.value_id);
        read_at
            .entry(record.value_id)
            .or_default()
            .insert(record.position);
    }
    let consumed_values_at = values_at.clone();
    for record in acked {
        values_at
            .entry(record.position)
            .or_default()
            .insert(record.value_id);
    }
    let acked_values: HashSet<ValueId> = acked.iter().map(|r| r.value_id).collect();
    let lost = acked_values
        .iter()
        .filter(|id| !read_at.contains_key(id))
        .count();
    let acked_offset_mismatches = acked
        .iter()
        .filter(|r| {
            read_at
                .get(&r.value_id)
                .is_some_and(|at| !at.contains(&r.position))
        })
        .count();
    let report = VerifyReport {
        acked_records: acked.len() as u64,
        consumed_records: consumed.len() as u64,
        distinct_values_read: read_at.len() as u64,
        lost: lost as u64,
        duplicated: read_at.values().filter(|at| at.len() > 1).count() as u64,
        out_of_order: count_out_of_order(&consumed_values_at),
        offsets_with_two_values: values_at.values().filter(|ids| ids.len() > 1).count() as u64,
        acked_offset_mismatches: acked_offset_mismatches as u64,
        read_unacked: read_at
            .keys()
            .filter(|id| !acked_values.contains(id))
            .count() as u64,
    };
    assert!(report.lost <= acked_values.len() as u64);
    assert!(report.distinct_values_read <= report.consumed_records);
    report
}

/// Walks each partition's reads in offset order (the map is sorted by
/// partition, then offset) and counts sequence regressions per producer.
fn count_out_of_order(values_at: &BTreeMap<Position, BTreeSet<ValueId>>) -> u64 {
    let mut out_of_order = 0;
    let mut current_partition = None;
    let mut sequence_max_by_producer: HashMap<u32, u64> = HashMap::new();
    let mut seen_in_partition: HashSet<ValueId> = HashSet::new();
    for (position, ids) in values_at {
        if current_partition != Some(position.partition) {
            current_partition = Some(position.partition);
            sequence_max_by_producer.clear();
            seen_in_partition.clear();
        }
        for id in ids {
            if !seen_in_partition.insert(*id) {
                continue;
            }
            let sequence_max = sequence_max_by_producer
                .entry(id.producer())
                .or_insert(id.sequence());
            if id.sequence() < *sequence_max {
                out_of_order += 1;
            } else {
                *sequence_max = id.sequence();
            }
        }
    }
    out_of_order
}

/// Why a history file could not be read.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum HistoryParseError {
    #[error("line {line}: expected `partition offset value_id` (value id as a number or producer:sequence), got {text:?}")]
    Syntax { line: usize, text: String },
    #[error("more than {RECORDS_MAX} records")]
    TooMany,
}

/// Parses a history file: one record per line, `partition offset value_id`
/// separated by spaces, tabs or commas; the value id is a u64 or
/// `producer:sequence`. Blank lines and lines starting with `#` are skipped.
pub fn parse_history(text: &str) -> Result<Vec<HistoryRecord>, HistoryParseError> {
    let mut records = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if records.len() == RECORDS_MAX {
            return Err(HistoryParseError::TooMany);
        }
        let syntax = || HistoryParseError::Syntax {
            line: index + 1,
            text: line.to_string(),
        };
        let fields: Vec<&str> = trimmed
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|field| !field.is_empty())
            .collect();
        let [partition, offset, value] = fields.as_slice() else {
            return Err(syntax());
        };
        let value_id = match value.split_once(':') {
            Some((producer, sequence)) => {
                let producer: u32 = producer.parse().map_err(|_| syntax())?;
                let sequence: u64 = sequence.parse().map_err(|_| syntax())?;
                if producer > crate::value_id::PRODUCER_MAX
                    || sequence > crate::value_id::SEQUENCE_MAX
                {
                    return Err(syntax());
                }
                ValueId::new(producer, sequence)
            }
            None => ValueId(value.parse().map_err(|_| syntax())?),
        };
        records.push(HistoryRecord::new(
            partition.parse().map_err(|_| syntax())?,
            offset.parse().map_err(|_| syntax())?,
            value_id,
        ));
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A correct run: messages (producer, partition, acked) appended in
    /// order; returns (acked, consumed reads, per-partition logs).
    fn correct_history(
        messages: &[(u32, u32, bool)],
        partitions: u32,
    ) -> (Vec<HistoryRecord>, Vec<HistoryRecord>, Vec<Vec<ValueId>>) {
        let mut logs: Vec<Vec<ValueId>> = vec![Vec::new(); partitions as usize];
        let mut next_sequence: HashMap<u32, u64> = HashMap::new();
        let mut acked = Vec::new();
        for &(producer, partition, is_acked) in messages {
            let sequence = next_sequence.entry(producer).or_insert(0);
            let id = ValueId::new(producer, *sequence);
            *sequence += 1;
            let log = &mut logs[partition as usize];
            if is_acked {
                acked.push(HistoryRecord::new(partition, log.len() as u64, id));
            }
            log.push(id);
        }
        let consumed = reads_of(&logs);
        (acked, consumed, logs)
    }

    fn reads_of(logs: &[Vec<ValueId>]) -> Vec<HistoryRecord> {
        logs.iter()
            .enumerate()
            .flat_map(|(partition, log)| {
                log.iter().enumerate().map(move |(offset, id)| {
                    HistoryRecord::new(partition as u32, offset as u64, *id)
                })
            })
            .collect()
    }

    fn messages_strategy() -> impl Strategy<Value = (u32, Vec<(u32, u32, bool)>)> {
        (1u32..5).prop_flat_map(|partitions| {
            (
                Just(partitions),
                prop::collection::vec((0u32..4, 0..partitions, prop::bool::weighted(0.9)), 0..200),
            )
        })
    }

    proptest! {
        // A correct history, read once or re-read in any order, is clean.
        #[test]
        fn correct_history_is_clean((partitions, messages) in messages_strategy(), reread in any::<bool>(), seed in any::<u64>()) {
            let (acked, mut consumed, _) = correct_history(&messages, partitions);
            if reread {
                consumed.extend(consumed.clone());
            }
            fastrand::Rng::with_seed(seed).shuffle(&mut consumed);
            let report = verify(&acked, &consumed);
            prop_assert!(report.is_clean(), "{report:?}");
            prop_assert_eq!(report.read_unacked, messages.iter().filter(|m| !m.2).count() as u64);
            prop_assert_eq!(report.distinct_values_read, messages.len() as u64);
        }

        // Dropping reads loses exactly the acked values that are no longer read (naive model).
        #[test]
        fn lost_matches_naive_model((partitions, messages) in messages_strategy(), keep in prop::collection::vec(prop::bool::weighted(0.8), 200)) {
            let (acked, consumed, _) = correct_history(&messages, partitions);
            let kept: Vec<HistoryRecord> = consumed.iter().zip(keep.iter().cycle()).filter(|(_, k)| **k).map(|(r, _)| *r).collect();
            let expected_lost = acked.iter().filter(|a| !kept.iter().any(|r| r.value_id == a.value_id)).count() as u64;
            let report = verify(&acked, &kept);
            prop_assert_eq!(report.lost, expected_lost);
            prop_assert_eq!(report.duplicated, 0);
            prop_assert_eq!(report.offsets_with_two_values, 0);
        }

        // A value appended again later in its partition is one duplicate and nothing else.
        #[test]
        fn duplicate_is_counted_once((partitions, messages) in messages_strategy(), pick in any::<prop::sample::Index>()) {
            prop_assume!(!messages.is_empty());
            let (acked, _, mut logs) = correct_history(&messages, partitions);
            let partition = logs.iter().position(|log| !log.is_empty()).unwrap();
            let id = *pick.get(&logs[partition]);
            logs[partition].push(id);
            let report = verify(&acked, &reads_of(&logs));
            prop_assert_eq!(report.duplicated, 1);
            prop_assert_eq!(report.out_of_order, 0);
            prop_assert_eq!(report.lost, 0);
            prop_assert_eq!(report.offsets_with_two_values, 0);
        }

        // Swapping two consecutive values of one producer in a partition is one reordering.
        #[test]
        fn swap_is_out_of_order((partitions, messages) in messages_strategy()) {
            let (_, _, mut logs) = correct_history(&messages, partitions);
            let mut swapped = false;
            'search: for log in logs.iter_mut() {
                for first in 0..log.len() {
                    if let Some(second) = (first + 1..log.len()).find(|&j| log[j].producer() == log[first].producer()) {
                        log.swap(first, second);
                        swapped = true;
                        break 'search;
                    }
                }
            }
            prop_assume!(swapped);
            let report = verify(&[], &reads_of(&logs));
            prop_assert_eq!(report.out_of_order, 1);
            prop_assert_eq!(report.duplicated, 0);
        }
    }

    // A second value at an occupied offset is flagged, whether read or acked there.
    #[test]
    fn offset_with_two_values() {
        let a = ValueId::new(0, 0);
        let b = ValueId::new(1, 0);
        let acked = [HistoryRecord::new(0, 5, a)];
        let report = verify(&acked, &[HistoryRecord::new(0, 5, b)]);
        assert_eq!(report.offsets_with_two_values, 1);
        assert_eq!(report.lost, 1);
        assert_eq!(report.read_unacked, 1);
        let report = verify(
            &acked,
            &[HistoryRecord::new(0, 5, a), HistoryRecord::new(0, 6, a)],
        );
        assert_eq!(report.duplicated, 1);
        assert_eq!(report.offsets_with_two_values, 0);
        let report = verify(&acked, &[HistoryRecord::new(0, 6, a)]);
        assert_eq!(report.acked_offset_mismatches, 1);
        assert!(!report.is_clean());
    }

    // History files: numbers or producer:sequence, commas or spaces, comments skipped.
    #[test]
    fn parses_history_text() {
        let records = parse_history("# p o id\n0 10 5\n\n1,11,2:7\n").unwrap();
        assert_eq!(
            records,
            vec![
                HistoryRecord::new(0, 10, ValueId(5)),
                HistoryRecord::new(1, 11, ValueId::new(2, 7))
            ]
        );
        assert!(matches!(
            parse_history("0 1"),
            Err(HistoryParseError::Syntax { line: 1, .. })
        ));
        assert!(parse_history("0 1 x:2").is_err());
        assert!(verify(&[], &[]).is_clean());
    }
}
