//! Recent batches of this shard's partitions, kept in memory so tailing
//! consumers are served without touching the disk (direct I/O bypasses the
//! page cache). Bounded in bytes per shard; the oldest batches go first.

use std::collections::{HashMap, VecDeque};
use std::rc::Rc;

use protocol::Offset;

use crate::shard::PartitionKey;

#[derive(Debug)]
struct Cached {
    base: Offset,
    next: Offset,
    bytes: Rc<[u8]>,
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
    pub fn insert(&mut self, key: &PartitionKey, base: Offset, next: Offset, bytes: Rc<[u8]>) {
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
        entries.push_back(Cached { base, next, bytes });
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
    ) -> Option<(Vec<u8>, Offset)> {
        let entries = self.partitions.get(key)?;
        let first = entries.partition_point(|c| c.next <= offset);
        let start = entries.get(first).filter(|c| c.base <= offset)?;
        if start.next > end {
            return None;
        }
        let mut out = Vec::new();
        let mut next = offset;
        for cached in entries.range(first..) {
            if cached.next > end || (!out.is_empty() && out.len() + cached.bytes.len() > max_bytes)
            {
                break;
            }
            out.extend_from_slice(&cached.bytes);
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

    fn key() -> PartitionKey {
        PartitionKey {
            topic: "t".into(),
            partition: 0,
        }
    }

    #[test]
    fn serves_contiguous_batches_and_evicts_oldest() {
        let mut cache = BatchCache::new(30);
        for i in 0..5i64 {
            cache.insert(
                &key(),
                Offset(i * 2),
                Offset(i * 2 + 2),
                vec![i as u8; 10].into(),
            );
        }
        assert_eq!(cache.size_bytes(), 30, "bounded");
        assert!(
            cache.read(&key(), Offset(0), 100, Offset(100)).is_none(),
            "evicted"
        );
        let (bytes, next) = cache.read(&key(), Offset(5), 15, Offset(100)).unwrap();
        assert_eq!(
            (bytes.len(), next),
            (10, Offset(6)),
            "first batch holds offset 5; max_bytes stops the second"
        );
        let (bytes, next) = cache.read(&key(), Offset(4), 100, Offset(8)).unwrap();
        assert_eq!((bytes.len(), next), (20, Offset(8)), "end bound");
        cache.insert(&key(), Offset(50), Offset(51), vec![9; 5].into());
        assert!(
            cache.read(&key(), Offset(8), 100, Offset(100)).is_none(),
            "gap cleared the run"
        );
        assert_eq!(cache.size_bytes(), 5);
    }
}
