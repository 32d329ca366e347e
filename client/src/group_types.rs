//! The client's own types for consumer groups: what `messages.rs` decodes
//! the group APIs into and builds them from, and what `GroupConsumer` and
//! `Admin` hand to callers. Plain data and pure parsing; no flatbuffers, no
//! I/O, no clock (callers pass the time).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use protocol::{GroupEpoch, MemberEpoch};

use crate::accumulator::TopicPartition;
use crate::metadata::join_host_port;

/// Bound on partitions one group request or response may name (a member's
/// owned partitions, an assignment, a commit, a fetch of committed offsets);
/// the coordinator refuses more.
pub const GROUP_PARTITIONS_MAX: usize = 100_000;
/// Bound on the topics a member subscribes to; the coordinator refuses more.
pub const SUBSCRIBED_TOPICS_MAX: usize = 1_000;
/// Bound on members decoded from one DescribeGroup answer.
pub const GROUP_MEMBERS_MAX: usize = 1_000;
/// Bound on the groups decoded from one ListGroups answer.
pub const GROUP_LISTINGS_MAX: usize = 1_000_000;
/// Longest group id, instance id or topic name a request may carry.
pub const GROUP_ID_BYTES_MAX: usize = 255;
/// Longest member id the coordinator accepts.
pub const MEMBER_ID_BYTES_MAX: usize = 64;

/// Where a group's coordinator is: the shard endpoint that leads the
/// group's partition of `__consumer_offsets`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoordinatorInfo {
    pub node_id: i32,
    pub host: String,
    pub port: u16,
    pub shard: u16,
}

impl CoordinatorInfo {
    /// `HOST:PORT` of the coordinator shard, for `Cluster::connection`.
    pub fn address(&self) -> String {
        join_host_port(&self.host, self.port)
    }
}

/// One GroupHeartbeat request (KIP-848's ConsumerGroupHeartbeat).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeartbeatRequest {
    pub group_id: String,
    /// Chosen by the member itself before it first joins.
    pub member_id: String,
    /// `MemberEpoch::JOIN` to join, `LEAVE`/`LEAVE_STATIC` to leave, else
    /// the epoch of the last answer.
    pub member_epoch: MemberEpoch,
    /// Set for a static member (`group.instance.id`).
    pub instance_id: Option<String>,
    pub client_id: String,
    pub session_timeout_ms: u32,
    pub rebalance_timeout_ms: u32,
    /// `None`: unchanged since the last heartbeat.
    pub subscribed_topics: Option<Vec<String>>,
    /// `None`: the group's assignor.
    pub assignor: Option<String>,
    /// Every partition the member owns now; `None`: unchanged.
    pub owned: Option<Vec<TopicPartition>>,
}

/// The coordinator's answer to a heartbeat.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeartbeatResponse {
    pub member_id: String,
    pub member_epoch: MemberEpoch,
    /// How long the member may wait before its next heartbeat; 0 when the
    /// coordinator did not say.
    pub heartbeat_interval_ms: u32,
    /// Everything the member may own now: its full assignment.
    pub assignment: BTreeSet<TopicPartition>,
}

/// A committed offset of a group, as OffsetFetch and DescribeGroup report it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommittedOffset {
    /// The offset of the next record the group reads.
    pub offset: i64,
    pub metadata: String,
    /// Wall-clock time of the commit, ms since the epoch.
    pub commit_time_ms: i64,
}

/// A group as `Admin::list_groups` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupListing {
    pub group_id: String,
    /// `empty`, `reconciling` or `stable`.
    pub state: String,
    pub members: u32,
}

/// One member of a group as DescribeGroup reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupMemberDescription {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub member_epoch: MemberEpoch,
    pub state: String,
    pub subscribed_topics: Vec<String>,
    /// What the member owns now.
    pub assigned: BTreeSet<TopicPartition>,
    /// What the member was asked to give up and has not yet.
    pub pending_revocation: BTreeSet<TopicPartition>,
    /// What the member will own once the group has reconciled.
    pub target: BTreeSet<TopicPartition>,
}

