//! Round trips of the controller API codec (`protocol::control::codec`) over
//! metadata the real state machine produced.

#[cfg(test)]
mod tests {
    use crate::command::Command;
    use crate::state::ClusterState;
    use protocol::control::codec::*;
    use protocol::control::messages::*;
    use protocol::control::records::*;
    use protocol::ids::*;
    use protocol::ErrorCode;
    use std::collections::BTreeMap;

    fn state() -> ClusterState {
        let mut state = ClusterState::default();
        for id in 1..=3 {
            let reply = state.apply(&Command::RegisterBroker {
                broker_id: BrokerId(id),
                endpoints: BrokerEndpoints {
                    client: format!("h:{id}"),
                    shards: vec![format!("h:{}", 100 + id), format!("h:{}", 200 + id)],
                },
                now_ms: 0,
                session_timeout_ms: 1_000,
                incarnation_id: 0,
            });
            let Ok(crate::Outcome::BrokerRegistered { broker_epoch }) = reply.result else {
                panic!("{reply:?}");
            };
            state.apply(&Command::UnfenceBroker {
                broker_id: BrokerId(id),
                broker_epoch,
            });
        }
        let config = BTreeMap::from([("retention.ms".to_owned(), "1000".to_owned())]);
        state.apply(&Command::CreateTopic {
            name: "t".into(),
            partition_count: 4,
            replication_factor: 3,
            config,
        });
        state.apply(&Command::FenceExpiredBrokers { now_ms: 5_000 });
        state
    }

    // The image and every kind of delta survive encode and decode unchanged.
    #[test]
    fn metadata_round_trips() {
        let state = state();
        let image = state.image();
        let body = encode_fetch_metadata_response(&Ok(MetadataAnswer::Image(image.clone())));
        let Ok(Ok(MetadataUpdate::Image(view))) = decode_fetch_metadata_response(&body) else {
            panic!("image expected");
        };
        assert_eq!(view.metadata_version, image.metadata_version);
        assert_eq!(view.topics, image.topics);
        let brokers: Vec<BrokerView> = image.brokers.iter().map(broker_view).collect();
        assert_eq!(view.brokers, brokers);

        let deltas = state.deltas_since(MetadataVersion(0)).expect("retained");
        let answer = MetadataAnswer::Deltas {
            metadata_version: state.metadata_version(),
            deltas: deltas.clone(),
        };
        let body = encode_fetch_metadata_response(&Ok(answer));
        let Ok(Ok(MetadataUpdate::Deltas { deltas: views, .. })) =
            decode_fetch_metadata_response(&body)
        else {
            panic!("deltas expected");
        };
        assert_eq!(views.len(), deltas.len());
        for ((version, view), delta) in views.iter().zip(&deltas) {
            assert_eq!(*version, delta.version);
            let same = match (&delta.delta, view) {
                (Delta::BrokerRegistered(r), DeltaView::BrokerRegistered(v)) => {
                    broker_view(r) == *v
                }
                (Delta::BrokerFenced(a), DeltaView::BrokerFenced(b))
                | (Delta::BrokerUnfenced(a), DeltaView::BrokerUnfenced(b)) => a == b,
                (Delta::TopicCreated(a), DeltaView::TopicCreated(b)) => a == b,
                (
                    Delta::PartitionChanged {
                        topic_id,
                        partition,
                        record,
                    },
                    DeltaView::PartitionChanged {
                        topic_id: t,
                        partition: p,
                        record: r,
                    },
                ) => topic_id == t && partition == p && record == r,
                _ => false,
            };
            assert!(same, "{delta:?} decoded as {view:?}");
        }
    }

    // A NOT_CONTROLLER failure keeps the leader's endpoint, in both response shapes.
    #[test]
    fn not_controller_carries_the_leader() {
        let failure = ApiFailure::not_controller(Some("h:9".into()));
        let body = encode_broker_heartbeat_response(&Err(failure.clone()));
        let decoded = decode_broker_heartbeat_response(&body)
            .unwrap()
            .unwrap_err();
        assert_eq!(decoded.leader_endpoint.as_deref(), Some("h:9"));
        let outcome = TopicOutcome {
            name: "t".into(),
            result: Err(failure),
        };
        let body = encode_create_topics_response(&[outcome]);
        let decoded = decode_create_topics_response(&body).unwrap();
        let failure = decoded[0].result.clone().unwrap_err();
        assert_eq!(failure.code, ErrorCode::NotController);
        assert_eq!(failure.leader_endpoint.as_deref(), Some("h:9"));
    }

    #[test]
    fn alter_isr_round_trips() {
        let request = AlterIsr {
            leader_id: BrokerId(2),
            topic_id: TopicId(9),
            partition: PartitionIndex(3),
            leader_epoch: LeaderEpoch(4),
            partition_epoch: PartitionEpoch(7),
            new_isr: vec![BrokerId(1), BrokerId(2)],
            new_isr_epochs: vec![BrokerEpoch(11), BrokerEpoch(12)],
        };
        let decoded = decode_alter_isr_request(&encode_alter_isr_request(&request)).unwrap();
        assert_eq!(decoded, request);
        let record = PartitionRecord {
            replicas: vec![Replica {
                broker_id: BrokerId(2),
                shard: ShardIndex(1),
            }],
            isr: vec![BrokerId(2)],
            leader: Some(BrokerId(2)),
            leader_epoch: LeaderEpoch(4),
            partition_epoch: PartitionEpoch(8),
        };
        let ok = Ok((PartitionIndex(3), record));
        assert_eq!(
            decode_alter_isr_response(&encode_alter_isr_response(&ok)).unwrap(),
            ok
        );
        let stale = Err(ApiFailure::new(ErrorCode::StaleLeaderEpoch, "old"));
        assert_eq!(
            decode_alter_isr_response(&encode_alter_isr_response(&stale)).unwrap(),
            stale
        );
    }

    #[test]
    fn decoders_never_panic_on_garbage() {
        for len in 0..64u8 {
            let bytes: Vec<u8> = (0..len).map(|i| i.wrapping_mul(37)).collect();
            let _ = decode_fetch_metadata_response(&bytes);
            let _ = decode_register_broker_request(&bytes);
            let _ = decode_create_topics_request(&bytes);
            let _ = decode_alter_isr_request(&bytes);
            let _ = decode_alter_isr_response(&bytes);
        }
    }
}
