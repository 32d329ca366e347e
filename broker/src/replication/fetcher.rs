//! A follower's fetch loop towards one leader shard endpoint: one task per
//! endpoint per shard, fetching every partition this shard follows there in
//! one request (`replica_id` = this broker), applying what comes back, and
//! ending when no partition here follows that endpoint any more.

use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use protocol::{ApiKey, ErrorCode};

use crate::handlers::fetch::{decode_fetch_response, encode_replica_fetch, ReplicaFetchPartition};
use crate::net::peer::PeerConnection;
use crate::runtime;
use crate::shard::Shard;

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

/// What a follower applies for one partition.
#[derive(Clone, Debug, Default)]
pub struct Fetched {
    pub high_watermark: i64,
    pub diverging: Option<(i32, i64)>,
    pub records: Bytes,
}

pub async fn run(shard: Rc<Shard>, endpoint: String) {
    let mut connection: Option<PeerConnection> = None;
    let me = shard.broker_id().0;
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
        let partitions: Vec<ReplicaFetchPartition> = followers
            .iter()
            .map(|(key, replica, epoch)| ReplicaFetchPartition {
                key: key.clone(),
                fetch_offset: replica.log.log_end_offset().0,
                current_leader_epoch: *epoch,
                last_fetched_epoch: replica.epochs.borrow().latest_epoch().unwrap_or(-1),
            })
            .collect();
        let body = encode_replica_fetch(
            me,
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
        let results = match results {
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
            let Some(result) = results.get(key) else {
                continue;
            };
            if result.error != ErrorCode::None {
                tracing::debug!(leader = %endpoint, topic = %key.topic, partition = key.partition, error = %result.error, "leader refused a follower fetch");
                trouble = true;
                continue;
            }
            let fetched = Fetched {
                high_watermark: result.high_watermark,
                diverging: result.diverging,
                records: result.records.clone(),
            };
            if let Err(e) = shard.apply_fetched(key, replica, *epoch, fetched).await {
                tracing::warn!(topic = %key.topic, partition = key.partition, error = %e.message, "applying fetched records failed");
                trouble = true;
            }
        }
        if trouble {
            runtime::sleep(Duration::from_millis(FOLLOWER_BACKOFF_MS)).await;
        }
    }
    shard.fetchers.borrow_mut().remove(&endpoint);
}
