//! Topic admin: create, delete, alter configs, list, describe. Creation,
//! deletion and config changes go to shard 0, which forwards them to the
//! controller and answers once this broker's metadata shows the change; list
//! and describe read the metadata.

use std::collections::BTreeMap;
use std::rc::Rc;

use protocol::flatbuffers::FlatBufferBuilder;
use protocol::{wire, ErrorCode};

use super::{finish, parse, HandlerResult, Reply};
use crate::cluster_view::{TopicSpec, TOPIC_CONFIGS_MAX};
use crate::partition::PartitionKey;
use crate::shard::{Shard, ShardOp, ShardReply, TopicOutcome, METADATA_SHARD};

/// Topics in one create or delete request.
pub const TOPICS_PER_ADMIN_REQUEST_MAX: usize = 1_000;

#[derive(Clone, Copy)]
enum AdminApi {
    Create,
    Delete,
    AlterConfigs,
}

fn results_body(outcomes: &[TopicOutcome], api: AdminApi) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let results: Vec<_> = outcomes
        .iter()
        .map(|o| {
            let name = fbb.create_string(&o.name);
            let message = o.error.as_ref().map(|e| fbb.create_string(&e.message));
            let code = o.error.as_ref().map_or(0, |e| e.code.code());
            wire::TopicResult::create(
                &mut fbb,
                &wire::TopicResultArgs {
                    name: Some(name),
                    error_code: code,
                    error_message: message,
                    // Clients talk to brokers, which forward to the
                    // controller leader themselves.
                    leader_endpoint: None,
                },
            )
        })
        .collect();
    let results = Some(fbb.create_vector(&results));
    match api {
        AdminApi::Create => {
            let root = wire::CreateTopicsResponse::create(
                &mut fbb,
                &wire::CreateTopicsResponseArgs { results },
            );
            finish(fbb, root)
        }
        AdminApi::Delete => {
            let root = wire::DeleteTopicsResponse::create(
                &mut fbb,
                &wire::DeleteTopicsResponseArgs { results },
            );
            finish(fbb, root)
        }
        AdminApi::AlterConfigs => {
            let root = wire::AlterTopicConfigsResponse::create(
                &mut fbb,
                &wire::AlterTopicConfigsResponseArgs { results },
            );
            finish(fbb, root)
        }
    }
}

pub(super) async fn create_topics(shard: &Rc<Shard>, body: &[u8]) -> HandlerResult {
    let request = parse::<wire::CreateTopicsRequest>(body)?;
    let topics = request.topics().ok_or("no topics")?;
    if topics.len() > TOPICS_PER_ADMIN_REQUEST_MAX {
        return Err(format!(
            "{} topics exceed the bound of {TOPICS_PER_ADMIN_REQUEST_MAX}",
            topics.len()
        ));
    }
    let mut specs = Vec::with_capacity(topics.len());
    for topic in topics {
        let mut configs = BTreeMap::new();
        if let Some(entries) = topic.configs() {
            if entries.len() > TOPIC_CONFIGS_MAX {
                return Err("too many topic configs".into());
            }
            for entry in entries {
                configs.insert(
                    entry.key().unwrap_or_default().to_owned(),
                    entry.value().unwrap_or_default().to_owned(),
                );
            }
        }
        specs.push(TopicSpec {
            name: topic.name().unwrap_or_default().to_owned(),
            partitions: topic.partitions(),
            replication_factor: topic.replication_factor(),
            configs,
        });
    }
    let ShardReply::Admin(outcomes) = shard
        .call(METADATA_SHARD, ShardOp::CreateTopics(specs))
        .await
    else {
        return Err("metadata shard gave an unexpected reply".into());
    };
    Ok(Reply::Body {
        body: results_body(&outcomes, AdminApi::Create),
        payload: Vec::new(),
    })
}

pub(super) async fn delete_topics(shard: &Rc<Shard>, body: &[u8]) -> HandlerResult {
    let request = parse::<wire::DeleteTopicsRequest>(body)?;
    let names: Vec<String> = request
        .names()
        .ok_or("no topics")?
        .iter()
        .map(str::to_owned)
        .collect();
    if names.len() > TOPICS_PER_ADMIN_REQUEST_MAX {
        return Err(format!(
            "{} topics exceed the bound of {TOPICS_PER_ADMIN_REQUEST_MAX}",
            names.len()
        ));
    }
    let ShardReply::Admin(outcomes) = shard
        .call(METADATA_SHARD, ShardOp::DeleteTopics(names))
        .await
    else {
        return Err("metadata shard gave an unexpected reply".into());
    };
    Ok(Reply::Body {
        body: results_body(&outcomes, AdminApi::Delete),
        payload: Vec::new(),
    })
}

