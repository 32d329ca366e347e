//! DescribeCluster: the controllers and brokers as the leader sees them.

use super::*;

pub fn encode_describe_cluster_request() -> Vec<u8> {
    let mut fbb = Fbb::new();
    let root = wire::DescribeClusterRequest::create(&mut fbb, &wire::DescribeClusterRequestArgs {});
    finish(fbb, root)
}

pub fn decode_describe_cluster_request(body: &[u8]) -> Result<(), WireError> {
    flatbuffers::root::<wire::DescribeClusterRequest>(body)?;
    Ok(())
}

pub fn encode_describe_cluster_response(c: &ClusterDescription) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let controllers: Vec<_> = c
        .controllers
        .iter()
        .map(|n| {
            let endpoint = fbb.create_string(&n.endpoint);
            wire::ControllerNode::create(
                &mut fbb,
                &wire::ControllerNodeArgs {
                    id: n.id,
                    endpoint: Some(endpoint),
                    is_leader: n.is_leader,
                },
            )
        })
        .collect();
    let controllers = fbb.create_vector(&controllers);
    let brokers: Vec<_> = c
        .brokers
        .iter()
        .map(|b| {
            let endpoints = encode_endpoints(&mut fbb, &b.broker.endpoints);
            wire::ClusterBroker::create(
                &mut fbb,
                &wire::ClusterBrokerArgs {
                    id: b.broker.id.0,
                    epoch: b.broker.epoch.0,
                    endpoints: Some(endpoints),
                    fenced: b.broker.fenced,
                    partitions_led: b.partitions_led,
                },
            )
        })
        .collect();
    let brokers = fbb.create_vector(&brokers);
    let leader_endpoint = opt_str(&mut fbb, c.leader_endpoint.as_deref());
    let root = wire::DescribeClusterResponse::create(
        &mut fbb,
        &wire::DescribeClusterResponseArgs {
            error_code: ErrorCode::None.code(),
            error_message: None,
            node_id: c.node_id,
            leader_id: c
                .leader_id
                .map_or(-1, |id| i64::try_from(id).expect("node id fits i64")),
            leader_endpoint,
            raft_term: c.raft_term,
            metadata_version: c.metadata_version.0,
            controllers: Some(controllers),
            brokers: Some(brokers),
        },
    );
    finish(fbb, root)
}

pub fn decode_describe_cluster_response(
    body: &[u8],
) -> Result<Result<ClusterDescription, ApiFailure>, WireError> {
    let r = flatbuffers::root::<wire::DescribeClusterResponse>(body)?;
    if let Some(f) = failure(r.error_code(), r.error_message(), r.leader_endpoint()) {
        return Ok(Err(f));
    }
    let controllers = r
        .controllers()
        .iter()
        .flatten()
        .map(|n| ControllerDescription {
            id: n.id(),
            endpoint: n.endpoint().unwrap_or_default().to_owned(),
            is_leader: n.is_leader(),
        })
        .collect();
    let mut brokers = Vec::new();
    for b in r.brokers().iter().flatten() {
        brokers.push(BrokerDescription {
            broker: BrokerView {
                id: BrokerId(b.id()),
                epoch: BrokerEpoch(b.epoch()),
                endpoints: decode_endpoints(b.endpoints())?,
                fenced: b.fenced(),
            },
            partitions_led: b.partitions_led(),
        });
    }
    Ok(Ok(ClusterDescription {
        node_id: r.node_id(),
        leader_id: u64::try_from(r.leader_id()).ok(),
        leader_endpoint: r.leader_endpoint().map(str::to_owned),
        raft_term: r.raft_term(),
        metadata_version: MetadataVersion(r.metadata_version()),
        controllers,
        brokers,
    }))
}
