//! Recent batches of this shard's partitions, kept in memory so tailing
//! consumers are served without touching the disk (direct I/O bypasses the
//! page cache). Bounded in bytes per shard; the oldest batches go first.
//!
//! A batch is kept as the producer's bytes (shared with the request frame, not
//! copied) plus the base offset and epoch the log stamped; a read sends a
//! freshly stamped 16-byte prefix followed by a slice of the rest.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;
use protocol::record_batch::{field, stamp};
use protocol::{LeaderEpoch, Offset};

use crate::partition::{Chunks, PartitionKey};

/// Bytes of the batch header that stamping rewrites (base offset, length, epoch).
const STAMPED_PREFIX_BYTES: usize = field::MAGIC;

#[derive(Debug)]
struct Cached {
    base: Offset,
    next: Offset,
    epoch: LeaderEpoch,
    bytes: Bytes,
}

#[derive(Debug)]
pub struct BatchCache {
    bytes_max: usize,
    bytes: usize,
    partitions: HashMap<PartitionKey, VecDeque<Cached>>,
    /// Insertion order across partitions, for eviction.
    order: VecDeque<(PartitionKey, Offset)>,
}

impl BatchCache {
    pub fn new(bytes_max: usize) -> BatchCache {
        BatchCache {
            bytes_max,
            bytes: 0,
            partitions: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Adds a stored batch; batches of a partition must arrive in offset order.
    pub fn insert(
        &mut self,
        key: &PartitionKey,
        base: Offset,
        next: Offset,
        epoch: LeaderEpoch,
        bytes: Bytes,
    ) {
        assert!(
            bytes.len() > STAMPED_PREFIX_BYTES,
            "a batch is longer than its stamped prefix"
        );
        if bytes.len() > self.bytes_max {
            return;
        }
        let entries = self.partitions.entry(key.clone()).or_default();
        if entries.back().is_some_and(|last| last.next != base) {
            // A gap (truncation, restart): the cached run is no longer contiguous.
            let dropped: usize = entries.iter().map(|c| c.bytes.len()).sum();
            entries.clear();
            self.bytes -= dropped;
        }
        self.bytes += bytes.len();
        entries.push_back(Cached {
            base,
            next,
            epoch,
            bytes,
        });
        self.order.push_back((key.clone(), base));
        while self.bytes > self.bytes_max {
            self.evict_oldest();
        }
    }

    fn evict_oldest(&mut self) {
        let Some((key, base)) = self.order.pop_front() else {
            return;
        };
        if let Some(entries) = self.partitions.get_mut(&key) {
            if entries.front().is_some_and(|c| c.base == base) {
                let gone = entries.pop_front().expect("front exists");
                self.bytes -= gone.bytes.len();
            }
            if entries.is_empty() {
                self.partitions.remove(&key);
            }
        }
    }

    /// Drops a partition's cached batches that end at or below `end`: the
    /// log rewrote them (compaction), and readers must get the new ones.
    pub fn discard_below(&mut self, key: &PartitionKey, end: Offset) {
        let Some(entries) = self.partitions.get_mut(key) else {
            return;
        };
        while entries.front().is_some_and(|c| c.next <= end) {
            let gone = entries.pop_front().expect("front exists");
            self.bytes -= gone.bytes.len();
        }
        if entries.is_empty() {
            self.partitions.remove(key);
        }
    }

    pub fn remove_partition(&mut self, key: &PartitionKey) {
        if let Some(entries) = self.partitions.remove(key) {
            self.bytes -= entries.iter().map(|c| c.bytes.len()).sum::<usize>();
        }
    }

    /// Whole batches from the one holding `offset`, up to `max_bytes` (the first
    /// always) and ending at or below `end`; `None` if `offset` is not cached.
    pub fn read(
        &self,
        key: &PartitionKey,
        offset: Offset,
        max_bytes: usize,
        end: Offset,
    ) -> Option<(Chunks, Offset)> {
        let entries = self.partitions.get(key)?;
        let first = entries.partition_point(|c| c.next <= offset);
        let start = entries.get(first).filter(|c| c.base <= offset)?;
        if start.next > end {
            return None;
        }
        let mut out = Chunks::default();
        let mut next = offset;
        for cached in entries.range(first..) {
            if cached.next > end || (!out.is_empty() && out.len() + cached.bytes.len() > max_bytes)
            {
                break;
            }
            let mut prefix = cached.bytes[..protocol::BATCH_HEADER_BYTES].to_vec();
            stamp(&mut prefix, cached.base, cached.epoch);
            prefix.truncate(STAMPED_PREFIX_BYTES);
            out.push(Bytes::from(prefix));
            out.push(cached.bytes.slice(STAMPED_PREFIX_BYTES..));
            next = cached.next;
        }
        Some((out, next))
    }

    pub fn size_bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BATCH_BYTES: usize = 115;

    fn batch(tag: u8) -> Bytes {
        let mut builder = protocol::BatchBuilder::new(protocol::Compression::None);
        for _ in 0..2 {
            builder.push(&protocol::Record {
                timestamp_ms: 1,
                key: None,
                value: Some(&[tag; 20]),
                headers: &[],
            });
        }
        let bytes = builder.build().unwrap();
        assert_eq!(bytes.len(), BATCH_BYTES);
        Bytes::from(bytes)
    }

    fn key() -> PartitionKey {
        PartitionKey {
            topic: "t".into(),
            partition: 0,
        }
    }

    /// Reads return contiguous stamped batches within the bounds; the cache
    /// stays within its byte bound by evicting the oldest, and a gap clears a run.
    #[test]
    fn serves_contiguous_stamped_batches_and_evicts_oldest() {
        let mut cache = BatchCache::new(3 * BATCH_BYTES);
        for i in 0..5i64 {
            cache.insert(
                &key(),
                Offset(i * 2),
                Offset(i * 2 + 2),
                LeaderEpoch(3),
                batch(i as u8),
            );
        }
        assert_eq!(cache.size_bytes(), 3 * BATCH_BYTES, "bounded");
        assert!(
            cache
                .read(&key(), Offset(0), 100_000, Offset(100))
                .is_none(),
            "evicted"
        );
        let (bytes, next) = cache
            .read(&key(), Offset(5), BATCH_BYTES + 1, Offset(100))
            .unwrap();
        assert_eq!(
            (bytes.len(), next),
            (BATCH_BYTES, Offset(6)),
            "the batch holding 5; max_bytes stops the next"
        );
        let joined: Vec<u8> = bytes.into_parts().concat();
        let served = protocol::RecordBatch::parse(&joined, 1 << 20).expect("served batch is valid");
        assert_eq!(
            served.header().base_offset,
            Offset(4),
            "stamped with its base offset"
        );
        assert_eq!(
            served.header().partition_leader_epoch,
            LeaderEpoch(3),
            "and its epoch"
        );
        let (bytes, next) = cache.read(&key(), Offset(4), 100_000, Offset(8)).unwrap();
        assert_eq!(
            (bytes.len(), next),
            (2 * BATCH_BYTES, Offset(8)),
            "end bound"
        );
        cache.insert(&key(), Offset(50), Offset(52), LeaderEpoch(3), batch(9));
        assert!(
            cache
                .read(&key(), Offset(8), 100_000, Offset(100))
                .is_none(),
            "gap cleared the run"
        );
        assert_eq!(cache.size_bytes(), BATCH_BYTES);
    }

    /// After compaction rewrote a range, reads of it miss the cache (and go to
    /// the log) while later batches are still served.
    #[test]
    fn discarding_below_an_offset_keeps_the_rest() {
        let mut cache = BatchCache::new(10 * BATCH_BYTES);
        for i in 0..4i64 {
            cache.insert(
                &key(),
                Offset(i * 2),
                Offset(i * 2 + 2),
                LeaderEpoch(1),
                batch(i as u8),
            );
        }
        cache.discard_below(&key(), Offset(5));
        assert!(cache.read(&key(), Offset(0), 1 << 20, Offset(8)).is_none());
        assert!(cache.read(&key(), Offset(3), 1 << 20, Offset(8)).is_none());
        assert!(cache.read(&key(), Offset(4), 1 << 20, Offset(8)).is_some());
        assert_eq!(cache.size_bytes(), 2 * BATCH_BYTES);
        cache.discard_below(&key(), Offset(100));
        assert_eq!(cache.size_bytes(), 0);
    }
}
