//! Metadata: this broker, its shard endpoints, and each requested topic's
//! partitions with leader, epoch and owning shard.

use std::rc::Rc;

use protocol::flatbuffers::FlatBufferBuilder;
use protocol::{wire, ErrorCode};

use super::{finish, parse, HandlerResult, Reply};
use crate::cluster_view::ClusterView;
use crate::shard::Shard;

pub(super) fn handle(shard: &Rc<Shard>, body: &[u8]) -> HandlerResult {
    let request = parse::<wire::MetadataRequest>(body)?;
    let requested: Option<Vec<String>> = request
        .topics()
        .filter(|t| !t.is_empty())
        .map(|t| t.iter().map(str::to_owned).collect());
    let config = &shard.config;
    let node_id = config.node_id;
    let mut fbb = FlatBufferBuilder::new();
    let shard_endpoints: Vec<_> = (0..shard.count)
        .map(|i| {
            let host = fbb.create_string(&config.advertised_host);
            wire::ShardEndpoint::create(
                &mut fbb,
                &wire::ShardEndpointArgs {
                    shard: i as u16,
                    host: Some(host),
                    port: config.shard_port(i),
                },
            )
        })
        .collect();
    let shards = fbb.create_vector(&shard_endpoints);
    let host = fbb.create_string(&config.advertised_host);
    let broker = wire::BrokerInfo::create(
        &mut fbb,
        &wire::BrokerInfoArgs {
            node_id,
            host: Some(host),
            port: config.listen.port(),
            shards: Some(shards),
        },
    );
    let brokers = fbb.create_vector(&[broker]);
    let view = shard.view.borrow();
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
        let partitions: Vec<_> = (0..meta.partitions)
            .map(|p| {
                let replicas = fbb.create_vector(&[node_id]);
                let isr = fbb.create_vector(&[node_id]);
                wire::PartitionInfo::create(
                    &mut fbb,
                    &wire::PartitionInfoArgs {
                        partition: p,
                        error_code: 0,
                        leader: node_id,
                        leader_epoch: 0,
                        shard: ClusterView::shard_for(meta.id, p, shard.count) as u16,
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
            controller_id: node_id,
            topics: Some(topics),
        },
    );
    Ok(Reply::Body {
        body: finish(fbb, root),
        payload: Vec::new(),
    })
}
