//! Consumer group APIs: the requests a group's coordinator answers
//! (heartbeat, offset commit and fetch, list, describe, delete), routed to
//! the shard that leads the group's `__consumer_offsets` partition
//! (`coordinators`).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::rc::Rc;

use protocol::flatbuffers::{FlatBufferBuilder, WIPOffset};
use protocol::{wire, ErrorCode, MemberEpoch, ProducerEpoch, ProducerId};

use super::coordinators::{coordinator_shard, CoordinatorKind};
use super::{finish, parse, HandlerResult, Reply};
use crate::group::coordinator::{CommitRequest, HeartbeatRequest};
use crate::group::records::OffsetValue;
use crate::group::{TopicPartition, PARTITIONS_PER_REQUEST_MAX};
use crate::shard::{GroupAnswer, GroupOp, OpError, Shard, ShardOp, ShardReply};

/// Runs `op` on the shard of this broker that coordinates `group_id`.
async fn on_coordinator(
    shard: &Rc<Shard>,
    group_id: &str,
    op: GroupOp,
) -> Result<GroupAnswer, OpError> {
    let (partition, owner) = coordinator_shard(shard, CoordinatorKind::Group, group_id)?;
    match shard.call(owner, ShardOp::Group { partition, op }).await {
        ShardReply::Group(result) => result,
        other => Err(OpError::new(
            ErrorCode::Unknown,
            format!("unexpected reply {other:?}"),
        )),
    }
}

fn read_partitions<'a>(
    list: Option<
        protocol::flatbuffers::Vector<
            'a,
            protocol::flatbuffers::ForwardsUOffset<wire::TopicPartitions<'a>>,
        >,
    >,
    count: &mut usize,
) -> Result<Option<Vec<TopicPartition>>, String> {
    let Some(list) = list else { return Ok(None) };
    let mut out = Vec::new();
    for topic in list {
        let name = topic.topic().unwrap_or_default();
        for p in topic.partitions().iter().flatten() {
            *count += 1;
            if *count > PARTITIONS_PER_REQUEST_MAX {
                return Err(format!("more than {PARTITIONS_PER_REQUEST_MAX} partitions"));
            }
            let index = u32::try_from(p).map_err(|_| format!("negative partition {p}"))?;
            out.push(TopicPartition::new(name, index));
        }
    }
    Ok(Some(out))
}

fn write_partitions<'a>(
    fbb: &mut FlatBufferBuilder<'a>,
    partitions: &BTreeSet<TopicPartition>,
) -> WIPOffset<
    protocol::flatbuffers::Vector<
        'a,
        protocol::flatbuffers::ForwardsUOffset<wire::TopicPartitions<'a>>,
    >,
> {
    let items: Vec<_> = crate::group::runs_by_topic(partitions)
        .into_iter()
        .map(|(topic, list)| {
            let topic = fbb.create_string(topic);
            let partitions = fbb.create_vector(&list);
            wire::TopicPartitions::create(
                fbb,
                &wire::TopicPartitionsArgs {
                    topic: Some(topic),
                    partitions: Some(partitions),
                },
            )
        })
        .collect();
    fbb.create_vector(&items)
}

/// A partition's committed offset, if any.
type Committed = (TopicPartition, Option<OffsetValue>);

fn write_committed<'a>(
    fbb: &mut FlatBufferBuilder<'a>,
    offsets: &[(TopicPartition, Option<OffsetValue>)],
) -> WIPOffset<
    protocol::flatbuffers::Vector<
        'a,
        protocol::flatbuffers::ForwardsUOffset<wire::CommittedTopic<'a>>,
    >,
> {
    let mut by_topic: Vec<(&str, Vec<&Committed>)> = Vec::new();
    for entry in offsets {
        match by_topic.last_mut() {
            Some((topic, list)) if *topic == entry.0.topic => list.push(entry),
            _ => by_topic.push((&entry.0.topic, vec![entry])),
        }
    }
    let topics: Vec<_> = by_topic
        .into_iter()
        .map(|(topic, list)| {
            let partitions: Vec<_> = list
                .into_iter()
                .map(|(tp, value)| {
                    let metadata =
                        fbb.create_string(value.as_ref().map_or("", |v| v.metadata.as_str()));
                    wire::CommittedOffset::create(
                        fbb,
                        &wire::CommittedOffsetArgs {
                            partition: i32::try_from(tp.partition.0).unwrap_or(i32::MAX),
                            offset: value.as_ref().map_or(-1, |v| v.offset),
                            metadata: Some(metadata),
                            commit_time_ms: value.as_ref().map_or(-1, |v| v.commit_time_ms),
                        },
                    )
                })
                .collect();
            let name = fbb.create_string(topic);
            let partitions = fbb.create_vector(&partitions);
            wire::CommittedTopic::create(
                fbb,
                &wire::CommittedTopicArgs {
                    name: Some(name),
                    partitions: Some(partitions),
                },
            )
        })
        .collect();
    fbb.create_vector(&topics)
}

