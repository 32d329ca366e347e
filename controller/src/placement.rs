//! Pure placement of a new topic's replicas, leaders and shards across live brokers.
//! Deterministic for the same input; it only decides the new topic and never moves
//! an existing assignment.
//!
//! How it balances. Replica slots are dealt round-robin over the brokers (sorted
//! by id) as one stream starting at `start_offset`: partition `p` takes slots
//! `p*rf .. p*rf + rf`, so a partition's replicas are distinct (`rf <= n`) and the
//! replica counts of any two brokers differ by at most one. The leader is the
//! replica at position `j = (p / (n/g)) % g` within its slots, with `g = gcd(n, rf)`:
//! the stream repeats every `n/g` partitions with slot starts on the multiples of
//! `g`, and shifting by `j` in successive repeats makes any `n` consecutive
//! partitions have `n` distinct leaders, so leader counts differ by at most one.
//! Within a broker, each replica goes to the shard with the fewest replicas so far
//! (existing plus new), lowest index first.

use crate::ids::{BrokerId, ShardIndex};
use crate::records::Replica;

/// A live broker as placement sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacementBroker {
    pub id: BrokerId,
    /// Replicas already on each shard of this broker; its length is the shard count.
    pub shard_replica_counts: Vec<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("partition count must be positive")]
    NoPartitions,
    #[error("replication factor {replication_factor} with {live_broker_count} live brokers")]
    ReplicationFactor {
        replication_factor: u16,
        live_broker_count: usize,
    },
    #[error("broker {0} has no shards")]
    NoShards(BrokerId),
    #[error("broker {0} listed twice")]
    DuplicateBroker(BrokerId),
}

/// Places `partition_count` partitions of `replication_factor` replicas each. The
/// first replica of each returned list is the partition's initial leader.
/// `start_offset` rotates where the stream begins (the caller passes something that
/// differs between topics, e.g. the topic id) so small topics do not all start on
/// the lowest broker.
pub fn place_topic(
    brokers: &[PlacementBroker],
    partition_count: u32,
    replication_factor: u16,
    start_offset: u64,
) -> Result<Vec<Vec<Replica>>, PlacementError> {
    validate(brokers, partition_count, replication_factor)?;
    let mut sorted: Vec<PlacementBroker> = brokers.to_vec();
    sorted.sort_by_key(|b| b.id);

    let broker_count = sorted.len();
    let rf = usize::from(replication_factor);
    let g = gcd(broker_count, rf);
    let period = broker_count / g;
    let start = usize::try_from(start_offset % broker_count as u64).expect("below broker count");

    let mut placed = Vec::with_capacity(partition_count as usize);
    for p in 0..partition_count as usize {
        let first_slot = start + p * rf;
        let leader_position = (p / period) % g;
        debug_assert!(leader_position < rf);
        let mut replicas = Vec::with_capacity(rf);
        for k in 0..rf {
            // Leader first, then the others in stream order.
            let position = (leader_position + k) % rf;
            let broker = &mut sorted[(first_slot + position) % broker_count];
            let shard = take_least_loaded_shard(&mut broker.shard_replica_counts);
            replicas.push(Replica {
                broker_id: broker.id,
                shard,
            });
        }
        placed.push(replicas);
    }
    assert_eq!(placed.len(), partition_count as usize);
    Ok(placed)
}

fn validate(
    brokers: &[PlacementBroker],
    partition_count: u32,
    replication_factor: u16,
) -> Result<(), PlacementError> {
    if partition_count == 0 {
        return Err(PlacementError::NoPartitions);
    }
    if replication_factor == 0 || usize::from(replication_factor) > brokers.len() {
        return Err(PlacementError::ReplicationFactor {
            replication_factor,
            live_broker_count: brokers.len(),
        });
    }
    let mut ids: Vec<BrokerId> = brokers.iter().map(|b| b.id).collect();
    ids.sort();
    if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
        return Err(PlacementError::DuplicateBroker(w[0]));
    }
    if let Some(b) = brokers.iter().find(|b| b.shard_replica_counts.is_empty()) {
        return Err(PlacementError::NoShards(b.id));
    }
    if let Some(b) = brokers
        .iter()
        .find(|b| b.shard_replica_counts.len() > usize::from(u16::MAX))
    {
        return Err(PlacementError::NoShards(b.id));
    }
    Ok(())
}

fn take_least_loaded_shard(counts: &mut [u32]) -> ShardIndex {
    let (index, _) = counts
        .iter()
        .enumerate()
        .min_by_key(|&(i, c)| (*c, i))
        .expect("validated: every broker has a shard");
    counts[index] = counts[index].saturating_add(1);
    ShardIndex(u16::try_from(index).expect("validated: shard count fits u16"))
}

fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    fn brokers(ids: &[u32], shard_count: usize) -> Vec<PlacementBroker> {
        ids.iter()
            .map(|&id| PlacementBroker {
                id: BrokerId(id),
                shard_replica_counts: vec![0; shard_count],
            })
            .collect()
    }

    /// Checks every property placement promises; returns nothing, panics on a violation.
    fn check_balanced(input: &[PlacementBroker], placed: &[Vec<Replica>], rf: u16) {
        let mut leaders: BTreeMap<BrokerId, usize> = input.iter().map(|b| (b.id, 0)).collect();
        let mut replicas = leaders.clone();
        let mut shards: BTreeMap<(BrokerId, u16), usize> = BTreeMap::new();
        for partition in placed {
            assert_eq!(partition.len(), usize::from(rf));
            let mut ids: Vec<BrokerId> = partition.iter().map(|r| r.broker_id).collect();
            ids.sort();
            ids.dedup();
            assert_eq!(
                ids.len(),
                usize::from(rf),
                "replicas of a partition must be distinct"
            );
            *leaders
                .get_mut(&partition[0].broker_id)
                .expect("known broker") += 1;
            for r in partition {
                *replicas.get_mut(&r.broker_id).expect("known broker") += 1;
                let shard_count = input
                    .iter()
                    .find(|b| b.id == r.broker_id)
                    .map(|b| b.shard_replica_counts.len());
                assert!(usize::from(r.shard.0) < shard_count.expect("known broker"));
                *shards.entry((r.broker_id, r.shard.0)).or_default() += 1;
            }
        }
        let spread = |m: &BTreeMap<BrokerId, usize>| {
            m.values().max().copied().unwrap_or(0) - m.values().min().copied().unwrap_or(0)
        };
        assert!(spread(&leaders) <= 1, "leaders unbalanced: {leaders:?}");
        assert!(spread(&replicas) <= 1, "replicas unbalanced: {replicas:?}");
        for b in input {
            let counts: Vec<usize> = (0..b.shard_replica_counts.len())
                .map(|s| shards.get(&(b.id, s as u16)).copied().unwrap_or(0))
                .collect();
            let max = counts.iter().max().copied().unwrap_or(0);
            let min = counts.iter().min().copied().unwrap_or(0);
            assert!(
                max - min <= 1,
                "shards of broker {} unbalanced: {counts:?}",
                b.id
            );
        }
    }

    // Leaders and replicas spread evenly in the awkward case gcd(n, rf) > 1.
    #[test]
    fn balances_leaders_when_rf_divides_broker_count() {
        let input = brokers(&[1, 2, 3, 4], 2);
        for partition_count in 1..=12 {
            let placed = place_topic(&input, partition_count, 2, 0).expect("valid");
            check_balanced(&input, &placed, 2);
        }
    }

    // The same input always gives the same placement, whatever the broker order.
    #[test]
    fn is_deterministic_and_ignores_input_order() {
        let input = brokers(&[7, 3, 5, 1, 9], 3);
        let mut reversed = input.clone();
        reversed.reverse();
        let a = place_topic(&input, 17, 3, 42).expect("valid");
        let b = place_topic(&reversed, 17, 3, 42).expect("valid");
        assert_eq!(a, b);
        assert_eq!(a, place_topic(&input, 17, 3, 42).expect("valid"));
    }

    // Shards that already hold replicas get the new ones last.
    #[test]
    fn prefers_least_loaded_shards() {
        let input = vec![PlacementBroker {
            id: BrokerId(1),
            shard_replica_counts: vec![5, 0, 1],
        }];
        let placed = place_topic(&input, 3, 1, 0).expect("valid");
        let shards: Vec<u16> = placed.iter().map(|p| p[0].shard.0).collect();
        assert_eq!(shards, vec![1, 1, 2]);
    }

    // Impossible requests are refused with a typed error, not a partial placement.
    #[test]
    fn refuses_impossible_requests() {
        let input = brokers(&[1, 2], 1);
        assert_eq!(
            place_topic(&input, 0, 1, 0),
            Err(PlacementError::NoPartitions)
        );
        assert_eq!(
            place_topic(&input, 1, 3, 0),
            Err(PlacementError::ReplicationFactor {
                replication_factor: 3,
                live_broker_count: 2
            })
        );
        assert_eq!(
            place_topic(&brokers(&[1], 0), 1, 1, 0),
            Err(PlacementError::NoShards(BrokerId(1)))
        );
        assert_eq!(
            place_topic(&brokers(&[1, 1], 1), 1, 1, 0),
            Err(PlacementError::DuplicateBroker(BrokerId(1)))
        );
    }

    proptest! {
        // Balance and determinism hold for any broker set, partition count, rf and offset.
        #[test]
        fn balanced_for_random_inputs(
            ids in proptest::collection::btree_set(0u32..1000, 1..12),
            shard_count in 1usize..5,
            partition_count in 1u32..200,
            rf_seed in 0u16..12,
            start_offset in any::<u64>(),
        ) {
            let ids: Vec<u32> = ids.into_iter().collect();
            let rf = rf_seed % ids.len() as u16 + 1;
            let input = brokers(&ids, shard_count);
            let placed = place_topic(&input, partition_count, rf, start_offset).expect("valid");
            check_balanced(&input, &placed, rf);
            prop_assert_eq!(placed, place_topic(&input, partition_count, rf, start_offset).expect("valid"));
        }
    }
}
