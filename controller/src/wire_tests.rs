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

    // What the real state machine answers round-trips: its image and every
    // delta it recorded (the API-by-API round trip of every message shape is
    // protocol/tests/control_round_trip.rs).
    #[test]
    fn metadata_of_the_real_state_round_trips() {
        let state = state();
        let deltas = state.deltas_since(MetadataVersion(0)).expect("retained");
        assert!(
            deltas.len() > 5,
            "the state recorded several kinds of delta"
        );
        let answers = [
            MetadataAnswer::Image(state.image()),
            MetadataAnswer::Deltas {
                metadata_version: state.metadata_version(),
                deltas,
            },
        ];
        for answer in answers {
            let response = Ok(answer);
            let body = FetchMetadataApi::encode_response(&response);
            let decoded = FetchMetadataApi::decode_response(&body).expect("decodes");
            assert_eq!(decoded, FetchMetadataApi::as_decoded(&response));
        }
    }
}