fn body_reply<T>(fbb: FlatBufferBuilder<'_>, root: WIPOffset<T>) -> HandlerResult {
    Ok(Reply::Body {
        body: finish(fbb, root),
        payload: Vec::new(),
    })
}

fn error_parts(result: &Result<GroupAnswer, OpError>) -> (u16, String) {
    match result {
        Ok(_) => (0, String::new()),
        Err(e) => (e.code.code(), e.message.clone()),
    }
}

pub(super) async fn heartbeat(shard: &Rc<Shard>, body: &[u8], peer: SocketAddr) -> HandlerResult {
    let request = parse::<wire::GroupHeartbeatRequest>(body)?;
    let mut count = 0;
    let owned = read_partitions(request.owned(), &mut count)?;
    let subscribed: Option<Vec<String>> = request
        .subscribed_topics()
        .map(|list| list.iter().map(str::to_string).collect());
    if subscribed
        .as_ref()
        .is_some_and(|s| s.len() > crate::group::SUBSCRIBED_TOPICS_MAX)
    {
        return Err(format!(
            "more than {} subscribed topics",
            crate::group::SUBSCRIBED_TOPICS_MAX
        ));
    }
    let group_id = request.group_id().unwrap_or_default().to_string();
    let op = GroupOp::Heartbeat(HeartbeatRequest {
        group_id: group_id.clone(),
        member_id: request.member_id().unwrap_or_default().to_string(),
        member_epoch: MemberEpoch(request.member_epoch()),
        instance_id: request
            .instance_id()
            .filter(|s| !s.is_empty())
            .map(str::to_string),
        client_id: request.client_id().unwrap_or_default().to_string(),
        client_host: peer.ip().to_string(),
        session_timeout_ms: request.session_timeout_ms(),
        rebalance_timeout_ms: request.rebalance_timeout_ms(),
        subscribed_topics: subscribed,
        assignor: request
            .assignor()
            .filter(|s| !s.is_empty())
            .map(str::to_string),
        owned,
    });
    let result = on_coordinator(shard, &group_id, op).await;
    let (error_code, message) = error_parts(&result);
    let mut fbb = FlatBufferBuilder::new();
    let error_message = fbb.create_string(&message);
    let (member_id, member_epoch, heartbeat_interval_ms, assignment) = match &result {
        Ok(GroupAnswer::Heartbeat(r)) => {
            let id = fbb.create_string(&r.member_id);
            let assignment = write_partitions(&mut fbb, &r.assignment);
            (
                Some(id),
                r.member_epoch.0,
                r.heartbeat_interval_ms,
                Some(assignment),
            )
        }
        _ => (None, -1, 0, None),
    };
    let root = wire::GroupHeartbeatResponse::create(
        &mut fbb,
        &wire::GroupHeartbeatResponseArgs {
            error_code,
            error_message: Some(error_message),
            member_id,
            member_epoch,
            heartbeat_interval_ms,
            assignment,
        },
    );
    body_reply(fbb, root)
}

/// The offsets of an OffsetCommit or TxnOffsetCommit request.
fn read_offsets<'a>(
    topics: Option<
        protocol::flatbuffers::Vector<
            'a,
            protocol::flatbuffers::ForwardsUOffset<wire::OffsetCommitTopic<'a>>,
        >,
    >,
) -> Result<Vec<(TopicPartition, i64, String)>, String> {
    let mut offsets = Vec::new();
    for topic in topics.iter().flatten() {
        let name = topic.name().unwrap_or_default();
        for p in topic.partitions().iter().flatten() {
            if offsets.len() >= PARTITIONS_PER_REQUEST_MAX {
                return Err(format!("more than {PARTITIONS_PER_REQUEST_MAX} partitions"));
            }
            let index = u32::try_from(p.partition())
                .map_err(|_| format!("negative partition {}", p.partition()))?;
            offsets.push((
                TopicPartition::new(name, index),
                p.offset(),
                p.metadata().unwrap_or_default().to_string(),
            ));
        }
    }
    Ok(offsets)
}

