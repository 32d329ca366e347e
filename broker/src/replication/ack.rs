//! When an acks=all produce may be answered: a pure decision over what the
//! leader knows at the moment it looks, so the checks hold when the answer is
//! sent, not only when the records were appended.

use protocol::Offset;

/// What the leader knows about one waiting acks=all write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckView {
    /// This broker still leads at the leader epoch the batch was stamped with.
    pub leads_at_append_epoch: bool,
    pub high_watermark: Offset,
    /// The offset after the batch's last record.
    pub batch_end: Offset,
    pub isr_len: usize,
    pub min_insync: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckDecision {
    /// Not yet on every in-sync replica.
    Wait,
    /// On every member of an ISR of at least `min.insync.replicas`.
    Committed,
    /// Leadership moved. The high watermark seen here may be a follower's, or
    /// count records a new leader truncated: it says nothing about this write.
    NotLeader,
    /// On every in-sync replica, but the ISR shrank below
    /// `min.insync.replicas` after the append (Kafka's
    /// NOT_ENOUGH_REPLICAS_AFTER_APPEND): the write is not acknowledged.
    NotEnoughReplicasAfterAppend,
}

pub fn decide(view: AckView) -> AckDecision {
    // Leadership first: a deposed leader's watermark may pass the batch only
    // because it re-fetched other records at the same offsets.
    if !view.leads_at_append_epoch {
        return AckDecision::NotLeader;
    }
    if view.high_watermark < view.batch_end {
        return AckDecision::Wait;
    }
    if view.isr_len < view.min_insync {
        return AckDecision::NotEnoughReplicasAfterAppend;
    }
    AckDecision::Committed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> AckView {
        AckView {
            leads_at_append_epoch: true,
            high_watermark: Offset(10),
            batch_end: Offset(10),
            isr_len: 2,
            min_insync: 2,
        }
    }

    #[test]
    fn committed_only_by_a_leader_with_enough_replicas() {
        assert_eq!(decide(view()), AckDecision::Committed);
        let below = AckView {
            high_watermark: Offset(9),
            ..view()
        };
        assert_eq!(decide(below), AckDecision::Wait);
        // The ISR shrank to the leader alone: the watermark passes the batch
        // at once, but the write is on one broker only.
        let shrunk = AckView {
            isr_len: 1,
            ..view()
        };
        assert_eq!(decide(shrunk), AckDecision::NotEnoughReplicasAfterAppend);
        // A deposed leader whose watermark passed the batch after it was
        // truncated and re-fetched the new leader's records.
        let deposed = AckView {
            leads_at_append_epoch: false,
            high_watermark: Offset(50),
            ..view()
        };
        assert_eq!(decide(deposed), AckDecision::NotLeader);
        let deposed_waiting = AckView {
            leads_at_append_epoch: false,
            high_watermark: Offset(0),
            ..view()
        };
        assert_eq!(decide(deposed_waiting), AckDecision::NotLeader);
    }
}
