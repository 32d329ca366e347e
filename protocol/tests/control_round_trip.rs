//! The controller API's one round-trip test: every API behind
//! `ControllerApi`, every request and response shape (success and each kind
//! of failure), encoded and decoded back to what `as_decoded` says; and every
//! decoder over garbage without a panic.

use std::collections::BTreeMap;
use std::fmt::Debug;

use protocol::control::codec::*;
use protocol::control::messages::*;
use protocol::control::records::*;
use protocol::ids::*;
use protocol::ErrorCode;

fn round_trip<A: ControllerApi>(requests: &[A::Request], responses: &[A::Response])
where
    A::Request: PartialEq + Debug,
    A::Decoded: PartialEq + Debug,
{
    assert!(
        !requests.is_empty() && !responses.is_empty(),
        "{}: nothing to check",
        A::NAME
    );
    for request in requests {
        let decoded = A::decode_request(&A::encode_request(request))
            .unwrap_or_else(|e| panic!("{} request {request:?}: {e}", A::NAME));
        assert_eq!(&decoded, request, "{} request", A::NAME);
    }
    for response in responses {
        let decoded = A::decode_response(&A::encode_response(response))
            .unwrap_or_else(|e| panic!("{} response: {e}", A::NAME));
        assert_eq!(decoded, A::as_decoded(response), "{} response", A::NAME);
    }
}

fn failures() -> Vec<ApiFailure> {
    vec![
        ApiFailure::not_controller(Some("h:9".into())),
        ApiFailure::not_controller(None),
        ApiFailure::new(ErrorCode::StaleLeaderEpoch, "old"),
        ApiFailure::new(ErrorCode::InvalidConfig, ""),
    ]
}

fn failed<T>() -> Vec<Result<T, ApiFailure>> {
    failures().into_iter().map(Err).collect()
}

fn endpoints(id: u32) -> BrokerEndpoints {
    BrokerEndpoints {
        client: format!("h:{id}"),
        shards: vec![format!("h:{}", 100 + id), format!("h:{}", 200 + id)],
    }
}

fn broker(id: u32, fenced: bool) -> BrokerRecord {
    BrokerRecord {
        id: BrokerId(id),
        epoch: BrokerEpoch(u64::from(id) * 7),
        endpoints: endpoints(id),
        fenced,
        session_timeout_ms: 9_000,
        session_deadline_ms: 123_456,
        incarnation_id: 77,
    }
}

fn partition(leader: Option<u32>) -> PartitionRecord {
    PartitionRecord {
        replicas: vec![
            Replica {
                broker_id: BrokerId(1),
                shard: ShardIndex(0),
            },
            Replica {
                broker_id: BrokerId(2),
                shard: ShardIndex(1),
            },
        ],
        isr: vec![BrokerId(1), BrokerId(2)],
        leader: leader.map(BrokerId),
        leader_epoch: LeaderEpoch(4),
        partition_epoch: PartitionEpoch(9),
    }
}

fn topic() -> TopicRecord {
    TopicRecord {
        id: TopicId(3),
        name: "orders".into(),
        replication_factor: 2,
        config: BTreeMap::from([("retention.ms".into(), "1000".into())]),
        partitions: vec![partition(Some(1)), partition(None)],
    }
}

