//! A real one-node openraft `Raft` over the durable stores: it elects itself,
//! commits and applies controller commands, snapshots, purges, and after a
//! restart on the same directory comes back with the same cluster state.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use controller::state::StateLimits;
use controller::store::{self, ControllerRaft, StateMachineStore, TypeConfig};
use controller::{BrokerId, Command, Outcome};
use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Config};
use tempfile::TempDir;

const WAIT: Option<Duration> = Some(Duration::from_secs(10));

/// A network with no peers: a one-node cluster never sends an RPC.
struct NoPeers;

fn unreachable() -> Unreachable {
    Unreachable::new(&io::Error::other("single-node test has no peers"))
}

impl RaftNetworkFactory<TypeConfig> for NoPeers {
    type Network = NoPeers;

    async fn new_client(&mut self, _target: u64, _node: &BasicNode) -> NoPeers {
        NoPeers
    }
}

impl RaftNetwork<TypeConfig> for NoPeers {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        Err(RPCError::Unreachable(unreachable()))
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>,
    > {
        Err(RPCError::Unreachable(unreachable()))
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<u64>,
        _option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        Err(RPCError::Unreachable(unreachable()))
    }
}

async fn start(dir: &Path) -> (ControllerRaft, StateMachineStore) {
    let config = Config {
        heartbeat_interval: 50,
        election_timeout_min: 150,
        election_timeout_max: 300,
        ..Config::default()
    };
    let config = Arc::new(config.validate().expect("valid raft config"));
    let (log, state_machine, _) = store::open(dir, StateLimits::default()).expect("open stores");
    let raft = ControllerRaft::new(1, config, NoPeers, log, state_machine.clone())
        .await
        .expect("start raft");
    (raft, state_machine)
}

fn register(id: u32) -> Command {
    Command::RegisterBroker {
        broker_id: BrokerId(id),
        endpoints: crate::support::endpoints(id, 2),
        now_ms: 0,
        session_timeout_ms: 1_000,
        incarnation_id: 0,
    }
}

// Commands commit and apply through openraft; the state survives a restart via
// the snapshot plus the log entries after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_commits_snapshots_and_recovers() {
    let dir = TempDir::new().expect("tempdir");
    let applied = {
        let (raft, state_machine) = start(dir.path()).await;
        raft.initialize(BTreeMap::from([(1, BasicNode::new("127.0.0.1:0"))]))
            .await
            .expect("initialize");
        raft.wait(WAIT)
            .current_leader(1, "self elected")
            .await
            .expect("leader");

        let reply = raft.client_write(register(1)).await.expect("write").data;
        assert!(
            matches!(reply.result, Ok(Outcome::BrokerRegistered { .. })),
            "{reply:?}"
        );
        raft.trigger().snapshot().await.expect("trigger snapshot");
        let last = state_machine.last_applied_log_id().expect("applied");
        raft.wait(WAIT)
            .snapshot(last, "snapshot built")
            .await
            .expect("snapshot");

        // Entries after the snapshot are recovered from the log, not the snapshot.
        let reply = raft.client_write(register(2)).await.expect("write").data;
        assert!(
            matches!(reply.result, Ok(Outcome::BrokerRegistered { .. })),
            "{reply:?}"
        );
        let applied = state_machine.last_applied_log_id().expect("applied");
        raft.shutdown().await.expect("shutdown");
        applied
    };

    let (raft, state_machine) = start(dir.path()).await;
    raft.wait(WAIT)
        .current_leader(1, "re-elected")
        .await
        .expect("leader after restart");
    raft.wait(WAIT)
        .applied_index_at_least(Some(applied.index), "re-applied")
        .await
        .expect("re-applied");
    let brokers = state_machine.with_state(|s| s.brokers().map(|b| b.id).collect::<Vec<_>>());
    assert_eq!(brokers, vec![BrokerId(1), BrokerId(2)]);
    raft.shutdown().await.expect("shutdown");
}