pub(super) async fn offset_commit(shard: &Rc<Shard>, body: &[u8]) -> HandlerResult {
    let request = parse::<wire::OffsetCommitRequest>(body)?;
    let group_id = request.group_id().unwrap_or_default().to_string();
    let op = GroupOp::Commit(CommitRequest {
        group_id: group_id.clone(),
        member_id: request.member_id().unwrap_or_default().to_string(),
        member_epoch: MemberEpoch(request.member_epoch()),
        offsets: read_offsets(request.topics())?,
    });
    let result = on_coordinator(shard, &group_id, op).await;
    simple_response(result, |fbb, args| {
        wire::OffsetCommitResponse::create(
            fbb,
            &wire::OffsetCommitResponseArgs {
                error_code: args.0,
                error_message: Some(args.1),
            },
        )
    })
}

pub(super) async fn txn_offset_commit(shard: &Rc<Shard>, body: &[u8]) -> HandlerResult {
    let request = parse::<wire::TxnOffsetCommitRequest>(body)?;
    let group_id = request.group_id().unwrap_or_default().to_string();
    if request.producer_id() < 0 || request.producer_epoch() < 0 {
        return Err("a transactional commit needs a producer id and epoch".into());
    }
    let op = GroupOp::TxnCommit {
        request: CommitRequest {
            group_id: group_id.clone(),
            member_id: request.member_id().unwrap_or_default().to_string(),
            member_epoch: MemberEpoch(request.member_epoch()),
            offsets: read_offsets(request.topics())?,
        },
        producer_id: ProducerId(request.producer_id()),
        producer_epoch: ProducerEpoch(request.producer_epoch()),
    };
    let result = on_coordinator(shard, &group_id, op).await;
    simple_response(result, |fbb, args| {
        wire::TxnOffsetCommitResponse::create(
            fbb,
            &wire::TxnOffsetCommitResponseArgs {
                error_code: args.0,
                error_message: Some(args.1),
            },
        )
    })
}

fn simple_response<'a, T>(
    result: Result<GroupAnswer, OpError>,
    build: impl FnOnce(&mut FlatBufferBuilder<'a>, (u16, WIPOffset<&'a str>)) -> WIPOffset<T>,
) -> HandlerResult {
    let (error_code, message) = error_parts(&result);
    let mut fbb = FlatBufferBuilder::new();
    let error_message = fbb.create_string(&message);
    let root = build(&mut fbb, (error_code, error_message));
    body_reply(fbb, root)
}

pub(super) async fn offset_fetch(shard: &Rc<Shard>, body: &[u8]) -> HandlerResult {
    let request = parse::<wire::OffsetFetchRequest>(body)?;
    let group_id = request.group_id().unwrap_or_default().to_string();
    let mut count = 0;
    let partitions = read_partitions(request.topics(), &mut count)?;
    let result = on_coordinator(
        shard,
        &group_id,
        GroupOp::FetchOffsets {
            group_id: group_id.clone(),
            partitions,
        },
    )
    .await;
    let (error_code, message) = error_parts(&result);
    let mut fbb = FlatBufferBuilder::new();
    let error_message = fbb.create_string(&message);
    let topics = match &result {
        Ok(GroupAnswer::Offsets(offsets)) => Some(write_committed(&mut fbb, offsets)),
        _ => None,
    };
    let root = wire::OffsetFetchResponse::create(
        &mut fbb,
        &wire::OffsetFetchResponseArgs {
            error_code,
            error_message: Some(error_message),
            topics,
        },
    );
    body_reply(fbb, root)
}

pub(super) async fn list_groups(shard: &Rc<Shard>) -> HandlerResult {
    let mut groups = Vec::new();
    for to in 0..shard.count() {
        if let ShardReply::Groups(list) = shard.call(to, ShardOp::ListGroups).await {
            groups.extend(list);
        }
    }
    groups.sort_by(|a, b| a.group_id.cmp(&b.group_id));
    let mut fbb = FlatBufferBuilder::new();
    let items: Vec<_> = groups
        .iter()
        .map(|g| {
            let id = fbb.create_string(&g.group_id);
            let state = fbb.create_string(g.state.name());
            wire::GroupListing::create(
                &mut fbb,
                &wire::GroupListingArgs {
                    group_id: Some(id),
                    state: Some(state),
                    members: u32::try_from(g.members).unwrap_or(u32::MAX),
                },
            )
        })
        .collect();
    let groups = fbb.create_vector(&items);
    let error_message = fbb.create_string("");
    let root = wire::ListGroupsResponse::create(
        &mut fbb,
        &wire::ListGroupsResponseArgs {
            error_code: 0,
            error_message: Some(error_message),
            groups: Some(groups),
        },
    );
    body_reply(fbb, root)
}