/// One partition of a group with how far the group is behind on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupPartitionDescription {
    pub topic: String,
    pub partition: i32,
    /// The member that owns (or is giving up) the partition.
    pub owner: Option<String>,
    /// `None`: nothing committed.
    pub committed_offset: Option<i64>,
    /// `None`: the partition's leader could not be asked.
    pub log_end_offset: Option<i64>,
    /// Records between the committed offset and the log end.
    pub lag_records: Option<i64>,
    /// Now minus the timestamp of the record at the committed offset; 0 when
    /// caught up, `None` when unknown.
    pub lag_ms: Option<i64>,
}

/// A group as `Admin::describe_group` reports it. The DescribeGroup decoder
/// fills everything but `partitions`, which `Admin` adds from ListOffsets
/// and fetches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupDescription {
    pub group_id: String,
    pub state: String,
    pub group_epoch: GroupEpoch,
    pub target_epoch: GroupEpoch,
    pub assignor: String,
    pub members: Vec<GroupMemberDescription>,
    pub offsets: BTreeMap<TopicPartition, CommittedOffset>,
    /// Sorted by topic and partition.
    pub partitions: Vec<GroupPartitionDescription>,
}

impl GroupDescription {
    /// The member that owns `tp` or is giving it up.
    pub fn owner_of(&self, tp: &TopicPartition) -> Option<&str> {
        self.members
            .iter()
            .find(|m| m.assigned.contains(tp) || m.pending_revocation.contains(tp))
            .map(|m| m.member_id.as_str())
    }
}

/// Where `Admin::reset_offsets` moves a group's committed offsets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetTo {
    /// Each partition's log start.
    Earliest,
    /// Each partition's log end: skip everything produced so far.
    Latest,
    /// This offset, clamped into each partition's `[log start, log end]`.
    Offset(i64),
    /// The first record at or after this time (ms since the epoch); the log
    /// end when there is none.
    Timestamp(i64),
    /// As `Timestamp(now - duration)`.
    Back(Duration),
}

/// Bound on a `-DURATION` of `ResetTo::parse`: 10 years.
const RESET_BACK_MS_MAX: u64 = 10 * 366 * 24 * 3_600_000;

impl ResetTo {
    /// Parses `earliest`, `latest`, an offset, `@TIMESTAMP_MS` or
    /// `-DURATION` (a number with unit `ms`, `s`, `m`, `h` or `d`:
    /// `-30s`, `-10m`, `-1h`).
    pub fn parse(text: &str) -> Result<ResetTo, String> {
        match text {
            "earliest" => return Ok(ResetTo::Earliest),
            "latest" => return Ok(ResetTo::Latest),
            _ => {}
        }
        if let Some(ms) = text.strip_prefix('@') {
            return match ms.parse::<i64>() {
                Ok(ms) if ms >= 0 => Ok(ResetTo::Timestamp(ms)),
                _ => Err(format!("`{text}` is not @TIMESTAMP_MS")),
            };
        }
        if let Some(back) = text.strip_prefix('-') {
            return parse_duration(back)
                .map(ResetTo::Back)
                .map_err(|reason| format!("`{text}`: {reason}"));
        }
        match text.parse::<i64>() {
            Ok(offset) if offset >= 0 => Ok(ResetTo::Offset(offset)),
            _ => Err(format!(
                "`{text}` is not earliest, latest, an offset, @TIMESTAMP_MS or -DURATION"
            )),
        }
    }

    /// The ListOffsets timestamp this target asks for at `now_ms`, or the
    /// offset itself for `Offset`.
    pub fn timestamp_ms(self, now_ms: i64) -> Option<i64> {
        match self {
            ResetTo::Timestamp(ms) => Some(ms),
            ResetTo::Back(back) => {
                let back_ms = i64::try_from(back.as_millis()).unwrap_or(i64::MAX);
                Some(now_ms.saturating_sub(back_ms).max(0))
            }
            ResetTo::Earliest | ResetTo::Latest | ResetTo::Offset(_) => None,
        }
    }
}

