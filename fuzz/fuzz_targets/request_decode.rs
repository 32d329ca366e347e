//! Proves that no byte string makes frame or request decoding panic: the length
//! prefix bound, the request header, every API's flatbuffer body under the
//! verifier, and the byte ranges that name batches in the payload.
#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol::flatbuffers::root;
use protocol::frame::{decode_request, decode_response, frame_len, payload_range};
use protocol::{wire, ApiKey};

fuzz_target!(|data: &[u8]| {
    if data.len() >= 4 {
        let _ = frame_len([data[0], data[1], data[2], data[3]], 64 << 20);
    }
    let _ = decode_response(data);
    let Ok(request) = decode_request(data) else { return };
    let (body, payload) = (request.body, request.payload);
    match request.header.api() {
        Some(ApiKey::Produce) => {
            if let Ok(produce) = root::<wire::ProduceRequest>(body) {
                for topic in produce.topics().into_iter().flatten() {
                    let _ = topic.name();
                    for partition in topic.partitions().into_iter().flatten() {
                        if let Some(range) = partition.records() {
                            if let Some(batch) = payload_range(payload, range.offset(), range.length()) {
                                let _ = protocol::RecordBatch::parse(batch, 1 << 20);
                            }
                        }
                    }
                }
            }
        }
        Some(ApiKey::Fetch) => {
            if let Ok(fetch) = root::<wire::FetchRequest>(body) {
                for topic in fetch.topics().into_iter().flatten() {
                    for partition in topic.partitions().into_iter().flatten() {
                        let _ = (partition.partition(), partition.fetch_offset(), partition.max_bytes());
                    }
                }
            }
        }
        Some(ApiKey::CreateTopics) => {
            if let Ok(create) = root::<wire::CreateTopicsRequest>(body) {
                for topic in create.topics().into_iter().flatten() {
                    let _ = (topic.name(), topic.partitions());
                    for entry in topic.configs().into_iter().flatten() {
                        let _ = (entry.key(), entry.value());
                    }
                }
            }
        }
        Some(ApiKey::DeleteTopics) => {
            if let Ok(delete) = root::<wire::DeleteTopicsRequest>(body) {
                let _ = delete.names().map(|n| n.iter().count());
            }
        }
        Some(ApiKey::Metadata) => {
            if let Ok(metadata) = root::<wire::MetadataRequest>(body) {
                let _ = metadata.topics().map(|t| t.iter().count());
            }
        }
        Some(ApiKey::ListOffsets) => {
            if let Ok(list) = root::<wire::ListOffsetsRequest>(body) {
                for topic in list.topics().into_iter().flatten() {
                    let _ = topic.partitions().map(|p| p.iter().map(|x| x.timestamp_ms()).sum::<i64>());
                }
            }
        }
        Some(ApiKey::DescribeTopic) => {
            if let Ok(describe) = root::<wire::DescribeTopicRequest>(body) {
                let _ = describe.name();
            }
        }
        Some(ApiKey::FindCoordinator) => {
            let _ = root::<wire::FindCoordinatorRequest>(body).map(|r| r.group_id());
        }
        Some(ApiKey::GroupHeartbeat) => {
            if let Ok(r) = root::<wire::GroupHeartbeatRequest>(body) {
                let _ = r.subscribed_topics().map(|t| t.iter().count());
                for tp in r.owned().into_iter().flatten() {
                    let _ = tp.partitions().map(|p| p.iter().sum::<i32>());
                }
            }
        }
        Some(ApiKey::OffsetCommit) => {
            if let Ok(r) = root::<wire::OffsetCommitRequest>(body) {
                for topic in r.topics().into_iter().flatten() {
                    let _ = topic.partitions().map(|p| p.iter().map(|x| x.offset()).sum::<i64>());
                }
            }
        }
        Some(ApiKey::OffsetFetch) => {
            if let Ok(r) = root::<wire::OffsetFetchRequest>(body) {
                let _ = r.topics().map(|t| t.iter().count());
            }
        }
        Some(ApiKey::DescribeGroup) => {
            let _ = root::<wire::DescribeGroupRequest>(body).map(|r| r.group_id());
        }
        Some(ApiKey::DeleteGroup) => {
            let _ = root::<wire::DeleteGroupRequest>(body).map(|r| r.group_id());
        }
        Some(ApiKey::DeleteGroupOffsets) => {
            let _ = root::<wire::DeleteGroupOffsetsRequest>(body).map(|r| r.topic());
        }
        Some(ApiKey::InitProducerId) => {
            let _ = root::<wire::InitProducerIdRequest>(body).map(|r| r.transactional_id());
        }
        Some(ApiKey::WriteTxnMarkers) => {
            if let Ok(r) = root::<wire::WriteTxnMarkersRequest>(body) {
                for marker in r.markers().into_iter().flatten() {
                    for topic in marker.topics().into_iter().flatten() {
                        let _ = topic.name();
                        let _ = topic.partitions().map(|p| p.iter().sum::<i32>());
                    }
                }
            }
        }
        Some(ApiKey::AddPartitionsToTxn) => {
            if let Ok(r) = root::<wire::AddPartitionsToTxnRequest>(body) {
                let _ = r.transactional_id();
                for topic in r.topics().into_iter().flatten() {
                    let _ = topic.name();
                    let _ = topic.partitions().map(|p| p.iter().sum::<i32>());
                }
            }
        }
        Some(ApiKey::EndTxn) => {
            let _ = root::<wire::EndTxnRequest>(body).map(|r| r.transactional_id());
        }
        Some(ApiKey::ListTransactions) => {
            if let Ok(r) = root::<wire::ListTransactionsRequest>(body) {
                let _ = r.states().map(|s| s.iter().map(str::len).sum::<usize>());
            }
        }
        Some(ApiKey::AddOffsetsToTxn) => {
            let _ = root::<wire::AddOffsetsToTxnRequest>(body).map(|r| r.group_id());
        }
        Some(ApiKey::TxnOffsetCommit) => {
            if let Ok(r) = root::<wire::TxnOffsetCommitRequest>(body) {
                let _ = (r.transactional_id(), r.group_id(), r.member_id());
                for topic in r.topics().into_iter().flatten() {
                    let _ = topic.name();
                    for p in topic.partitions().into_iter().flatten() {
                        let _ = (p.partition(), p.offset(), p.metadata());
                    }
                }
            }
        }
        Some(ApiKey::DescribeTransaction) => {
            let _ = root::<wire::DescribeTransactionRequest>(body).map(|r| r.transactional_id());
        }
        Some(ApiKey::ApiVersions) | Some(ApiKey::ListTopics) | Some(ApiKey::ListGroups) | None => {}
        #[allow(unreachable_patterns)]
        Some(_) => {}
    }
});
