//! CreateTopics, DeleteTopics and AlterTopicConfigs forwarded to the
//! controller (admin.fbs).

use super::*;

pub fn encode_create_topics_request(specs: &[CreateTopicSpec]) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let topics: Vec<_> = specs
        .iter()
        .map(|s| {
            let name = fbb.create_string(&s.name);
            let configs = encode_configs(&mut fbb, &s.config);
            wire::CreateTopic::create(
                &mut fbb,
                &wire::CreateTopicArgs {
                    name: Some(name),
                    partitions: i32::try_from(s.partition_count).unwrap_or(i32::MAX),
                    replication_factor: i16::try_from(s.replication_factor).unwrap_or(i16::MAX),
                    configs: Some(configs),
                },
            )
        })
        .collect();
    let topics = fbb.create_vector(&topics);
    let root = wire::CreateTopicsRequest::create(
        &mut fbb,
        &wire::CreateTopicsRequestArgs {
            topics: Some(topics),
        },
    );
    finish(fbb, root)
}

pub fn decode_create_topics_request(body: &[u8]) -> Result<Vec<CreateTopicSpec>, WireError> {
    let r = flatbuffers::root::<wire::CreateTopicsRequest>(body)?;
    let topics = r.topics().ok_or(WireError::Missing("topics"))?;
    bounded("topics", topics.len(), TOPICS_PER_REQUEST_MAX)?;
    topics
        .iter()
        .map(|t| {
            let partitions = t.partitions();
            let rf = t.replication_factor();
            Ok(CreateTopicSpec {
                name: t.name().ok_or(WireError::Missing("name"))?.to_owned(),
                partition_count: u32::try_from(partitions).map_err(|_| WireError::OutOfRange {
                    field: "partitions",
                    value: i64::from(partitions),
                })?,
                replication_factor: u16::try_from(rf).map_err(|_| WireError::OutOfRange {
                    field: "replication_factor",
                    value: i64::from(rf),
                })?,
                config: decode_configs(t.configs())?,
            })
        })
        .collect()
}

pub fn encode_delete_topics_request(names: &[String]) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let names: Vec<_> = names.iter().map(|n| fbb.create_string(n)).collect();
    let names = fbb.create_vector(&names);
    let root = wire::DeleteTopicsRequest::create(
        &mut fbb,
        &wire::DeleteTopicsRequestArgs { names: Some(names) },
    );
    finish(fbb, root)
}

pub fn decode_delete_topics_request(body: &[u8]) -> Result<Vec<String>, WireError> {
    let r = flatbuffers::root::<wire::DeleteTopicsRequest>(body)?;
    let names = r.names().ok_or(WireError::Missing("names"))?;
    bounded("names", names.len(), TOPICS_PER_REQUEST_MAX)?;
    Ok(names.iter().map(str::to_owned).collect())
}

/// A NOT_CONTROLLER result carries the leader's endpoint as its error message,
/// since admin.fbs' `TopicResult` has no field for it.
fn encode_topic_results<'a>(
    fbb: &mut Fbb<'a>,
    outcomes: &[TopicOutcome],
) -> WIPOffset<flatbuffers::Vector<'a, flatbuffers::ForwardsUOffset<wire::TopicResult<'a>>>> {
    let results: Vec<_> = outcomes
        .iter()
        .map(|o| {
            let name = fbb.create_string(&o.name);
            let (code, message, leader) = match &o.result {
                Ok(()) => (ErrorCode::None, None, None),
                Err(f) => (
                    f.code,
                    Some(f.message.as_str()),
                    f.leader_endpoint.as_deref(),
                ),
            };
            let message = opt_str(fbb, message);
            let leader_endpoint = opt_str(fbb, leader);
            wire::TopicResult::create(
                fbb,
                &wire::TopicResultArgs {
                    name: Some(name),
                    error_code: code.code(),
                    error_message: message,
                    leader_endpoint,
                },
            )
        })
        .collect();
    fbb.create_vector(&results)
}