/// `10m`, `1h`, `30s`, `500ms`, `2d`: a whole number and a unit.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| "the duration has no unit (ms, s, m, h or d)".to_owned())?;
    let (number, unit) = text.split_at(split);
    let count: u64 = number
        .parse()
        .map_err(|_| format!("`{number}` is not a whole number"))?;
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("unknown unit `{unit}` (ms, s, m, h or d)")),
    };
    let ms = count
        .checked_mul(unit_ms)
        .filter(|ms| *ms <= RESET_BACK_MS_MAX)
        .ok_or_else(|| "the duration is longer than 10 years".to_owned())?;
    Ok(Duration::from_millis(ms))
}

/// One partition of `Admin::reset_offsets`: its committed offset before and
/// the one it was (or, on a dry run, would be) reset to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionReset {
    pub partition: i32,
    /// `None`: nothing was committed.
    pub old_offset: Option<i64>,
    pub new_offset: i64,
}

/// Clamps a requested offset into a partition's `[log_start, log_end]`, as
/// `ResetTo::Offset` promises.
pub fn clamp_offset(offset: i64, log_start_offset: i64, log_end_offset: i64) -> i64 {
    assert!(
        log_start_offset <= log_end_offset,
        "log start {log_start_offset} is past log end {log_end_offset}"
    );
    offset.clamp(log_start_offset, log_end_offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_targets_parse() {
        // Proves every `--to` form of `ringlog group reset` parses, with the
        // duration units, and that malformed ones are refused.
        assert_eq!(ResetTo::parse("earliest"), Ok(ResetTo::Earliest));
        assert_eq!(ResetTo::parse("latest"), Ok(ResetTo::Latest));
        assert_eq!(ResetTo::parse("42"), Ok(ResetTo::Offset(42)));
        assert_eq!(ResetTo::parse("@1700"), Ok(ResetTo::Timestamp(1700)));
        assert_eq!(
            ResetTo::parse("-10m"),
            Ok(ResetTo::Back(Duration::from_secs(600)))
        );
        assert_eq!(
            ResetTo::parse("-1h"),
            Ok(ResetTo::Back(Duration::from_secs(3600)))
        );
        assert_eq!(
            ResetTo::parse("-30s"),
            Ok(ResetTo::Back(Duration::from_secs(30)))
        );
        assert_eq!(
            ResetTo::parse("-250ms"),
            Ok(ResetTo::Back(Duration::from_millis(250)))
        );
        assert_eq!(
            ResetTo::parse("-2d"),
            Ok(ResetTo::Back(Duration::from_secs(2 * 86_400)))
        );
        for bad in [
            "",
            "-",
            "-10",
            "-m",
            "-10x",
            "-1.5h",
            "@",
            "@-5",
            "@x",
            "x",
            "-99999999999d",
        ] {
            assert!(ResetTo::parse(bad).is_err(), "`{bad}` must be refused");
        }
    }

    #[test]
    fn reset_timestamps_and_clamping() {
        // Proves a duration back resolves against the given now (never below
        // 0) and that an explicit offset is clamped into the log.
        let back = ResetTo::Back(Duration::from_secs(10));
        assert_eq!(back.timestamp_ms(100_000), Some(90_000));
        assert_eq!(back.timestamp_ms(5_000), Some(0));
        assert_eq!(ResetTo::Timestamp(7).timestamp_ms(100), Some(7));
        assert_eq!(ResetTo::Latest.timestamp_ms(100), None);
        assert_eq!(clamp_offset(5, 10, 20), 10);
        assert_eq!(clamp_offset(15, 10, 20), 15);
        assert_eq!(clamp_offset(25, 10, 20), 20);
    }
}
