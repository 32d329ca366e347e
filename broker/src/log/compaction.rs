//! Compaction decisions, free of I/O: when a log is worth cleaning and up to
//! where, the bounded key map a pass builds from the dirty part, how closed
//! segments group into rewritten ones, and which record survives. The cleaning
//! pass in `partition_log::compact` reads and writes the files; everything it
//! decides comes from here, so it is tested against a model without a disk.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use protocol::{BatchHeader, Offset, ProducerId};

use super::config::LogConfig;
use super::txn_index::AbortedTxn;

/// Bytes one key map entry costs, hash table overhead included; the cleaner's
/// memory budget divided by this bounds the entries of one pass.
pub const OFFSET_MAP_ENTRY_BYTES: usize = 40;

/// A 128-bit hash of a record key. Two keys colliding would make the cleaner
/// drop one key's latest value, so the hash is wide enough that this does not
/// happen in practice (as Kafka's 16-byte MD5 map keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KeyHash(u128);

impl KeyHash {
    pub fn of(key: &[u8]) -> KeyHash {
        // Two independent SipHash-1-3 runs (std's hasher with different
        // prefixes); the map lives for one pass only, so the hash need not be
        // stable across builds.
        let half = |salt: u8| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            salt.hash(&mut h);
            key.hash(&mut h);
            h.finish()
        };
        KeyHash((u128::from(half(0x5a)) << 64) | u128::from(half(0xa5)))
    }
}

/// Latest offset per key hash over the dirty part of a log, with a fixed
/// number of entries: a pass covers as much of the dirty part as fits and the
/// next pass goes on from there.
#[derive(Debug)]
pub struct OffsetMap {
    entries: HashMap<KeyHash, Offset>,
    entries_max: usize,
}

impl OffsetMap {
    pub fn new(entries_max: usize) -> OffsetMap {
        assert!(entries_max > 0, "a key map holds at least one key");
        OffsetMap {
            entries: HashMap::new(),
            entries_max,
        }
    }

    pub fn with_memory_bytes(memory_bytes: usize) -> OffsetMap {
        OffsetMap::new((memory_bytes / OFFSET_MAP_ENTRY_BYTES).max(1))
    }

    /// Records `offset` as the latest of `key`; false when the map is full
    /// and `key` is new (the pass ends before this record).
    pub fn insert(&mut self, key: KeyHash, offset: Offset) -> bool {
        if let Some(latest) = self.entries.get_mut(&key) {
            assert!(offset > *latest, "the map is built in offset order");
            *latest = offset;
            return true;
        }
        if self.entries.len() == self.entries_max {
            return false;
        }
        self.entries.insert(key, offset);
        true
    }

