//! The follower's side of Fetch: the request a follower sends its leader
//! (`replica_id` = its broker id, with its broker epoch) and the decoding of
//! the leader's answer. The leader's side is the broker's fetch handler.

use std::collections::HashMap;

use bytes::Bytes;
use flatbuffers::FlatBufferBuilder;

use crate::wire;
use crate::{ErrorCode, LeaderEpoch};

/// One partition of a follower's fetch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaFetchPartition {
    pub topic: String,
    pub partition: i32,
    pub fetch_offset: i64,
    pub current_leader_epoch: LeaderEpoch,
    /// The epoch of the follower's last batch; -1 when its log is empty.
    pub last_fetched_epoch: LeaderEpoch,
}

/// The body of a follower's fetch.
pub fn encode_replica_fetch(
    replica_id: u32,
    replica_epoch: i64,
    max_wait_ms: i32,
    partition_bytes_max: i32,
    partitions: &[ReplicaFetchPartition],
) -> Vec<u8> {
    let replica_id = i32::try_from(replica_id).unwrap_or(i32::MAX);
    encode_fetch(
        replica_id,
        replica_epoch,
        max_wait_ms,
        partition_bytes_max,
        partitions,
    )
}

/// The body of a consumer's fetch (no replica id: it reads below the high
/// watermark), as a broker sends it to probe another broker's partitions
/// (the lag of a consumer group: the high watermark and the record at the
/// committed offset). Epochs are -1: any leader answers.
pub fn encode_consumer_fetch(
    max_wait_ms: i32,
    partition_bytes_max: i32,
    partitions: &[(String, i32, i64)],
) -> Vec<u8> {
    let partitions: Vec<ReplicaFetchPartition> = partitions
        .iter()
        .map(|(topic, partition, fetch_offset)| ReplicaFetchPartition {
            topic: topic.clone(),
            partition: *partition,
            fetch_offset: *fetch_offset,
            current_leader_epoch: LeaderEpoch(-1),
            last_fetched_epoch: LeaderEpoch(-1),
        })
        .collect();
    encode_fetch(-1, -1, max_wait_ms, partition_bytes_max, &partitions)
}

fn encode_fetch(
    replica_id: i32,
    replica_epoch: i64,
    max_wait_ms: i32,
    partition_bytes_max: i32,
    partitions: &[ReplicaFetchPartition],
) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    // In the caller's exact order: the leader fills the response in request
    // order and callers rotate it, so a topic whose partitions are not
    // together in that order appears once per run of them.
    let mut by_topic: Vec<(&str, Vec<_>)> = Vec::new();
    for p in partitions {
        let entry = wire::FetchPartition::create(
            &mut fbb,
            &wire::FetchPartitionArgs {
                partition: p.partition,
                fetch_offset: p.fetch_offset,
                max_bytes: partition_bytes_max,
                current_leader_epoch: p.current_leader_epoch.0,
                last_fetched_epoch: p.last_fetched_epoch.0,
            },
        );
        match by_topic.last_mut() {
            Some((name, entries)) if *name == p.topic => entries.push(entry),
            _ => by_topic.push((p.topic.as_str(), vec![entry])),
        }
    }
    let topics: Vec<_> = by_topic
        .into_iter()
        .map(|(name, entries)| {
            let name = fbb.create_string(name);
            let partitions = fbb.create_vector(&entries);
            wire::FetchTopic::create(
                &mut fbb,
                &wire::FetchTopicArgs {
                    name: Some(name),
                    partitions: Some(partitions),
                },
            )
        })
        .collect();
    let topics = fbb.create_vector(&topics);
    let root = wire::FetchRequest::create(
        &mut fbb,
        &wire::FetchRequestArgs {
            replica_id,
            replica_epoch,
            max_wait_ms,
            min_bytes: 1,
            max_bytes: partition_bytes_max.saturating_mul(16),
            topics: Some(topics),
            // Replicas and the lag probe read every batch.
            isolation_level: 0,
        },
    );
    fbb.finish_minimal(root);
    fbb.finished_data().to_vec()
}

/// A leader's answer for one partition, as a follower uses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchedPartition {
    pub error: ErrorCode,
    pub high_watermark: i64,
    pub log_start_offset: i64,
    pub log_end_offset: i64,
    /// Where the follower's log diverges: (leader epoch, its end offset).
    pub diverging: Option<(i32, i64)>,
    pub records: Bytes,
}