#[test]
fn every_controller_api_round_trips() {
    let mut registered = vec![Ok(Registered {
        broker_epoch: BrokerEpoch(12),
        session_timeout_ms: 9_000,
    })];
    registered.extend(failed());
    round_trip::<RegisterBrokerApi>(
        &[RegisterBroker {
            broker_id: BrokerId(2),
            endpoints: endpoints(2),
            incarnation_id: u64::MAX,
        }],
        &registered,
    );

    let mut sessions: Vec<Result<SessionState, ApiFailure>> = [
        SessionState::Alive,
        SessionState::Fenced,
        SessionState::Unregistered,
    ]
    .into_iter()
    .map(Ok)
    .collect();
    sessions.extend(failed());
    round_trip::<BrokerHeartbeatApi>(
        &[
            BrokerHeartbeat {
                broker_id: BrokerId(1),
                broker_epoch: BrokerEpoch(5),
                ready: true,
                want_shutdown: false,
            },
            BrokerHeartbeat {
                broker_id: BrokerId(1),
                broker_epoch: BrokerEpoch(5),
                ready: false,
                want_shutdown: true,
            },
        ],
        &sessions,
    );

    let image = MetadataImage {
        metadata_version: MetadataVersion(40),
        brokers: vec![broker(1, false), broker(2, true)],
        topics: vec![topic()],
    };
    let deltas = [
        Delta::BrokerRegistered(broker(3, true)),
        Delta::BrokerFenced(BrokerId(2)),
        Delta::BrokerUnfenced(BrokerId(3)),
        Delta::TopicCreated(topic()),
        Delta::TopicDeleted {
            topic_id: TopicId(2),
            name: "gone".into(),
        },
        Delta::PartitionChanged {
            topic_id: TopicId(3),
            partition: PartitionIndex(1),
            record: partition(Some(2)),
        },
        Delta::TopicConfigChanged {
            topic_id: TopicId(3),
            config: BTreeMap::from([("cleanup.policy".into(), "compact".into())]),
        },
    ]
    .into_iter()
    .enumerate()
    .map(|(i, delta)| VersionedDelta {
        version: MetadataVersion(41 + i as u64),
        delta,
    })
    .collect();
    let mut answers = vec![
        Ok(MetadataAnswer::Image(image)),
        Ok(MetadataAnswer::Deltas {
            metadata_version: MetadataVersion(46),
            deltas,
        }),
        Ok(MetadataAnswer::Deltas {
            metadata_version: MetadataVersion(46),
            deltas: Vec::new(),
        }),
    ];
    answers.extend(failed());
    round_trip::<FetchMetadataApi>(
        &[
            FetchMetadata {
                from_version: MetadataVersion(40),
                max_wait_ms: 2_000,
                full_image: false,
            },
            FetchMetadata {
                from_version: MetadataVersion(0),
                max_wait_ms: 0,
                full_image: true,
            },
        ],
        &answers,
    );

    let mut isr_answers = vec![Ok((PartitionIndex(1), partition(Some(2))))];
    isr_answers.extend(failed());
    round_trip::<AlterIsrApi>(
        &[AlterIsr {
            leader_id: BrokerId(2),
            topic_id: TopicId(9),
            partition: PartitionIndex(3),
            leader_epoch: LeaderEpoch(4),
            partition_epoch: PartitionEpoch(7),
            new_isr: vec![BrokerId(1), BrokerId(2)],
            new_isr_epochs: vec![BrokerEpoch(11), BrokerEpoch(12)],
        }],
        &isr_answers,
    );

    let mut block_answers = vec![Ok(ProducerIdBlock {
        first: 4_000,
        count: 1_000,
    })];
    block_answers.extend(failed());
    round_trip::<AllocateProducerIdsApi>(
        &[AllocateProducerIds {
            broker_id: BrokerId(3),
            broker_epoch: BrokerEpoch(12),
        }],
        &block_answers,
    );

    round_trip::<DescribeClusterApi>(
        &[()],
        &[ClusterDescription {
            node_id: 1,
            leader_id: Some(2),
            leader_endpoint: Some("c:2".into()),
            raft_term: 8,
            metadata_version: MetadataVersion(46),
            controllers: vec![ControllerDescription {
                id: 2,
                endpoint: "c:2".into(),
                is_leader: true,
            }],
            brokers: vec![BrokerDescription {
                broker: broker_view(&broker(1, false)),
                partitions_led: 3,
            }],
        }],
    );

    let outcomes = vec![
        TopicOutcome {
            name: "orders".into(),
            result: Ok(()),
        },
        TopicOutcome {
            name: "bad".into(),
            result: Err(ApiFailure::new(
                ErrorCode::InvalidConfig,
                "retention.ms: not a number",
            )),
        },
        TopicOutcome {
            name: "elsewhere".into(),
            result: Err(ApiFailure::not_controller(Some("c:3".into()))),
        },
    ];
    round_trip::<CreateTopicsApi>(
        &[vec![CreateTopicSpec {
            name: "orders".into(),
            partition_count: 16,
            replication_factor: 3,
            config: BTreeMap::from([("cleanup.policy".into(), "delete".into())]),
        }]],
        std::slice::from_ref(&outcomes),
    );
    round_trip::<DeleteTopicsApi>(
        &[vec!["orders".into(), "bad".into()]],
        std::slice::from_ref(&outcomes),
    );
    round_trip::<AlterTopicConfigsApi>(
        &[vec![
            AlterTopicConfigSpec {
                name: "orders".into(),
                set: BTreeMap::from([
                    ("cleanup.policy".into(), "compact".into()),
                    ("delete.retention.ms".into(), "1000".into()),
                ]),
                remove: vec!["retention.ms".into()],
            },
            AlterTopicConfigSpec {
                name: "empty".into(),
                set: BTreeMap::new(),
                remove: Vec::new(),
            },
        ]],
        std::slice::from_ref(&outcomes),
    );
}

#[test]
fn no_decoder_panics_on_garbage() {
    for len in 0..256usize {
        let bytes: Vec<u8> = (0..len)
            .map(|i| (i as u8).wrapping_mul(37) ^ 0x5a)
            .collect();
        decode_with_every_api(&bytes);
    }
}