fn decode_topic_results<'a>(
    results: Option<flatbuffers::Vector<'a, flatbuffers::ForwardsUOffset<wire::TopicResult<'a>>>>,
) -> Vec<TopicOutcome> {
    results
        .iter()
        .flatten()
        .map(|r| {
            let message = r.error_message();
            let result = match failure(r.error_code(), message, r.leader_endpoint()) {
                None => Ok(()),
                Some(mut f) => {
                    if f.code == ErrorCode::NotController && f.leader_endpoint.is_none() {
                        // An older encoder's NOT_CONTROLLER: the endpoint in
                        // the message.
                        f.leader_endpoint = message.filter(|m| !m.is_empty()).map(str::to_owned);
                    }
                    Err(f)
                }
            };
            TopicOutcome {
                name: r.name().unwrap_or_default().to_owned(),
                result,
            }
        })
        .collect()
}

pub fn encode_create_topics_response(outcomes: &[TopicOutcome]) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let results = encode_topic_results(&mut fbb, outcomes);
    let root = wire::CreateTopicsResponse::create(
        &mut fbb,
        &wire::CreateTopicsResponseArgs {
            results: Some(results),
        },
    );
    finish(fbb, root)
}

pub fn decode_create_topics_response(body: &[u8]) -> Result<Vec<TopicOutcome>, WireError> {
    let r = flatbuffers::root::<wire::CreateTopicsResponse>(body)?;
    Ok(decode_topic_results(r.results()))
}

pub fn encode_delete_topics_response(outcomes: &[TopicOutcome]) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let results = encode_topic_results(&mut fbb, outcomes);
    let root = wire::DeleteTopicsResponse::create(
        &mut fbb,
        &wire::DeleteTopicsResponseArgs {
            results: Some(results),
        },
    );
    finish(fbb, root)
}

pub fn decode_delete_topics_response(body: &[u8]) -> Result<Vec<TopicOutcome>, WireError> {
    let r = flatbuffers::root::<wire::DeleteTopicsResponse>(body)?;
    Ok(decode_topic_results(r.results()))
}

pub fn encode_alter_topic_configs_request(specs: &[AlterTopicConfigSpec]) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let topics: Vec<_> = specs
        .iter()
        .map(|s| {
            let name = fbb.create_string(&s.name);
            let set = encode_configs(&mut fbb, &s.set);
            let remove: Vec<_> = s.remove.iter().map(|k| fbb.create_string(k)).collect();
            let remove = fbb.create_vector(&remove);
            wire::AlterTopicConfig::create(
                &mut fbb,
                &wire::AlterTopicConfigArgs {
                    name: Some(name),
                    set: Some(set),
                    remove: Some(remove),
                },
            )
        })
        .collect();
    let topics = fbb.create_vector(&topics);
    let root = wire::AlterTopicConfigsRequest::create(
        &mut fbb,
        &wire::AlterTopicConfigsRequestArgs {
            topics: Some(topics),
        },
    );
    finish(fbb, root)
}

pub fn decode_alter_topic_configs_request(
    body: &[u8],
) -> Result<Vec<AlterTopicConfigSpec>, WireError> {
    let r = flatbuffers::root::<wire::AlterTopicConfigsRequest>(body)?;
    let topics = r.topics().ok_or(WireError::Missing("topics"))?;
    bounded("topics", topics.len(), TOPICS_PER_REQUEST_MAX)?;
    topics
        .iter()
        .map(|t| {
            let remove = t.remove();
            bounded(
                "remove",
                remove.map_or(0, |r| r.len()),
                CONFIG_KEYS_PER_TOPIC_MAX,
            )?;
            Ok(AlterTopicConfigSpec {
                name: t.name().ok_or(WireError::Missing("name"))?.to_owned(),
                set: decode_configs(t.set())?,
                remove: remove.iter().flatten().map(str::to_owned).collect(),
            })
        })
        .collect()
}

pub fn encode_alter_topic_configs_response(outcomes: &[TopicOutcome]) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let results = encode_topic_results(&mut fbb, outcomes);
    let root = wire::AlterTopicConfigsResponse::create(
        &mut fbb,
        &wire::AlterTopicConfigsResponseArgs {
            results: Some(results),
        },
    );
    finish(fbb, root)
}

pub fn decode_alter_topic_configs_response(body: &[u8]) -> Result<Vec<TopicOutcome>, WireError> {
    let r = flatbuffers::root::<wire::AlterTopicConfigsResponse>(body)?;
    Ok(decode_topic_results(r.results()))
}
