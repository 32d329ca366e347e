//! `Partitioner`: picks a record's partition. Keyed records use Kafka's
//! murmur2 so that Ringlog and Kafka clients agree on where a key lives;
//! records without a key stick to one partition per batch, rotating when the
//! batch is sealed, so they spread without making many tiny batches.

use std::collections::HashMap;

/// Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`), bit for bit.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let length = data.len();
    let mut h: u32 = SEED ^ (length as u32);
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition of a keyed record among `partition_count` partitions.
pub fn partition_for_key(key: &[u8], partition_count: usize) -> i32 {
    assert!(partition_count > 0, "a topic has at least one partition");
    ((murmur2(key) & 0x7fff_ffff) as u32 % partition_count as u32) as i32
}

/// Sticky choice for records without a key, one current partition per topic.
#[derive(Debug)]
pub struct Partitioner {
    sticky: HashMap<String, i32>,
    /// Rotates the starting point so that producers do not all start on partition 0.
    next: u32,
}

impl Partitioner {
    /// `seed` picks the first sticky partition; any value is fine.
    pub fn new(seed: u32) -> Partitioner {
        Partitioner {
            sticky: HashMap::new(),
            next: seed,
        }
    }

    pub fn partition(&mut self, topic: &str, key: Option<&[u8]>, partition_count: usize) -> i32 {
        assert!(partition_count > 0, "a topic has at least one partition");
        if let Some(key) = key {
            return partition_for_key(key, partition_count);
        }
        if let Some(&partition) = self.sticky.get(topic) {
            if (partition as usize) < partition_count {
                return partition;
            }
        }
        let partition = (self.next % partition_count as u32) as i32;
        self.next = self.next.wrapping_add(1);
        self.sticky.insert(topic.to_owned(), partition);
        partition
    }

    /// A batch of `partition` was sealed: unkeyed records move on to the
    /// next partition, if that was the sticky one.
    pub fn batch_sealed(&mut self, topic: &str, partition: i32) {
        if self.sticky.get(topic) == Some(&partition) {
            self.sticky.remove(topic);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_kafka_vectors() {
        // Proves the hash is Kafka's, bit for bit, including the tail cases
        // (0, 2 and 6 bytes: empty, a half word, a word plus a half word).
        assert_eq!(murmur2(b"21"), -973_932_308);
        assert_eq!(murmur2(b"foobar"), -790_332_482);
        assert_eq!(murmur2(b""), 275_646_681);
    }

    #[test]
    fn same_key_same_partition_and_keys_cover_partitions() {
        // Proves keyed partitioning is a pure function of key and partition
        // count, lands in range, and spreads distinct keys over all partitions.
        let mut partitioner = Partitioner::new(0);
        let mut seen = [false; 8];
        for i in 0..1000 {
            let key = format!("key-{i}");
            let first = partitioner.partition("t", Some(key.as_bytes()), 8);
            let second = partitioner.partition("t", Some(key.as_bytes()), 8);
            assert_eq!(first, second);
            assert_eq!(first, partition_for_key(key.as_bytes(), 8));
            seen[first as usize] = true;
        }
        assert!(
            seen.iter().all(|s| *s),
            "keys reached every partition: {seen:?}"
        );
        // Kafka places key "21" in (murmur2 & 0x7fffffff) % n.
        assert_eq!(
            partition_for_key(b"21", 7),
            ((-973_932_308i32 & 0x7fff_ffff) % 7)
        );
    }

    #[test]
    fn null_keys_stick_per_batch_and_rotate_over_all_partitions() {
        // Proves unkeyed records stay on one partition until its batch is
        // sealed, then move on, visiting every partition.
        let mut partitioner = Partitioner::new(7);
        let partition_count = 5;
        let mut seen = vec![0usize; partition_count];
        for _batch in 0..partition_count * 2 {
            let sticky = partitioner.partition("t", None, partition_count);
            for _ in 0..10 {
                assert_eq!(partitioner.partition("t", None, partition_count), sticky);
            }
            seen[sticky as usize] += 1;
            partitioner.batch_sealed("t", sticky);
        }
        assert!(seen.iter().all(|n| *n == 2), "even spread: {seen:?}");
        // Sealing another partition's batch does not move the sticky one.
        let sticky = partitioner.partition("t", None, partition_count);
        partitioner.batch_sealed("t", (sticky + 1) % partition_count as i32);
        assert_eq!(partitioner.partition("t", None, partition_count), sticky);
    }
}
