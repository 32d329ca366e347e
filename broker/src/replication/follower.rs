//! A follower's decisions on its leader's answer for one partition: cut a
//! diverged suffix, restart from the leader's log start when the leader no
//! longer has what comes next, append, or back off; and the follower's high
//! watermark. Pure: the fetcher and the shard do the I/O these ask for.

use protocol::{ErrorCode, LeaderEpoch, Offset};

use super::epochs::{truncation_offset, EpochHistory};

/// The leader's answer for one partition, as the decision needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaderAnswer {
    pub error: ErrorCode,
    pub high_watermark: Offset,
    pub log_start_offset: Offset,
    /// `None` when the leader did not say.
    pub log_end_offset: Option<Offset>,
    /// Where the follower's log parts from the leader's: (epoch, end offset).
    pub diverging: Option<(LeaderEpoch, Offset)>,
}

impl LeaderAnswer {
    /// The answer as the replica fetch response carries it, where -1 says
    /// "unknown".
    pub fn from_wire(fetched: &protocol::replica_fetch::FetchedPartition) -> LeaderAnswer {
        LeaderAnswer {
            error: fetched.error,
            high_watermark: Offset(fetched.high_watermark),
            log_start_offset: Offset(fetched.log_start_offset),
            log_end_offset: (fetched.log_end_offset >= 0).then_some(Offset(fetched.log_end_offset)),
            diverging: fetched
                .diverging
                .map(|(epoch, end)| (LeaderEpoch(epoch), Offset(end))),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FollowerAction {
    /// Append the records sent (if any), then take the high watermark.
    Append,
    /// Cut the log at this offset first (everything at or after it goes).
    Truncate(Offset),
    /// The leader's log starts after this replica's log end (retention moved
    /// on while it was away): drop the whole log and start empty at this
    /// offset (Kafka's truncate-fully-and-start-at).
    RestartAt(Offset),
    /// The leader refused; ask again after a pause.
    Retry,
}

pub fn decide(
    answer: &LeaderAnswer,
    own_log_end: Offset,
    own_epochs: &EpochHistory,
) -> FollowerAction {
    if answer.error == ErrorCode::OffsetOutOfRange {
        if answer.log_start_offset > own_log_end {
            return FollowerAction::RestartAt(answer.log_start_offset);
        }
        if let Some(leader_end) = answer.log_end_offset.filter(|&end| own_log_end > end) {
            // Ahead of the leader with nothing to tell the epochs apart: what
            // lies past the leader's end was never committed.
            return FollowerAction::Truncate(leader_end);
        }
        return FollowerAction::Retry;
    }
    if answer.error != ErrorCode::None {
        return FollowerAction::Retry;
    }
    if let Some((epoch, end_offset)) = answer.diverging {
        return FollowerAction::Truncate(truncation_offset(
            own_epochs,
            own_log_end,
            epoch,
            end_offset,
        ));
    }
    FollowerAction::Append
}

/// A follower's high watermark: the leader's, within its own log. Unlike a
/// leader's it may move backwards (a new leader may know a lower one), so it
/// is set, not advanced; followers serve no consumers from it.
pub fn follower_high_watermark(leader_high_watermark: Offset, own_log_end: Offset) -> Offset {
    leader_high_watermark.min(own_log_end).max(Offset::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(offset: i64) -> Offset {
        Offset(offset)
    }

    fn answer() -> LeaderAnswer {
        LeaderAnswer {
            error: ErrorCode::None,
            high_watermark: o(50),
            log_start_offset: o(0),
            log_end_offset: Some(o(60)),
            diverging: None,
        }
    }

    #[test]
    fn a_follower_below_the_leaders_log_start_restarts_there() {
        let out_of_range = LeaderAnswer {
            error: ErrorCode::OffsetOutOfRange,
            log_start_offset: o(1_000),
            log_end_offset: Some(o(1_500)),
            ..answer()
        };
        assert_eq!(
            decide(&out_of_range, o(200), &EpochHistory::default()),
            FollowerAction::RestartAt(o(1_000))
        );
        // Ahead of the leader's end: cut back to it.
        let ahead = LeaderAnswer {
            log_start_offset: o(0),
            log_end_offset: Some(o(150)),
            ..out_of_range
        };
        assert_eq!(
            decide(&ahead, o(200), &EpochHistory::default()),
            FollowerAction::Truncate(o(150))
        );
    }

    #[test]
    fn divergence_cuts_and_errors_back_off() {
        let own = EpochHistory::from_entries(vec![(LeaderEpoch(1), o(0)), (LeaderEpoch(2), o(40))]);
        let diverging = LeaderAnswer {
            diverging: Some((LeaderEpoch(1), o(30))),
            ..answer()
        };
        assert_eq!(
            decide(&diverging, o(45), &own),
            FollowerAction::Truncate(o(30))
        );
        assert_eq!(decide(&answer(), o(45), &own), FollowerAction::Append);
        let refused = LeaderAnswer {
            error: ErrorCode::NotLeaderOrFollower,
            ..answer()
        };
        assert_eq!(decide(&refused, o(45), &own), FollowerAction::Retry);
    }

    #[test]
    fn the_follower_high_watermark_may_go_down() {
        assert_eq!(follower_high_watermark(o(50), o(40)), o(40));
        assert_eq!(follower_high_watermark(o(30), o(40)), o(30));
        assert_eq!(follower_high_watermark(o(-1), o(40)), o(0));
    }
}
