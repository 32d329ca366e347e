//! Helpers shared by the integration tests: building commands and driving a
//! `ClusterState` with invariant checks after every step.

use std::collections::BTreeMap;

use controller::{
    BrokerEndpoints, BrokerEpoch, BrokerId, ClusterState, Command, Outcome, Reply, TopicId,
};

pub fn endpoints(id: u32, shard_count: u16) -> BrokerEndpoints {
    BrokerEndpoints {
        client: format!("127.0.0.1:{}", 9000 + id),
        shards: (0..shard_count)
            .map(|s| format!("127.0.0.1:{}", 10_000 + id * 100 + u32::from(s)))
            .collect(),
    }
}

/// Applies a command, then checks the state's invariants and that it is a valid
/// successor of the state before.
pub fn step(state: &mut ClusterState, command: &Command) -> Reply {
    let before = state.clone();
    let reply = state.apply(command);
    state.check_invariants();
    state.check_successor(&before);
    if reply.result.is_err() {
        assert_eq!(
            state.topics().collect::<Vec<_>>(),
            before.topics().collect::<Vec<_>>()
        );
        assert_eq!(state.metadata_version(), before.metadata_version());
    }
    reply
}

/// Registers and unfences a broker; returns its epoch.
pub fn join(state: &mut ClusterState, id: u32, shard_count: u16, now_ms: u64) -> BrokerEpoch {
    let register = Command::RegisterBroker {
        broker_id: BrokerId(id),
        endpoints: endpoints(id, shard_count),
        now_ms,
        session_timeout_ms: 1_000,
        incarnation_id: 0,
    };
    let Ok(Outcome::BrokerRegistered { broker_epoch }) = step(state, &register).result else {
        panic!("register {id} failed");
    };
    let unfence = Command::UnfenceBroker {
        broker_id: BrokerId(id),
        broker_epoch,
    };
    assert_eq!(step(state, &unfence).result, Ok(Outcome::BrokerUnfenced));
    broker_epoch
}

pub fn create_topic(
    state: &mut ClusterState,
    name: &str,
    partition_count: u32,
    rf: u16,
    unclean: bool,
) -> TopicId {
    let mut config = BTreeMap::new();
    if unclean {
        config.insert(
            "unclean.leader.election.enable".to_owned(),
            "true".to_owned(),
        );
    }
    let command = Command::CreateTopic {
        name: name.to_owned(),
        partition_count,
        replication_factor: rf,
        config,
    };
    match step(state, &command).result {
        Ok(Outcome::TopicCreated { topic_id }) => topic_id,
        other => panic!("create {name}: {other:?}"),
    }
}