pub(super) async fn alter_topic_configs(shard: &Rc<Shard>, body: &[u8]) -> HandlerResult {
    // The controller codec checks the counts and builds the specs.
    let specs = protocol::control::codec::decode_alter_topic_configs_request(body)
        .map_err(|e| e.to_string())?;
    if specs.len() > TOPICS_PER_ADMIN_REQUEST_MAX {
        return Err(format!(
            "{} topics exceed the bound of {TOPICS_PER_ADMIN_REQUEST_MAX}",
            specs.len()
        ));
    }
    if specs
        .iter()
        .any(|s| s.set.len() > TOPIC_CONFIGS_MAX || s.remove.len() > TOPIC_CONFIGS_MAX)
    {
        return Err("too many topic configs".into());
    }
    let ShardReply::Admin(outcomes) = shard
        .call(METADATA_SHARD, ShardOp::AlterTopicConfigs(specs))
        .await
    else {
        return Err("metadata shard gave an unexpected reply".into());
    };
    Ok(Reply::Body {
        body: results_body(&outcomes, AdminApi::AlterConfigs),
        payload: Vec::new(),
    })
}

pub(super) fn list_topics(shard: &Rc<Shard>) -> HandlerResult {
    let view = shard.view();
    let mut fbb = FlatBufferBuilder::new();
    let topics: Vec<_> = view
        .topics
        .values()
        .map(|t| {
            let name = fbb.create_string(&t.name);
            wire::TopicSummary::create(
                &mut fbb,
                &wire::TopicSummaryArgs {
                    name: Some(name),
                    partitions: i32::try_from(t.partition_count()).expect("bounded"),
                    replication_factor: i16::try_from(t.replication_factor).unwrap_or(i16::MAX),
                },
            )
        })
        .collect();
    let topics = fbb.create_vector(&topics);
    let root = wire::ListTopicsResponse::create(
        &mut fbb,
        &wire::ListTopicsResponseArgs {
            topics: Some(topics),
        },
    );
    Ok(Reply::Body {
        body: finish(fbb, root),
        payload: Vec::new(),
    })
}

pub(super) async fn describe_topic(shard: &Rc<Shard>, body: &[u8]) -> HandlerResult {
    let request = parse::<wire::DescribeTopicRequest>(body)?;
    let name = request.name().unwrap_or_default().to_owned();
    let meta = shard.view().topic(&name).cloned();
    let mut fbb = FlatBufferBuilder::new();
    let fb_name = fbb.create_string(&name);
    let Some(meta) = meta else {
        let message = fbb.create_string(&format!("no topic {name}"));
        let root = wire::DescribeTopicResponse::create(
            &mut fbb,
            &wire::DescribeTopicResponseArgs {
                error_code: ErrorCode::UnknownTopicOrPartition.code(),
                error_message: Some(message),
                name: Some(fb_name),
                ..Default::default()
            },
        );
        return Ok(Reply::Body {
            body: finish(fbb, root),
            payload: Vec::new(),
        });
    };
    let mut details = Vec::with_capacity(meta.partition_count());
    let me = shard.broker_id();
    for (index, record) in meta.partitions.iter().enumerate() {
        let partition = i32::try_from(index).expect("partition count bounded");
        let key = PartitionKey {
            topic: name.clone(),
            partition,
        };
        // Log details come from this broker's replica, when it holds one.
        let (owner, detail) = match record.replica_on(me) {
            Some(replica) => {
                let owner = usize::from(replica.shard.0);
                let ShardReply::Describe(detail) =
                    shard.call(owner, ShardOp::Describe { key }).await
                else {
                    return Err("unexpected reply".into());
                };
                (owner, detail)
            }
            None => (
                record
                    .leader
                    .and_then(|l| record.replica_on(l))
                    .map_or(0, |r| usize::from(r.shard.0)),
                crate::shard::PartitionDetail {
                    error: Some(crate::shard::OpError::new(
                        ErrorCode::NotLeaderOrFollower,
                        format!("broker {me} holds no replica"),
                    )),
                    ..Default::default()
                },
            ),
        };
        details.push(wire::PartitionDescription::create(
            &mut fbb,
            &wire::PartitionDescriptionArgs {
                partition,
                error_code: detail.error.map_or(0, |e| e.code.code()),
                leader: record
                    .leader
                    .map_or(-1, |b| i32::try_from(b.0).unwrap_or(i32::MAX)),
                leader_epoch: record.leader_epoch.0,
                shard: u16::try_from(owner).expect("shard count bounded"),
                log_start_offset: detail.log_start_offset.0,
                log_end_offset: detail.log_end_offset.0,
                high_watermark: detail.high_watermark.0,
                size_bytes: detail.size_bytes,
            },
        ));
    }
    let configs: Vec<_> = meta
        .config
        .iter()
        .map(|(k, v)| {
            let (key, value) = (fbb.create_string(k), fbb.create_string(v));
            wire::ConfigEntry::create(
                &mut fbb,
                &wire::ConfigEntryArgs {
                    key: Some(key),
                    value: Some(value),
                },
            )
        })
        .collect();
    let configs = fbb.create_vector(&configs);
    let details = fbb.create_vector(&details);
    let root = wire::DescribeTopicResponse::create(
        &mut fbb,
        &wire::DescribeTopicResponseArgs {
            error_code: 0,
            error_message: None,
            name: Some(fb_name),
            partitions: i32::try_from(meta.partition_count()).expect("bounded"),
            replication_factor: i16::try_from(meta.replication_factor).unwrap_or(i16::MAX),
            configs: Some(configs),
            partition_details: Some(details),
        },
    );
    Ok(Reply::Body {
        body: finish(fbb, root),
        payload: Vec::new(),
    })
}
