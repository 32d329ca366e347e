//! What one consumer group has read during a run, as its members report
//! it: every record returned (re-reads included) and the records new to the
//! group, which is what the end-of-run drain compares with the acked count,
//! plus the membership events its members saw. Plain data, no I/O; the
//! members of a group share one behind a lock.
//!
//! A partition that moves between members is read again from its committed
//! offset (at-least-once), so the records returned can exceed what was
//! produced; a record is new only when its offset is at or past the
//! highest offset the group has read of its partition, plus one. A member
//! reads a partition in offset order, so this counts each offset once.

use client::GroupEvent;

/// One group's reads and membership events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupProgress {
    /// Per partition: one past the highest offset the group has read;
    /// `None` before its first read.
    next_offsets: Vec<Option<i64>>,
    /// Every record members returned to the run, re-reads included.
    records_read: u64,
    /// Records at offsets the group had not read before.
    records_new: u64,
    pub events: GroupEventCounts,
}

/// How often members saw each `GroupEvent`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupEventCounts {
    pub assigned: u64,
    pub revoked: u64,
    pub lost: u64,
    pub commit_failures: u64,
}

impl GroupProgress {
    pub fn new(partitions: u32) -> GroupProgress {
        GroupProgress {
            next_offsets: vec![None; partitions as usize],
            records_read: 0,
            records_new: 0,
            events: GroupEventCounts::default(),
        }
    }

    /// Takes one record a member returned; true when it is new to the
    /// group. `partition` is below the count given to `new` (the caller
    /// checks what the broker sent).
    pub fn observe(&mut self, partition: u32, offset: i64) -> bool {
        assert!(offset >= 0, "a record's offset is never negative");
        let next = &mut self.next_offsets[partition as usize];
        self.records_read += 1;
        let new = next.is_none_or(|next| offset >= next);
        if new {
            self.records_new += 1;
            *next = Some(offset + 1);
        }
        assert!(self.records_new <= self.records_read);
        new
    }

    pub fn note_events(&mut self, events: &[GroupEvent]) {
        for event in events {
            let count = match event {
                GroupEvent::Assigned(_) => &mut self.events.assigned,
                GroupEvent::Revoked(_) => &mut self.events.revoked,
                GroupEvent::Lost(_) => &mut self.events.lost,
                GroupEvent::CommitFailed(_) => &mut self.events.commit_failures,
            };
            *count += 1;
        }
    }

    pub fn records_read(&self) -> u64 {
        self.records_read
    }

    pub fn records_new(&self) -> u64 {
        self.records_new
    }

    /// Whether the group has read as many new records as were acked: the
    /// drain's test, the same as the assigned consumers' (a record read but
    /// whose ack was lost counts too, so this can pass early by that many).
    pub fn caught_up(&self, acked_messages: u64) -> bool {
        self.records_new >= acked_messages
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use client::TopicPartition;

    // Reads in order are all new; re-reading from an earlier offset (a
    // partition moved to a member that starts at the committed offset) is
    // counted as read but not new, and reading on past it is new again.
    #[test]
    fn re_reads_are_not_new() {
        let mut progress = GroupProgress::new(2);
        for offset in 10..15 {
            assert!(progress.observe(0, offset));
        }
        assert!(progress.observe(1, 0));
        for offset in 12..15 {
            assert!(!progress.observe(0, offset), "offset {offset} again");
        }
        assert!(progress.observe(0, 15));
        assert!(
            progress.observe(0, 20),
            "a gap (compacted or aborted) is fine"
        );
        assert_eq!(progress.records_read(), 11);
        assert_eq!(progress.records_new(), 8);
        assert!(progress.caught_up(8));
        assert!(!progress.caught_up(9));
    }

    // Each event kind is counted on its own.
    #[test]
    fn counts_events() {
        let mut progress = GroupProgress::new(1);
        let tp = vec![TopicPartition::new("t", 0)];
        progress.note_events(&[
            GroupEvent::Assigned(tp.clone()),
            GroupEvent::Revoked(tp.clone()),
            GroupEvent::Assigned(tp),
        ]);
        assert_eq!(
            progress.events,
            GroupEventCounts {
                assigned: 2,
                revoked: 1,
                lost: 0,
                commit_failures: 0
            }
        );
    }
}