    pub fn latest(&self, key: KeyHash) -> Option<Offset> {
        self.entries.get(&key).copied()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// What the planner needs to know about a segment.
#[derive(Clone, Copy, Debug)]
pub struct SegmentView {
    pub base: Offset,
    pub next_offset: Offset,
    pub size_bytes: u64,
    pub max_timestamp_ms: i64,
    /// Closed segments are immutable and synced; only they are cleaned.
    pub closed: bool,
}

/// A pass worth running: the dirty part is `[dirty_start, cleanable_end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CleanPlan {
    pub dirty_start: Offset,
    /// Base of the first segment the pass may not touch.
    pub cleanable_end: Offset,
    pub dirty_ratio_permille: u32,
    /// Cleaned because a dirty segment passed `max_compaction_lag_ms`, not
    /// because of the ratio.
    pub forced: bool,
}

/// The share of the cleanable log that is dirty, in thousandths, and where the
/// cleanable part ends: at the first segment that is not closed, reaches past
/// `end_limit` (the high watermark, the durable offset), or holds a record
/// younger than `min_compaction_lag_ms`.
pub fn dirty_ratio(
    config: &LogConfig,
    segments: &[SegmentView],
    cleaned_to: Offset,
    end_limit: Offset,
    now_ms: i64,
) -> (u32, Offset) {
    let mut cleanable_end = segments.first().map_or(Offset::ZERO, |s| s.base);
    let (mut clean_bytes, mut dirty_bytes) = (0u64, 0u64);
    for segment in segments {
        let too_young =
            now_ms.saturating_sub(segment.max_timestamp_ms) < config.min_compaction_lag_ms;
        if !segment.closed || segment.next_offset > end_limit || too_young {
            break;
        }
        if segment.next_offset <= cleaned_to {
            clean_bytes += segment.size_bytes;
        } else {
            dirty_bytes += segment.size_bytes;
        }
        cleanable_end = segment.next_offset;
    }
    let total = clean_bytes + dirty_bytes;
    let ratio = (dirty_bytes * 1000).checked_div(total).unwrap_or(0) as u32;
    (ratio, cleanable_end)
}

/// Whether to clean now, and what.
pub fn plan(
    config: &LogConfig,
    segments: &[SegmentView],
    cleaned_to: Offset,
    end_limit: Offset,
    now_ms: i64,
) -> Option<CleanPlan> {
    if !config.cleanup_policy.compact {
        return None;
    }
    let (ratio, cleanable_end) = dirty_ratio(config, segments, cleaned_to, end_limit, now_ms);
    let log_start = segments.first()?.base;
    let dirty_start = cleaned_to.max(log_start);
    if dirty_start >= cleanable_end {
        return None;
    }
    let forced = segments.iter().any(|s| {
        s.base >= dirty_start
            && s.next_offset <= cleanable_end
            && s.max_timestamp_ms >= 0
            && now_ms.saturating_sub(s.max_timestamp_ms) >= config.max_compaction_lag_ms
    });
    if ratio < config.min_cleanable_dirty_ratio_permille && !forced {
        return None;
    }
    Some(CleanPlan {
        dirty_start,
        cleanable_end,
        dirty_ratio_permille: ratio,
        forced,
    })
}

/// Consecutive segments (indices into `segments`, which are all rewritten)
/// grouped so each group's current bytes fit one segment and its offsets fit
/// the 32-bit relative offsets of the indexes: cleaning shrinks segments, and
/// grouping keeps a compacted log from being thousands of tiny files.
pub fn group_segments(
    segments: &[SegmentView],
    segment_size_bytes: u64,
) -> Vec<std::ops::Range<usize>> {
    let mut groups = Vec::new();
    let mut start = 0;
    let mut bytes = 0u64;
    for (i, segment) in segments.iter().enumerate() {
        let fits = bytes + segment.size_bytes <= segment_size_bytes
            && segment.next_offset.0 - segments[start].base.0 <= i64::from(u32::MAX);
        if i > start && !fits {
            groups.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes += segment.size_bytes;
    }
    if start < segments.len() {
        groups.push(start..segments.len());
    }
    groups
}

/// One record as the keep decision sees it.
#[derive(Clone, Copy, Debug)]
pub struct RecordView {
    pub offset: Offset,
    pub key: Option<KeyHash>,
    pub tombstone: bool,
    pub timestamp_ms: i64,
}

/// The aborted transactions a pass must drop: a transactional batch of a
/// producer inside one of its aborted ranges (first batch to abort marker)
/// is never a key's latest value and is removed from the log, as Kafka's
/// cleaner does; its marker stays.
#[derive(Clone, Debug, Default)]
pub struct AbortedRanges {
    by_producer: HashMap<ProducerId, Vec<(Offset, Offset)>>,
}

impl AbortedRanges {
    pub fn new(aborted: &[AbortedTxn]) -> AbortedRanges {
        let mut by_producer: HashMap<ProducerId, Vec<(Offset, Offset)>> = HashMap::new();
        for t in aborted {
            by_producer
                .entry(t.producer_id)
                .or_default()
                .push((t.first_offset, t.last_offset));
        }
        AbortedRanges { by_producer }
    }

    /// Whether the batch is data of an aborted transaction.
    pub fn is_aborted(&self, header: &BatchHeader) -> bool {
        if !header.is_transactional() || header.is_control() {
            return false;
        }
        self.by_producer
            .get(&header.producer_id)
            .is_some_and(|ranges| {
                ranges
                    .iter()
                    .any(|(first, last)| *first <= header.base_offset && header.base_offset < *last)
            })
    }
}

/// What a pass knows when it decides each record's fate.
#[derive(Clone, Copy, Debug)]
pub struct KeepRule {
    /// The map covers the dirty records below this offset; records at or
    /// after it are kept as they are.
    pub map_end: Offset,
    /// Where the dirty part began: a tombstone below it was kept by an
    /// earlier pass, so consumers have had the chance to see it.
    pub dirty_start: Offset,
    pub delete_retention_ms: i64,
    pub now_ms: i64,
}

impl KeepRule {
    /// Whether `record` stays: it is the latest value of its key (no later
    /// record of that key lies below `map_end`), and if it is a tombstone,
    /// its delete retention has not run out yet. Records without a key are
    /// kept (a topic can turn compacted after they were written).
    pub fn keep(&self, map: &OffsetMap, record: &RecordView) -> bool {
        let Some(key) = record.key else {
            return true;
        };
        if record.offset >= self.map_end {
            return true;
        }
        if map.latest(key).is_some_and(|latest| latest > record.offset) {
            return false;
        }
        let expired_tombstone = record.tombstone
            && record.offset < self.dirty_start
            && self.now_ms.saturating_sub(record.timestamp_ms) > self.delete_retention_ms;
        !expired_tombstone
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::config::CleanupPolicy;

    fn config() -> LogConfig {
        LogConfig {
            cleanup_policy: CleanupPolicy::COMPACT,
            min_cleanable_dirty_ratio_permille: 500,
            ..LogConfig::default()
        }
    }

    fn seg(base: i64, next: i64, size: u64, ts: i64, closed: bool) -> SegmentView {
        SegmentView {
            base: Offset(base),
            next_offset: Offset(next),
            size_bytes: size,
            max_timestamp_ms: ts,
            closed,
        }
    }

    #[test]
    fn plans_only_closed_segments_below_the_limit_and_past_the_lag() {
        let segments = [
            seg(0, 10, 100, 1_000, true),
            seg(10, 20, 100, 2_000, true),
            seg(20, 30, 100, 3_000, true),
            seg(30, 35, 50, 4_000, false),
        ];
        let p = plan(&config(), &segments, Offset::ZERO, Offset(100), 10_000).unwrap();
        assert_eq!(p.cleanable_end, Offset(30));
        assert_eq!(p.dirty_ratio_permille, 1000);
        let limited = plan(&config(), &segments, Offset::ZERO, Offset(15), 10_000).unwrap();
        assert_eq!(limited.cleanable_end, Offset(10));
        let lagged = LogConfig {
            min_compaction_lag_ms: 7_500,
            ..config()
        };
        assert_eq!(
            plan(&lagged, &segments, Offset::ZERO, Offset(100), 10_000)
                .unwrap()
                .cleanable_end,
            Offset(20)
        );
        assert_eq!(
            plan(
                &LogConfig::default(),
                &segments,
                Offset::ZERO,
                Offset(100),
                10_000
            ),
            None,
            "a delete-only log is never compacted"
        );
    }

    #[test]
    fn the_dirty_ratio_gates_a_pass_unless_the_max_lag_forces_it() {
        let segments = [
            seg(0, 10, 300, 1_000, true),
            seg(10, 20, 100, 9_000, true),
            seg(20, 25, 10, 9_500, false),
        ];
        assert_eq!(
            plan(&config(), &segments, Offset(10), Offset(100), 10_000),
            None,
            "a quarter dirty is below the ratio"
        );
        let forcing = LogConfig {
            max_compaction_lag_ms: 500,
            ..config()
        };
        let p = plan(&forcing, &segments, Offset(10), Offset(100), 10_000).unwrap();
        assert!(p.forced);
        assert_eq!((p.dirty_start, p.cleanable_end), (Offset(10), Offset(20)));
        assert_eq!(
            plan(&config(), &segments, Offset(20), Offset(100), 10_000),
            None,
            "nothing dirty"
        );
    }

    #[test]
    fn groups_fit_one_segment() {
        let segments = [
            seg(0, 10, 400, 0, true),
            seg(10, 20, 400, 0, true),
            seg(20, 30, 400, 0, true),
            seg(30, 40, 1_500, 0, true),
            seg(40, 50, 10, 0, true),
        ];
        assert_eq!(
            group_segments(&segments, 1_000),
            vec![0..2, 2..3, 3..4, 4..5]
        );
        assert_eq!(group_segments(&segments, 10_000), vec![0..5]);
        assert!(group_segments(&[], 10).is_empty());
    }

    #[test]
    fn the_map_is_bounded_but_updates_known_keys() {
        let mut map = OffsetMap::new(2);
        let (a, b, c) = (KeyHash::of(b"a"), KeyHash::of(b"b"), KeyHash::of(b"c"));
        assert!(map.insert(a, Offset(1)));
        assert!(map.insert(b, Offset(2)));
        assert!(!map.insert(c, Offset(3)), "full");
        assert!(map.insert(a, Offset(4)), "a known key still updates");
        assert_eq!(map.latest(a), Some(Offset(4)));
        assert_eq!(map.latest(c), None);
        assert_ne!(KeyHash::of(b"ab"), KeyHash::of(b"ba"));
    }

    #[test]
    fn keeps_the_latest_value_and_young_tombstones() {
        let mut map = OffsetMap::new(10);
        let k = KeyHash::of(b"k");
        map.insert(k, Offset(15));
        let rule = KeepRule {
            map_end: Offset(20),
            dirty_start: Offset(10),
            delete_retention_ms: 1_000,
            now_ms: 10_000,
        };
        let record = |offset, tombstone, timestamp_ms| RecordView {
            offset: Offset(offset),
            key: Some(k),
            tombstone,
            timestamp_ms,
        };
        assert!(!rule.keep(&map, &record(5, false, 0)), "superseded");
        assert!(rule.keep(&map, &record(15, false, 0)), "latest");
        assert!(rule.keep(&map, &record(25, false, 0)), "past the map");
        assert!(
            rule.keep(&map, &record(15, true, 0)),
            "a tombstone first kept"
        );
        let other = KeyHash::of(b"other");
        let old_tombstone = RecordView {
            offset: Offset(3),
            key: Some(other),
            tombstone: true,
            timestamp_ms: 0,
        };
        assert!(!rule.keep(&map, &old_tombstone), "kept before, now expired");
        let young_tombstone = RecordView {
            timestamp_ms: 9_500,
            ..old_tombstone
        };
        assert!(rule.keep(&map, &young_tombstone));
        let keyless = RecordView {
            key: None,
            ..record(1, false, 0)
        };
        assert!(rule.keep(&map, &keyless));
    }
}
