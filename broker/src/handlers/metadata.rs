//! Metadata: the live brokers with their shard endpoints, and each requested
//! topic's partitions with leader, leader epoch, the leader's owning shard,
//! replicas and ISR, all from this shard's copy of the controller's metadata.
//! Any broker answers for the whole cluster.

use std::rc::Rc;

use protocol::control::messages::BrokerView;
use protocol::flatbuffers::{FlatBufferBuilder, WIPOffset};
use protocol::{wire, ErrorCode};

use super::{finish, parse, HandlerResult, Reply};
use crate::shard::Shard;

/// "host:port" split at the last colon; IPv6 brackets removed.
pub(super) fn split_endpoint(endpoint: &str) -> (&str, u16) {
    match endpoint.rsplit_once(':') {
        Some((host, port)) => (
            host.trim_start_matches('[').trim_end_matches(']'),
            port.parse().unwrap_or(0),
        ),
        None => (endpoint, 0),
    }
}

fn broker_info<'a>(
    fbb: &mut FlatBufferBuilder<'a>,
    broker: &BrokerView,
) -> WIPOffset<wire::BrokerInfo<'a>> {
    let shard_endpoints: Vec<_> = broker
        .endpoints
        .shards
        .iter()
        .enumerate()
        .map(|(i, endpoint)| {
            let (host, port) = split_endpoint(endpoint);
            let host = fbb.create_string(host);
            wire::ShardEndpoint::create(
                fbb,
                &wire::ShardEndpointArgs {
                    shard: u16::try_from(i).expect("shard count bounded"),
                    host: Some(host),
                    port,
                },
            )
        })
        .collect();
    let shards = fbb.create_vector(&shard_endpoints);
    let (host, port) = split_endpoint(&broker.endpoints.client);
    let host = fbb.create_string(host);
    wire::BrokerInfo::create(
        fbb,
        &wire::BrokerInfoArgs {
            node_id: i32::try_from(broker.id.0).unwrap_or(i32::MAX),
            host: Some(host),
            port,
            shards: Some(shards),
        },
    )
}

fn to_i32(id: u32) -> i32 {
    i32::try_from(id).unwrap_or(i32::MAX)
}

pub(super) fn handle(shard: &Rc<Shard>, body: &[u8]) -> HandlerResult {
    let request = parse::<wire::MetadataRequest>(body)?;
    let requested: Option<Vec<String>> = request
        .topics()
        .filter(|t| !t.is_empty())
        .map(|t| t.iter().map(str::to_owned).collect());
    let view = shard.view();
    let mut fbb = FlatBufferBuilder::new();
    let brokers: Vec<_> = view
        .brokers
        .values()
        .filter(|b| !b.fenced)
        .map(|b| broker_info(&mut fbb, b))
        .collect();
    let brokers = fbb.create_vector(&brokers);
    let names: Vec<String> = requested.unwrap_or_else(|| view.topics.keys().cloned().collect());
    let mut topics = Vec::new();
    for name in &names {
        let fb_name = fbb.create_string(name);
        let Some(meta) = view.topic(name) else {
            topics.push(wire::TopicInfo::create(
                &mut fbb,
                &wire::TopicInfoArgs {
                    name: Some(fb_name),
                    error_code: ErrorCode::UnknownTopicOrPartition.code(),
                    partitions: None,
                },
            ));
            continue;
        };
        let partitions: Vec<_> = meta
            .partitions
            .iter()
            .enumerate()
            .map(|(index, p)| {
                let replica_ids: Vec<i32> =
                    p.replicas.iter().map(|r| to_i32(r.broker_id.0)).collect();
                let isr_ids: Vec<i32> = p.isr.iter().map(|b| to_i32(b.0)).collect();
                let replicas = fbb.create_vector(&replica_ids);
                let isr = fbb.create_vector(&isr_ids);
                let leader_shard = p
                    .leader
                    .and_then(|leader| p.replica_on(leader))
                    .map_or(0, |r| r.shard.0);
                wire::PartitionInfo::create(
                    &mut fbb,
                    &wire::PartitionInfoArgs {
                        partition: i32::try_from(index).expect("partition count bounded"),
                        error_code: 0,
                        leader: p.leader.map_or(-1, |b| to_i32(b.0)),
                        leader_epoch: p.leader_epoch.0,
                        shard: leader_shard,
                        replicas: Some(replicas),
                        isr: Some(isr),
                    },
                )
            })
            .collect();
        let partitions = fbb.create_vector(&partitions);
        topics.push(wire::TopicInfo::create(
            &mut fbb,
            &wire::TopicInfoArgs {
                name: Some(fb_name),
                error_code: 0,
                partitions: Some(partitions),
            },
        ));
    }
    let topics = fbb.create_vector(&topics);
    let root = wire::MetadataResponse::create(
        &mut fbb,
        &wire::MetadataResponseArgs {
            brokers: Some(brokers),
            controller_id: -1,
            topics: Some(topics),
        },
    );
    Ok(Reply::Body {
        body: finish(fbb, root),
        payload: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::split_endpoint;

    #[test]
    fn endpoints_split_at_the_last_colon() {
        assert_eq!(split_endpoint("127.0.0.1:9092"), ("127.0.0.1", 9092));
        assert_eq!(split_endpoint("[::1]:9092"), ("::1", 9092));
        assert_eq!(split_endpoint("nonsense"), ("nonsense", 0));
    }
}
