//! Building this controller's Raft node from its config: openraft's timing
//! settings, the durable stores, the TCP network, and the one-time bootstrap of
//! a new quorum. Owns no long-running task.
//!
//! Bootstrap: only the node with the lowest id in `peers` calls `initialize`,
//! and only when its store holds nothing (`is_initialized` is false), with every
//! peer as a voter. The others wait to be contacted by it. A restarted node
//! never initializes: it rejoins from the log and vote on disk.

use std::collections::BTreeMap;
use std::sync::Arc;

use openraft::error::{InitializeError, RaftError};
use openraft::{BasicNode, Config};

use crate::config::ControllerConfig;
use crate::raft_network::{TcpRaftNetwork, SNAPSHOT_CHUNK_BYTES_MAX};
use crate::state::StateLimits;
use crate::store::{self, ControllerRaft, LogRecovery, StateMachineStore};

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("open stores: {0}")]
    Store(#[from] store::StoreError),
    #[error("raft config: {0}")]
    Config(#[from] Box<openraft::ConfigError>),
    #[error("raft: {0}")]
    Fatal(#[from] openraft::error::Fatal<u64>),
    #[error("initialize: {0}")]
    Initialize(#[from] RaftError<u64, InitializeError<u64, BasicNode>>),
}

pub struct Node {
    pub raft: ControllerRaft,
    pub state_machine: StateMachineStore,
    pub recovery: LogRecovery,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("recovery", &self.recovery)
            .finish_non_exhaustive()
    }
}

fn raft_config(config: &ControllerConfig) -> Result<Arc<Config>, Box<openraft::ConfigError>> {
    let raft = Config {
        cluster_name: "ringlog-controller".into(),
        heartbeat_interval: config.raft_heartbeat_interval_ms,
        election_timeout_min: config.election_timeout_ms,
        election_timeout_max: config.election_timeout_ms * 2,
        snapshot_max_chunk_size: SNAPSHOT_CHUNK_BYTES_MAX as u64,
        ..Config::default()
    };
    Ok(Arc::new(raft.validate().map_err(Box::new)?))
}

/// Opens the stores in the data directory and starts the Raft node.
pub async fn start(config: &ControllerConfig) -> Result<Node, NodeError> {
    let (log, state_machine, recovery) = store::open(&config.data_dir, StateLimits::default())?;
    let raft = ControllerRaft::new(
        config.node_id,
        raft_config(config)?,
        TcpRaftNetwork::new(config.node_id),
        log,
        state_machine.clone(),
    )
    .await?;
    Ok(Node {
        raft,
        state_machine,
        recovery,
    })
}

/// Initializes a new quorum if this node is the lowest peer and its store is
/// empty. Returns whether it did.
pub async fn bootstrap(node: &Node, config: &ControllerConfig) -> Result<bool, NodeError> {
    let lowest = *config
        .peers
        .keys()
        .next()
        .expect("validated: peers non-empty");
    if lowest != config.node_id || node.raft.is_initialized().await? {
        return Ok(false);
    }
    let voters: BTreeMap<u64, BasicNode> = config
        .peers
        .iter()
        .map(|(id, endpoint)| (*id, BasicNode::new(endpoint)))
        .collect();
    match node.raft.initialize(voters).await {
        Ok(()) => Ok(true),
        // Raced with a vote from a peer that already formed the quorum: fine.
        Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(false),
        Err(e) => Err(e.into()),
    }
}
