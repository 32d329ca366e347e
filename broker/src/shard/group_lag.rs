//! The lag of the groups this shard coordinates, for `/metrics`: every
//! `[groups] lag_probe_interval_ms` each committed partition is probed with one
//! consumer fetch at the committed offset, on this broker through the mesh
//! or on another broker over a peer connection. The answer's high watermark
//! gives the lag in records, and the timestamp of the first record at or
//! after the committed offset the lag in seconds (how old the oldest record
//! the group has not consumed is).

use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use protocol::replica_fetch::{decode_fetch_response, encode_consumer_fetch};
use protocol::{ApiKey, Offset, RecordBatch};

use super::{Isolation, Shard, ShardOp, ShardReply};
use crate::log::config::STORED_BATCH_BYTES_MAX;
use crate::partition::PartitionKey;
use crate::runtime;
use crate::runtime::peer::PeerConnection;

/// Partitions one shard probes per round; the rest are not exported.
pub const GROUP_LAG_PROBES_MAX: usize = 10_000;
/// Bytes of the first batch a probe asks for at the committed offset.
const LAG_PROBE_BYTES_MAX: i32 = 64 << 10;
/// Bound on one probe's round trip to another broker.
const LAG_PROBE_MS_MAX: u64 = 2_000;

/// What a probe of one group's partition found.
#[derive(Clone, Copy, Debug)]
pub struct LagSample {
    pub high_watermark: i64,
    /// Timestamp of the first record at or after the committed offset;
    /// `None` when the group is caught up (or the record was not read).
    pub first_unread_timestamp_ms: Option<i64>,
}

/// (group, topic, partition).
pub type LagKey = (String, String, i32);

impl Shard {
    /// Probes the lag of this shard's groups, forever.
    pub async fn run_group_lag(self: Rc<Self>) {
        while !self.stopping.get() {
            runtime::sleep(Duration::from_millis(
                self.config.groups.lag_probe_interval_ms,
            ))
            .await;
            if self.coordinators.is_empty() {
                continue;
            }
            self.refresh_group_lag().await;
        }
    }

    async fn refresh_group_lag(self: &Rc<Self>) {
        let mut targets: Vec<(LagKey, i64)> = Vec::new();
        self.coordinators.for_each_active(|core| {
            for summary in core.list_groups() {
                let Ok(description) = core.describe_group(&summary.group_id) else {
                    continue;
                };
                for (tp, committed) in description.offsets {
                    if targets.len() < GROUP_LAG_PROBES_MAX {
                        let key = (summary.group_id.clone(), tp.topic, tp.partition.0 as i32);
                        targets.push((key, committed.offset));
                    }
                }
            }
        });
        let mut peers: HashMap<String, PeerConnection> = HashMap::new();
        let mut samples = HashMap::new();
        for (key, committed) in targets {
            let partition = PartitionKey {
                topic: key.1.clone(),
                partition: key.2,
            };
            if let Some(sample) = self.probe_lag(&partition, committed, &mut peers).await {
                samples.insert(key, sample);
            }
        }
        *self.group_lag.borrow_mut() = samples;
    }

    async fn probe_lag(
        self: &Rc<Self>,
        key: &PartitionKey,
        committed: i64,
        peers: &mut HashMap<String, PeerConnection>,
    ) -> Option<LagSample> {
        let (leader_here, shard, endpoint) = {
            let view = self.view.borrow();
            let record = view.partition(&key.topic, key.partition)?;
            let leader = record.leader?;
            let shard = record.replica_on(leader)?.shard.0;
            let endpoint = view
                .brokers
                .get(&leader)?
                .endpoints
                .shards
                .get(usize::from(shard))?
                .clone();
            (leader == self.broker_id(), usize::from(shard), endpoint)
        };
        let (high_watermark, records) = if leader_here {
            let op = ShardOp::Fetch {
                key: key.clone(),
                offset: Offset(committed),
                max_bytes: LAG_PROBE_BYTES_MAX as usize,
                wait_ms: 0,
                replica: None,
                isolation: Isolation::ReadUncommitted,
            };
            let ShardReply::Fetch(outcome) = self.call(shard, op).await else {
                return None;
            };
            let parts = outcome.records.into_parts();
            let bytes = if parts.len() == 1 {
                parts[0].clone()
            } else {
                Bytes::from(parts.concat())
            };
            (outcome.high_watermark.0, bytes)
        } else {
            if !peers.contains_key(&endpoint) {
                let connection = PeerConnection::open(
                    &endpoint,
                    self.config.frame_size_bytes_max,
                    LAG_PROBE_MS_MAX,
                )
                .await
                .ok()?;
                peers.insert(endpoint.clone(), connection);
            }
            let connection = peers.get_mut(&endpoint)?;
            let body = encode_consumer_fetch(
                0,
                LAG_PROBE_BYTES_MAX,
                &[(key.topic.clone(), key.partition, committed)],
            );
            let response = match connection.call(ApiKey::Fetch as u16, &body, &[], 0).await {
                Ok(r) => r,
                Err(_) => {
                    peers.remove(&endpoint);
                    return None;
                }
            };
            let mut decoded = decode_fetch_response(response.body(), &response.payload()).ok()?;
            let answer = decoded.remove(&(key.topic.clone(), key.partition))?;
            (answer.high_watermark, answer.records)
        };
        if high_watermark < 0 {
            return None;
        }
        let first_unread_timestamp_ms = if committed < high_watermark {
            first_timestamp_at(&records, committed, self.config.log.decompressed_bytes_max)
        } else {
            None
        };
        Some(LagSample {
            high_watermark,
            first_unread_timestamp_ms,
        })
    }
}

/// The timestamp of the first data record at or after `offset` in stored
/// batches; `None` when there is none or the bytes do not parse.
pub fn first_timestamp_at(
    mut bytes: &[u8],
    offset: i64,
    decompressed_bytes_max: usize,
) -> Option<i64> {
    while !bytes.is_empty() {
        let total = usize::try_from(protocol::record_batch::peek_total_bytes(bytes)?).ok()?;
        if total > bytes.len() {
            return None;
        }
        let batch = RecordBatch::parse(&bytes[..total], STORED_BATCH_BYTES_MAX).ok()?;
        bytes = &bytes[total..];
        let header = batch.header();
        if header.is_control() || header.last_offset().0 < offset {
            continue;
        }
        let section = batch.records_section(decompressed_bytes_max).ok()?;
        for record in section.iter() {
            let record = record.ok()?;
            if record.offset.0 >= offset {
                return Some(record.timestamp_ms);
            }
        }
    }
    None
}