pub(super) async fn describe_group(shard: &Rc<Shard>, body: &[u8]) -> HandlerResult {
    let request = parse::<wire::DescribeGroupRequest>(body)?;
    let group_id = request.group_id().unwrap_or_default().to_string();
    let result = on_coordinator(shard, &group_id, GroupOp::Describe(group_id.clone())).await;
    let (error_code, message) = error_parts(&result);
    let mut fbb = FlatBufferBuilder::new();
    let error_message = fbb.create_string(&message);
    let group_name = fbb.create_string(&group_id);
    let mut args = wire::DescribeGroupResponseArgs {
        error_code,
        error_message: Some(error_message),
        group_id: Some(group_name),
        ..Default::default()
    };
    if let Ok(GroupAnswer::Described(d)) = &result {
        let members: Vec<_> = d
            .members
            .iter()
            .map(|m| {
                let member_id = fbb.create_string(&m.member_id);
                let instance_id = m.instance_id.as_deref().map(|s| fbb.create_string(s));
                let client_id = fbb.create_string(&m.client_id);
                let client_host = fbb.create_string(&m.client_host);
                let state = fbb.create_string(m.state.name());
                let topics: Vec<_> = m.subscribed.iter().map(|t| fbb.create_string(t)).collect();
                let subscribed_topics = fbb.create_vector(&topics);
                let assigned = write_partitions(&mut fbb, &m.assigned);
                let pending_revocation = write_partitions(&mut fbb, &m.pending_revocation);
                let target = write_partitions(&mut fbb, &m.target);
                wire::GroupMember::create(
                    &mut fbb,
                    &wire::GroupMemberArgs {
                        member_id: Some(member_id),
                        instance_id,
                        client_id: Some(client_id),
                        client_host: Some(client_host),
                        member_epoch: m.member_epoch.0,
                        state: Some(state),
                        subscribed_topics: Some(subscribed_topics),
                        assigned: Some(assigned),
                        pending_revocation: Some(pending_revocation),
                        target: Some(target),
                    },
                )
            })
            .collect();
        let offsets: Vec<(TopicPartition, Option<OffsetValue>)> = d
            .offsets
            .iter()
            .map(|(tp, v)| (tp.clone(), Some(v.clone())))
            .collect();
        args.members = Some(fbb.create_vector(&members));
        args.offsets = Some(write_committed(&mut fbb, &offsets));
        args.state = Some(fbb.create_string(d.state.name()));
        args.assignor = Some(fbb.create_string(d.assignor.name()));
        args.group_epoch = d.group_epoch.0;
        args.target_epoch = d.target_epoch.0;
    }
    let root = wire::DescribeGroupResponse::create(&mut fbb, &args);
    body_reply(fbb, root)
}

pub(super) async fn delete_group(shard: &Rc<Shard>, body: &[u8]) -> HandlerResult {
    let request = parse::<wire::DeleteGroupRequest>(body)?;
    let group_id = request.group_id().unwrap_or_default().to_string();
    let result = on_coordinator(shard, &group_id, GroupOp::Delete(group_id.clone())).await;
    simple_response(result, |fbb, args| {
        wire::DeleteGroupResponse::create(
            fbb,
            &wire::DeleteGroupResponseArgs {
                error_code: args.0,
                error_message: Some(args.1),
            },
        )
    })
}

pub(super) async fn delete_group_offsets(shard: &Rc<Shard>, body: &[u8]) -> HandlerResult {
    let request = parse::<wire::DeleteGroupOffsetsRequest>(body)?;
    let group_id = request.group_id().unwrap_or_default().to_string();
    let topic = request.topic().unwrap_or_default().to_string();
    let result = on_coordinator(
        shard,
        &group_id,
        GroupOp::DeleteOffsets {
            group_id: group_id.clone(),
            topic,
        },
    )
    .await;
    simple_response(result, |fbb, args| {
        wire::DeleteGroupOffsetsResponse::create(
            fbb,
            &wire::DeleteGroupOffsetsResponseArgs {
                error_code: args.0,
                error_message: Some(args.1),
            },
        )
    })
}
