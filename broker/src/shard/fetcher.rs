//! A follower's fetch loop towards one leader shard endpoint: one task per
//! endpoint per shard, fetching every partition this shard follows there in
//! one request (`replica_id` = this broker, with its broker epoch), applying
//! what comes back, and ending when no partition here follows that endpoint
//! any more.
//!
//! A follower fetches from its log end only once everything below it is
//! stable under its flush policy (written to the file, or synced under
//! `always`): the leader counts a fetch offset as held by this replica, and
//! the high watermark, hence acks=all, relies on it. So a kill -9 of every
//! broker at once cannot lose an acknowledged record.

use std::rc::Rc;
use std::time::Duration;

use protocol::replica_fetch::{decode_fetch_response, encode_replica_fetch, ReplicaFetchPartition};
use protocol::{ApiKey, LeaderEpoch};

use super::{Replica, Shard};
use crate::log::LogError;
use crate::partition::PartitionKey;
use crate::runtime;
use crate::runtime::peer::PeerConnection;

/// Long-poll wait of a follower fetch: short enough to pick up new
/// partitions and role changes promptly.
pub const FOLLOWER_FETCH_WAIT_MS: i32 = 500;
/// Bytes asked per partition per fetch.
pub const FOLLOWER_PARTITION_BYTES_MAX: i32 = 4 << 20;
/// Bound on one fetch response from a leader.
pub const FOLLOWER_RESPONSE_BYTES_MAX: u32 = 80 << 20;
/// Connect and request bound beyond the long poll.
pub const FOLLOWER_REQUEST_MS_MAX: u64 = 5_000;
/// Pause after a failed fetch or a partition-level error.
pub const FOLLOWER_BACKOFF_MS: u64 = 100;

pub async fn run(shard: Rc<Shard>, endpoint: String) {
    let mut connection: Option<PeerConnection> = None;
    let me = shard.broker_id().0;
    // The leader fills a response in request order, within its bound: each
    // fetch starts one partition further on, so a follower catching up on
    // many partitions moves all of them, not only the first few.
    let mut first = 0usize;
    loop {
        let followers = shard.followers_of(&endpoint);
        if followers.is_empty() || shard.stopping.get() {
            break;
        }
        if connection.is_none() {
            match PeerConnection::open(
                &endpoint,
                FOLLOWER_RESPONSE_BYTES_MAX,
                FOLLOWER_REQUEST_MS_MAX,
            )
            .await
            {
                Ok(c) => connection = Some(c),
                Err(e) => {
                    tracing::debug!(leader = %endpoint, error = %e, "cannot reach the leader");
                    runtime::sleep(Duration::from_millis(FOLLOWER_BACKOFF_MS)).await;
                    continue;
                }
            }
        }
        let followers = make_stable(&shard, followers).await;
        if followers.is_empty() {
            runtime::sleep(Duration::from_millis(FOLLOWER_BACKOFF_MS)).await;
            continue;
        }
        let mut partitions: Vec<ReplicaFetchPartition> = followers
            .iter()
            .map(|(key, replica, epoch)| ReplicaFetchPartition {
                topic: key.topic.clone(),
                partition: key.partition,
                fetch_offset: replica.log.log_end_offset().0,
                current_leader_epoch: *epoch,
                last_fetched_epoch: replica
                    .core
                    .borrow()
                    .epochs()
                    .latest_epoch()
                    .unwrap_or(LeaderEpoch::NONE),
            })
            .collect();
        let turn = first % partitions.len();
        partitions.rotate_left(turn);
        first = first.wrapping_add(1);
        let body = encode_replica_fetch(
            me,
            i64::try_from(shard.broker_epoch.get()).unwrap_or(-1),
            FOLLOWER_FETCH_WAIT_MS,
            FOLLOWER_PARTITION_BYTES_MAX,
            &partitions,
        );
        let response = connection
            .as_mut()
            .expect("opened above")
            .call(
                ApiKey::Fetch as u16,
                &body,
                &[],
                FOLLOWER_FETCH_WAIT_MS as u64,
            )
            .await;
        let results = match response {
            Ok(response) => decode_fetch_response(response.body(), &response.payload()),
            Err(e) => Err(e.to_string()),
        };
        let mut results = match results {
            Ok(results) => results,
            Err(e) => {
                tracing::debug!(leader = %endpoint, error = %e, "follower fetch failed");
                connection = None;
                runtime::sleep(Duration::from_millis(FOLLOWER_BACKOFF_MS)).await;
                continue;
            }
        };
        let mut trouble = false;
        for (key, replica, epoch) in &followers {
            let Some(fetched) = results.remove(&(key.topic.clone(), key.partition)) else {
                continue;
            };
            if let Err(e) = shard.apply_fetched(key, replica, *epoch, fetched).await {
                tracing::debug!(leader = %endpoint, topic = %key.topic, partition = key.partition, error = %e.message, "follower fetch not applied");
                trouble = true;
            }
        }
        if trouble {
            runtime::sleep(Duration::from_millis(FOLLOWER_BACKOFF_MS)).await;
        }
    }
    shard.fetchers.borrow_mut().remove(&endpoint);
}

/// Makes every follower's log stable up to its end before it fetches again
/// (the fetch offset tells the leader what this replica holds). A replica
/// whose log cannot be made stable (a full or failing disk) sits this round
/// out instead of claiming records it may lose.
async fn make_stable(shard: &Rc<Shard>, followers: Vec<Follower>) -> Vec<Follower> {
    let waits: Vec<_> = followers
        .iter()
        .map(|(_, replica, _)| {
            let replica = replica.clone();
            runtime::spawn(async move {
                let end = replica.log.log_end_offset();
                replica.log.wait_for_ack(end).await
            })
        })
        .collect();
    let mut stable = Vec::with_capacity(followers.len());
    for (follower, wait) in followers.into_iter().zip(waits) {
        match wait.await {
            Ok(()) => stable.push(follower),
            // Shutting down: the log closed under this round.
            Err(LogError::Closed) => {}
            Err(e) => {
                shard.metrics.on_storage_error();
                tracing::warn!(topic = %follower.0.topic, partition = follower.0.partition, error = %e, "follower log not stable; not fetching for it");
            }
        }
    }
    stable
}

type Follower = (PartitionKey, Rc<Replica>, LeaderEpoch);