/// Decodes a fetch response whose batches are in `payload`, by (topic,
/// partition). A body that does not verify, or a records range outside the
/// payload, is an error.
pub fn decode_fetch_response(
    body: &[u8],
    payload: &Bytes,
) -> Result<HashMap<(String, i32), FetchedPartition>, String> {
    let response = flatbuffers::root::<wire::FetchResponse>(body)
        .map_err(|e| format!("body does not verify: {e}"))?;
    let mut out = HashMap::new();
    for topic in response.topics().iter().flatten() {
        let name = topic.name().unwrap_or_default();
        for p in topic.partitions().iter().flatten() {
            let records = match p.records() {
                Some(range) => {
                    let (start, len) = (range.offset() as usize, range.length() as usize);
                    if start.checked_add(len).is_none_or(|end| end > payload.len()) {
                        return Err("records range outside the payload".into());
                    }
                    payload.slice(start..start + len)
                }
                None => Bytes::new(),
            };
            let diverging = (p.diverging_epoch() >= 0 || p.diverging_end_offset() >= 0)
                .then_some((p.diverging_epoch(), p.diverging_end_offset()));
            out.insert(
                (name.to_owned(), p.partition()),
                FetchedPartition {
                    error: ErrorCode::from_u16(p.error_code()),
                    high_watermark: p.high_watermark(),
                    log_start_offset: p.log_start_offset(),
                    log_end_offset: p.log_end_offset(),
                    diverging,
                    records,
                },
            );
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_fetch_request_carries_every_partition() {
        let partitions = vec![
            ReplicaFetchPartition {
                topic: "b".into(),
                partition: 1,
                fetch_offset: 10,
                current_leader_epoch: LeaderEpoch(3),
                last_fetched_epoch: LeaderEpoch(2),
            },
            ReplicaFetchPartition {
                topic: "a".into(),
                partition: 0,
                fetch_offset: 7,
                current_leader_epoch: LeaderEpoch(1),
                last_fetched_epoch: LeaderEpoch(-1),
            },
        ];
        let body = encode_replica_fetch(4, 9, 500, 1 << 20, &partitions);
        let request = flatbuffers::root::<wire::FetchRequest>(&body).expect("verifies");
        assert_eq!(request.replica_id(), 4);
        assert_eq!(request.replica_epoch(), 9);
        let mut seen = Vec::new();
        for topic in request.topics().iter().flatten() {
            for p in topic.partitions().iter().flatten() {
                seen.push((
                    topic.name().unwrap_or_default().to_owned(),
                    p.partition(),
                    p.fetch_offset(),
                    p.current_leader_epoch(),
                    p.last_fetched_epoch(),
                ));
            }
        }
        seen.sort();
        assert_eq!(
            seen,
            vec![("a".into(), 0, 7, 1, -1), ("b".into(), 1, 10, 3, 2)]
        );
    }

    #[test]
    fn a_fetch_request_keeps_the_callers_order() {
        let partition = |topic: &str, partition| ReplicaFetchPartition {
            topic: topic.into(),
            partition,
            fetch_offset: 0,
            current_leader_epoch: LeaderEpoch(1),
            last_fetched_epoch: LeaderEpoch(1),
        };
        let partitions = vec![partition("b", 2), partition("a", 0), partition("b", 1)];
        let body = encode_replica_fetch(4, 9, 500, 1 << 20, &partitions);
        let request = flatbuffers::root::<wire::FetchRequest>(&body).expect("verifies");
        let mut order: Vec<(String, i32)> = Vec::new();
        for topic in request.topics().iter().flatten() {
            for p in topic.partitions().iter().flatten() {
                order.push((topic.name().unwrap_or_default().to_owned(), p.partition()));
            }
        }
        // Exactly the caller's order: a topic appears once per run of it.
        assert_eq!(
            order,
            vec![("b".into(), 2), ("a".into(), 0), ("b".into(), 1)]
        );
        assert_eq!(request.topics().map_or(0, |t| t.len()), 3);
    }

    #[test]
    fn a_response_pointing_outside_its_payload_is_refused() {
        let mut fbb = FlatBufferBuilder::new();
        let range = wire::ByteRange::new(4, 100);
        let partition = wire::FetchPartitionResult::create(
            &mut fbb,
            &wire::FetchPartitionResultArgs {
                partition: 0,
                records: Some(&range),
                ..Default::default()
            },
        );
        let partitions = fbb.create_vector(&[partition]);
        let name = fbb.create_string("t");
        let topic = wire::FetchTopicResult::create(
            &mut fbb,
            &wire::FetchTopicResultArgs {
                name: Some(name),
                partitions: Some(partitions),
            },
        );
        let topics = fbb.create_vector(&[topic]);
        let root = wire::FetchResponse::create(
            &mut fbb,
            &wire::FetchResponseArgs {
                topics: Some(topics),
            },
        );
        fbb.finish_minimal(root);
        let payload = Bytes::from_static(&[0; 50]);
        assert!(decode_fetch_response(fbb.finished_data(), &payload).is_err());
        assert!(decode_fetch_response(b"junk", &payload).is_err());
    }
}
