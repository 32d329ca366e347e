//! Pure decisions about segments: when the active segment rolls and which old
//! segments retention deletes. No I/O, so they are tested exhaustively.

use protocol::Offset;

use super::config::LogConfig;

/// What the roll decision needs to know about the active segment.
#[derive(Clone, Copy, Debug)]
pub struct ActiveSummary {
    pub base: Offset,
    pub next_offset: Offset,
    pub size_bytes: u64,
    pub created_ms: i64,
}

/// Whether a batch of `batch_bytes` ending at `batch_next_offset` must go into a
/// new segment. An empty segment never rolls, so any single batch fits somewhere.
pub fn should_roll(
    config: &LogConfig,
    active: ActiveSummary,
    batch_bytes: u64,
    batch_next_offset: Offset,
    now_ms: i64,
) -> bool {
    if active.size_bytes == 0 {
        return false;
    }
    let too_big = active.size_bytes + batch_bytes > config.segment_size_bytes;
    let too_old = now_ms.saturating_sub(active.created_ms) >= config.segment_age_ms;
    // Relative offsets in the indexes are u32.
    let too_many_offsets = batch_next_offset.0 - active.base.0 > i64::from(u32::MAX);
    too_big || too_old || too_many_offsets
}

/// What retention needs to know about a segment.
#[derive(Clone, Copy, Debug)]
pub struct SegmentSummary {
    pub next_offset: Offset,
    pub size_bytes: u64,
    pub max_timestamp_ms: i64,
    /// Closed segments are immutable and fully on disk; only they may be deleted.
    pub closed: bool,
}

/// How many segments, from the oldest, retention deletes now. Only closed
/// segments wholly below `end_limit` (the offset consumers may still need, for
/// example the high watermark) are candidates, and deletion stops at the first
/// segment that is kept, so the log stays contiguous.
pub fn segments_to_delete(
    config: &LogConfig,
    segments: &[SegmentSummary],
    end_limit: Offset,
    now_ms: i64,
) -> usize {
    if !config.cleanup_policy.delete {
        return 0;
    }
    let mut total_bytes: u64 = segments.iter().map(|s| s.size_bytes).sum();
    let mut count = 0;
    for segment in segments {
        if !segment.closed || segment.next_offset > end_limit {
            break;
        }
        let expired = config.retention_ms.is_some_and(|ms| {
            segment.max_timestamp_ms >= 0 && now_ms - segment.max_timestamp_ms > ms
        });
        let over_size = config
            .retention_bytes
            .is_some_and(|bytes| total_bytes - segment.size_bytes >= bytes);
        if !(expired || over_size) {
            break;
        }
        total_bytes -= segment.size_bytes;
        count += 1;
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> LogConfig {
        LogConfig {
            segment_size_bytes: 1000,
            segment_age_ms: 60_000,
            retention_ms: Some(10_000),
            retention_bytes: Some(250),
            ..LogConfig::default()
        }
    }

    fn seg(next: i64, size: u64, ts: i64, closed: bool) -> SegmentSummary {
        SegmentSummary {
            next_offset: Offset(next),
            size_bytes: size,
            max_timestamp_ms: ts,
            closed,
        }
    }

    #[test]
    fn roll_on_size_age_and_offset_span_but_never_empty() {
        let c = config();
        let active = ActiveSummary {
            base: Offset(0),
            next_offset: Offset(10),
            size_bytes: 900,
            created_ms: 0,
        };
        assert!(!should_roll(&c, active, 100, Offset(11), 0));
        assert!(should_roll(&c, active, 101, Offset(11), 0));
        assert!(should_roll(&c, active, 1, Offset(11), 60_000));
        assert!(should_roll(
            &c,
            active,
            1,
            Offset(i64::from(u32::MAX) + 1),
            0
        ));
        let empty = ActiveSummary {
            size_bytes: 0,
            next_offset: Offset(0),
            ..active
        };
        assert!(!should_roll(&c, empty, 5000, Offset(1), 1 << 40));
    }

    #[test]
    fn retention_deletes_expired_and_oversized_prefix_only() {
        let mut c = config();
        c.retention_bytes = None;
        let segments = [
            seg(10, 100, 1_000, true),
            seg(20, 100, 50_000, true),
            seg(30, 100, 2_000, true),
            seg(40, 10, 0, false),
        ];
        // The third segment is expired too, but the second is kept, so deletion stops there.
        assert_eq!(segments_to_delete(&c, &segments, Offset(100), 55_000), 1);
        assert_eq!(
            segments_to_delete(&c, &segments, Offset(5), 55_000),
            0,
            "end limit protects"
        );
        assert_eq!(
            segments_to_delete(&c, &segments, Offset(100), 70_000),
            3,
            "active never deleted"
        );
    }

    #[test]
    fn retention_by_size_keeps_at_least_the_bound() {
        let mut c = config();
        c.retention_ms = None;
        let segments = [
            seg(10, 100, 0, true),
            seg(20, 100, 0, true),
            seg(30, 100, 0, true),
            seg(40, 100, 0, false),
        ];
        // 400 bytes, bound 250: deleting one leaves 300 >= 250; a second would leave 200 < 250.
        assert_eq!(segments_to_delete(&c, &segments, Offset(100), 0), 1);
        c.retention_bytes = Some(200);
        assert_eq!(segments_to_delete(&c, &segments, Offset(100), 0), 2);
    }
}
