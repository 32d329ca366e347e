//! A follower's decisions on its leader's answer for one partition: cut a
//! diverged suffix, restart from the leader's log start when the leader no
//! longer has what comes next, append, or back off; and the follower's high
//! watermark. Pure: the fetcher and the shard do the I/O these ask for.

use protocol::ErrorCode;

use super::epochs::{truncation_offset, EpochHistory};

/// The leader's answer for one partition, as the decision needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaderAnswer {
    pub error: ErrorCode,
    pub high_watermark: i64,
    pub log_start_offset: i64,
    pub log_end_offset: i64,
    /// Where the follower's log parts from the leader's: (epoch, end offset).
    pub diverging: Option<(i32, i64)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FollowerAction {
    /// Append the records sent (if any), then take the high watermark.
    Append,
    /// Cut the log at this offset first (everything at or after it goes).
    Truncate(i64),
    /// The leader's log starts after this replica's log end (retention moved
    /// on while it was away): drop the whole log and start empty at this
    /// offset (Kafka's truncate-fully-and-start-at).
    RestartAt(i64),
    /// The leader refused; ask again after a pause.
    Retry,
}

pub fn decide(
    answer: &LeaderAnswer,
    own_log_end: i64,
    own_epochs: &EpochHistory,
) -> FollowerAction {
    if answer.error == ErrorCode::OffsetOutOfRange {
        if answer.log_start_offset > own_log_end {
            return FollowerAction::RestartAt(answer.log_start_offset);
        }
        if answer.log_end_offset >= 0 && own_log_end > answer.log_end_offset {
            // Ahead of the leader with nothing to tell the epochs apart: what
            // lies past the leader's end was never committed.
            return FollowerAction::Truncate(answer.log_end_offset);
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
pub fn follower_high_watermark(leader_high_watermark: i64, own_log_end: i64) -> i64 {
    leader_high_watermark.min(own_log_end).max(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer() -> LeaderAnswer {
        LeaderAnswer {
            error: ErrorCode::None,
            high_watermark: 50,
            log_start_offset: 0,
            log_end_offset: 60,
            diverging: None,
        }
    }

    #[test]
    fn a_follower_below_the_leaders_log_start_restarts_there() {
        let out_of_range = LeaderAnswer {
            error: ErrorCode::OffsetOutOfRange,
            log_start_offset: 1_000,
            log_end_offset: 1_500,
            ..answer()
        };
        assert_eq!(
            decide(&out_of_range, 200, &EpochHistory::default()),
            FollowerAction::RestartAt(1_000)
        );
        // Ahead of the leader's end: cut back to it.
        let ahead = LeaderAnswer {
            log_start_offset: 0,
            log_end_offset: 150,
            ..out_of_range
        };
        assert_eq!(
            decide(&ahead, 200, &EpochHistory::default()),
            FollowerAction::Truncate(150)
        );
    }

    #[test]
    fn divergence_cuts_and_errors_back_off() {
        let own = EpochHistory::from_entries(vec![(1, 0), (2, 40)]);
        let diverging = LeaderAnswer {
            diverging: Some((1, 30)),
            ..answer()
        };
        assert_eq!(decide(&diverging, 45, &own), FollowerAction::Truncate(30));
        assert_eq!(decide(&answer(), 45, &own), FollowerAction::Append);
        let refused = LeaderAnswer {
            error: ErrorCode::NotLeaderOrFollower,
            ..answer()
        };
        assert_eq!(decide(&refused, 45, &own), FollowerAction::Retry);
    }

    #[test]
    fn the_follower_high_watermark_may_go_down() {
        assert_eq!(follower_high_watermark(50, 40), 40);
        assert_eq!(follower_high_watermark(30, 40), 30);
        assert_eq!(follower_high_watermark(-1, 40), 0);
    }
}
