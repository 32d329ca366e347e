//! ListOffsets: earliest (-2), latest (-1) or the first offset at or after a
//! timestamp, per partition, answered by the owning shard.

use std::rc::Rc;

use protocol::flatbuffers::FlatBufferBuilder;
use protocol::{wire, ErrorCode};

use super::{finish, parse, HandlerResult, Reply};
use crate::partition::PartitionKey;
use crate::shard::{Isolation, OpError, Shard, ShardOp, ShardReply};

/// Partitions in one request.
pub const LIST_OFFSETS_PARTITIONS_MAX: usize = 10_000;

pub(super) async fn handle(shard: &Rc<Shard>, body: &[u8]) -> HandlerResult {
    let request = parse::<wire::ListOffsetsRequest>(body)?;
    let isolation = Isolation::from_wire(request.isolation_level());
    let mut fbb = FlatBufferBuilder::new();
    let mut topics = Vec::new();
    let mut count = 0;
    for topic in request.topics().ok_or("no topics")? {
        let name = topic.name().unwrap_or_default().to_owned();
        let mut results = Vec::new();
        for partition in topic.partitions().ok_or("no partitions")? {
            count += 1;
            if count > LIST_OFFSETS_PARTITIONS_MAX {
                return Err(format!(
                    "more than {LIST_OFFSETS_PARTITIONS_MAX} partitions"
                ));
            }
            let index = partition.partition();
            let result = match shard.owner(&name, index) {
                Err(e) => Err(e),
                Ok(owner) => match shard
                    .call(
                        owner,
                        ShardOp::ListOffset {
                            key: PartitionKey {
                                topic: name.clone(),
                                partition: index,
                            },
                            timestamp_ms: partition.timestamp_ms(),
                            isolation,
                        },
                    )
                    .await
                {
                    ShardReply::ListOffset(r) => r,
                    other => Err(OpError::new(
                        ErrorCode::Unknown,
                        format!("unexpected reply {other:?}"),
                    )),
                },
            };
            let (error_code, offset) = match result {
                Ok(offset) => (0, offset.0),
                Err(e) => (e.code.code(), -1),
            };
            results.push(wire::ListOffsetsPartitionResult::create(
                &mut fbb,
                &wire::ListOffsetsPartitionResultArgs {
                    partition: index,
                    error_code,
                    offset,
                },
            ));
        }
        let name = fbb.create_string(&name);
        let partitions = fbb.create_vector(&results);
        topics.push(wire::ListOffsetsTopicResult::create(
            &mut fbb,
            &wire::ListOffsetsTopicResultArgs {
                name: Some(name),
                partitions: Some(partitions),
            },
        ));
    }
    let topics = fbb.create_vector(&topics);
    let root = wire::ListOffsetsResponse::create(
        &mut fbb,
        &wire::ListOffsetsResponseArgs {
            topics: Some(topics),
        },
    );
    Ok(Reply::Body {
        body: finish(fbb, root),
        payload: Vec::new(),
    })
}
