//! `ControllerService`: the broker-facing controller API on top of the Raft
//! node: turns requests into `Command`s proposed through Raft, answers metadata
//! reads (with a long poll) from the applied state, and describes the cluster.
//! This driver is the only place that reads the wall clock for commands; the
//! state machine gets the time inside the command.
//!
//! Requests that read or change the replicated state are answered only by the
//! Raft leader. A follower does not forward them: it answers NOT_CONTROLLER with
//! the leader's endpoint, so a broker talks to the leader directly and a request
//! never takes two hops or outlives a leadership change inside a follower.
//! Metadata reads on the leader are not linearizable reads (no quorum round):
//! an answer may miss a change committed by a newer leader an instant earlier,
//! which a broker handles like any lag, via epochs on every later request.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use openraft::error::{ClientWriteError, RaftError};
use openraft::ServerState;
use protocol::ErrorCode;

use crate::command::{Command, CommandError, Outcome};
use crate::delta::NeedSnapshot;
use crate::ids::{BrokerId, PartitionIndex};
use crate::messages::{
    AllocateProducerIds, AlterIsr, AlterTopicConfigSpec, ApiFailure, BrokerDescription,
    BrokerHeartbeat, ClusterDescription, ControllerDescription, CreateTopicSpec, FetchMetadata,
    MetadataAnswer, ProducerIdBlock, RegisterBroker, Registered, SessionState, TopicOutcome,
};
use crate::records::PartitionRecord;
use crate::store::{ControllerRaft, StateMachineStore};
use crate::wire::broker_view;

/// Bound on a FetchMetadata long poll, whatever the request asks.
pub const FETCH_WAIT_MS_MAX: u32 = 30_000;

impl std::fmt::Debug for ServiceInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceInner")
            .field("node_id", &self.node_id)
            .field("session_timeout_ms", &self.session_timeout_ms)
            .finish_non_exhaustive()
    }
}

/// Milliseconds since the Unix epoch. Wall-clock time, because session deadlines
/// are replicated and compared by whichever controller leads next.
pub fn wall_clock_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("wall clock after 1970");
    u64::try_from(since.as_millis()).expect("wall clock fits u64 ms")
}

/// Cheap to clone: clones share the Raft node.
#[derive(Clone, Debug)]
pub struct ControllerService {
    inner: Arc<ServiceInner>,
}

struct ServiceInner {
    node_id: u64,
    raft: ControllerRaft,
    state_machine: StateMachineStore,
    session_timeout_ms: u64,
}

impl ControllerService {
    pub fn new(
        node_id: u64,
        raft: ControllerRaft,
        state_machine: StateMachineStore,
        session_timeout_ms: u64,
    ) -> ControllerService {
        ControllerService {
            inner: Arc::new(ServiceInner {
                node_id,
                raft,
                state_machine,
                session_timeout_ms,
            }),
        }
    }

    pub fn raft(&self) -> &ControllerRaft {
        &self.inner.raft
    }

    pub fn state_machine(&self) -> &StateMachineStore {
        &self.inner.state_machine
    }

    pub fn node_id(&self) -> u64 {
        self.inner.node_id
    }

    pub fn session_timeout_ms(&self) -> u64 {
        self.inner.session_timeout_ms
    }

    /// The leader's id and endpoint as this node knows them.
    fn leader(&self) -> (Option<u64>, Option<String>) {
        let metrics = self.inner.raft.metrics();
        let metrics = metrics.borrow();
        let leader = metrics.current_leader;
        let endpoint = leader.and_then(|id| {
            metrics
                .membership_config
                .membership()
                .get_node(&id)
                .map(|n| n.addr.clone())
        });
        (leader, endpoint)
    }

    pub fn is_leader(&self) -> bool {
        let metrics = self.inner.raft.metrics();
        let metrics = metrics.borrow();
        metrics.state == ServerState::Leader && metrics.current_leader == Some(self.inner.node_id)
    }

    fn require_leader(&self) -> Result<(), ApiFailure> {
        if self.is_leader() {
            return Ok(());
        }
        Err(ApiFailure::not_controller(self.leader().1))
    }

    /// Proposes a command and waits until it is committed and applied.
    pub async fn propose(&self, command: Command) -> Result<Outcome, ProposeError> {
        match self.inner.raft.client_write(command).await {
            Ok(response) => response.data.result.map_err(ProposeError::Refused),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
                Err(ProposeError::NotLeader(forward.leader_node.map(|n| n.addr)))
            }
            Err(e) => Err(ProposeError::Raft(e.to_string())),
        }
    }

    pub async fn register_broker(&self, request: RegisterBroker) -> Result<Registered, ApiFailure> {
        self.require_leader()?;
        let command = Command::RegisterBroker {
            broker_id: request.broker_id,
            endpoints: request.endpoints,
            now_ms: wall_clock_ms(),
            session_timeout_ms: self.inner.session_timeout_ms,
            incarnation_id: request.incarnation_id,
        };
        match self.propose(command).await {
            Ok(Outcome::BrokerRegistered { broker_epoch }) => {
                tracing::info!(broker_id = %request.broker_id, %broker_epoch, "broker registered");
                Ok(Registered {
                    broker_epoch,
                    session_timeout_ms: self.inner.session_timeout_ms,
                })
            }
            Ok(other) => unreachable_outcome("RegisterBroker", &other),
            Err(e) => Err(e.into_failure()),
        }
    }

    /// Extends the broker's session; a `ready` fenced broker is then unfenced.
    /// With `want_shutdown` the broker is fenced instead (controlled shutdown).
    pub async fn heartbeat(&self, request: BrokerHeartbeat) -> Result<SessionState, ApiFailure> {
        self.require_leader()?;
        if request.want_shutdown {
            let command = Command::FenceBroker {
                broker_id: request.broker_id,
                broker_epoch: request.broker_epoch,
            };
            return match self.propose(command).await {
                Ok(_) => {
                    tracing::info!(broker_id = %request.broker_id, "broker fenced for shutdown");
                    Ok(SessionState::Fenced)
                }
                Err(ProposeError::Refused(
                    CommandError::UnknownBroker(_) | CommandError::StaleBrokerEpoch { .. },
                )) => Ok(SessionState::Unregistered),
                Err(e) => Err(e.into_failure()),
            };
        }
        let command = Command::BrokerHeartbeat {
            broker_id: request.broker_id,
            broker_epoch: request.broker_epoch,
            now_ms: wall_clock_ms(),
        };
        let fenced = match self.propose(command).await {
            Ok(Outcome::HeartbeatAccepted { fenced }) => fenced,
            Ok(other) => unreachable_outcome("BrokerHeartbeat", &other),
            Err(ProposeError::Refused(
                CommandError::UnknownBroker(_) | CommandError::StaleBrokerEpoch { .. },
            )) => return Ok(SessionState::Unregistered),
            Err(e) => return Err(e.into_failure()),
        };
        if !fenced {
            return Ok(SessionState::Alive);
        }
        if !request.ready {
            return Ok(SessionState::Fenced);
        }
        let unfence = Command::UnfenceBroker {
            broker_id: request.broker_id,
            broker_epoch: request.broker_epoch,
        };
        match self.propose(unfence).await {
            Ok(_) => {
                tracing::info!(broker_id = %request.broker_id, "broker unfenced");
                Ok(SessionState::Alive)
            }
            Err(ProposeError::Refused(
                CommandError::UnknownBroker(_) | CommandError::StaleBrokerEpoch { .. },
            )) => Ok(SessionState::Unregistered),
            Err(e) => Err(e.into_failure()),
        }
    }

    /// Deltas after `from_version`, waiting up to `max_wait_ms` for the first one;
    /// the whole image when they are not retained or when asked for it.
    pub async fn fetch_metadata(
        &self,
        request: FetchMetadata,
    ) -> Result<MetadataAnswer, ApiFailure> {
        self.require_leader()?;
        let wait_ms = request.max_wait_ms.min(FETCH_WAIT_MS_MAX);
        let deadline = tokio::time::Instant::now() + Duration::from_millis(u64::from(wait_ms));
        let mut metrics = self.inner.raft.metrics();
        loop {
            let answer = self.inner.state_machine.with_state(|s| {
                if request.full_image {
                    return MetadataAnswer::Image(s.image());
                }
                match s.deltas_since(request.from_version) {
                    Ok(deltas) => MetadataAnswer::Deltas {
                        metadata_version: s.metadata_version(),
                        deltas,
                    },
                    Err(NeedSnapshot { .. }) => MetadataAnswer::Image(s.image()),
                }
            });
            let empty =
                matches!(&answer, MetadataAnswer::Deltas { deltas, .. } if deltas.is_empty());
            if !empty || tokio::time::Instant::now() >= deadline {
                return Ok(answer);
            }
            // Every applied entry changes the metrics; a closed channel means shutdown.
            match tokio::time::timeout_at(deadline, metrics.changed()).await {
                Ok(Ok(())) => self.require_leader()?,
                Ok(Err(_)) => {
                    return Err(ApiFailure::new(ErrorCode::ShuttingDown, "shutting down"))
                }
                Err(_) => {}
            }
        }
    }

    /// A partition leader's compare-and-set ISR change; the partition's new
    /// record on success.
    pub async fn alter_isr(
        &self,
        request: AlterIsr,
    ) -> Result<(PartitionIndex, PartitionRecord), ApiFailure> {
        self.require_leader()?;
        let command = Command::alter_isr(&request);
        match self.propose(command).await {
            Ok(Outcome::IsrAltered { partition }) => {
                tracing::info!(topic_id = %request.topic_id, partition = %request.partition, isr = ?partition.isr, "ISR changed");
                Ok((request.partition, partition))
            }
            Ok(other) => unreachable_outcome("AlterIsr", &other),
            Err(e) => Err(e.into_failure()),
        }
    }

    /// The next block of producer ids for a registered broker.
    pub async fn allocate_producer_ids(
        &self,
        request: AllocateProducerIds,
    ) -> Result<ProducerIdBlock, ApiFailure> {
        self.require_leader()?;
        let command = Command::AllocateProducerIds {
            broker_id: request.broker_id,
            broker_epoch: request.broker_epoch,
        };
        match self.propose(command).await {
            Ok(Outcome::ProducerIdsAllocated { first, count }) => {
                tracing::info!(broker_id = %request.broker_id, first, count, "producer ids allocated");
                Ok(ProducerIdBlock { first, count })
            }
            Ok(other) => unreachable_outcome("AllocateProducerIds", &other),
            Err(e) => Err(e.into_failure()),
        }
    }

    pub async fn create_topics(&self, specs: Vec<CreateTopicSpec>) -> Vec<TopicOutcome> {
        let mut outcomes = Vec::with_capacity(specs.len());
        for spec in specs {
            let result = match self.require_leader() {
                Err(f) => Err(f),
                Ok(()) => {
                    let command = Command::CreateTopic {
                        name: spec.name.clone(),
                        partition_count: spec.partition_count,
                        replication_factor: spec.replication_factor,
                        config: spec.config,
                    };
                    self.propose(command)
                        .await
                        .map(|_| ())
                        .map_err(ProposeError::into_failure)
                }
            };
            if result.is_ok() {
                tracing::info!(topic = %spec.name, "topic created");
            }
            outcomes.push(TopicOutcome {
                name: spec.name,
                result,
            });
        }
        outcomes
    }

    pub async fn delete_topics(&self, names: Vec<String>) -> Vec<TopicOutcome> {
        let mut outcomes = Vec::with_capacity(names.len());
        for name in names {
            let result = match self.require_leader() {
                Err(f) => Err(f),
                Ok(()) => self
                    .propose(Command::DeleteTopic { name: name.clone() })
                    .await
                    .map(|_| ())
                    .map_err(ProposeError::into_failure),
            };
            outcomes.push(TopicOutcome { name, result });
        }
        outcomes
    }

    pub async fn alter_topic_configs(&self, specs: Vec<AlterTopicConfigSpec>) -> Vec<TopicOutcome> {
        let mut outcomes = Vec::with_capacity(specs.len());
        for spec in specs {
            let result = match self.require_leader() {
                Err(f) => Err(f),
                Ok(()) => self
                    .propose(Command::AlterTopicConfig {
                        name: spec.name.clone(),
                        set: spec.set,
                        remove: spec.remove,
                    })
                    .await
                    .map(|_| ())
                    .map_err(ProposeError::into_failure),
            };
            if result.is_ok() {
                tracing::info!(topic = %spec.name, "topic config altered");
            }
            outcomes.push(TopicOutcome {
                name: spec.name,
                result,
            });
        }
        outcomes
    }

    /// This controller's view; answered by every controller, leader or not.
    pub fn describe_cluster(&self) -> ClusterDescription {
        let (leader_id, leader_endpoint) = self.leader();
        let (raft_term, controllers) = {
            let metrics = self.inner.raft.metrics();
            let metrics = metrics.borrow();
            let controllers = metrics
                .membership_config
                .membership()
                .nodes()
                .map(|(id, node)| ControllerDescription {
                    id: *id,
                    endpoint: node.addr.clone(),
                    is_leader: leader_id == Some(*id),
                })
                .collect();
            (metrics.current_term, controllers)
        };
        let (metadata_version, brokers) = self.inner.state_machine.with_state(|s| {
            let brokers = s
                .brokers()
                .map(|b| BrokerDescription {
                    broker: broker_view(b),
                    partitions_led: partitions_led(s, b.id),
                })
                .collect();
            (s.metadata_version(), brokers)
        });
        ClusterDescription {
            node_id: self.inner.node_id,
            leader_id,
            leader_endpoint,
            raft_term,
            metadata_version,
            controllers,
            brokers,
        }
    }
}

fn partitions_led(state: &crate::state::ClusterState, broker_id: BrokerId) -> u32 {
    let count = state
        .topics()
        .flat_map(|t| &t.partitions)
        .filter(|p| p.leader == Some(broker_id))
        .count();
    u32::try_from(count).expect("partition count fits u32")
}

/// An outcome that does not belong to the command is a bug in `ClusterState::apply`.
fn unreachable_outcome<T>(command: &str, outcome: &Outcome) -> T {
    panic!("{command} applied with outcome {outcome:?}")
}

/// Why a proposal did not apply.
#[derive(Debug, thiserror::Error)]
pub enum ProposeError {
    #[error("not the leader (leader at {0:?})")]
    NotLeader(Option<String>),
    #[error("refused: {0}")]
    Refused(CommandError),
    #[error("raft: {0}")]
    Raft(String),
}

impl ProposeError {
    pub fn into_failure(self) -> ApiFailure {
        match self {
            ProposeError::NotLeader(endpoint) => ApiFailure::not_controller(endpoint),
            ProposeError::Refused(e) => ApiFailure::new(error_code(&e), e.to_string()),
            ProposeError::Raft(message) => ApiFailure::new(ErrorCode::RequestTimedOut, message),
        }
    }
}

/// The wire code of a refused command.
fn error_code(error: &CommandError) -> ErrorCode {
    match error {
        CommandError::TopicExists(_) => ErrorCode::TopicAlreadyExists,
        CommandError::UnknownTopic(_)
        | CommandError::UnknownTopicId(_)
        | CommandError::UnknownPartition { .. } => ErrorCode::UnknownTopicOrPartition,
        CommandError::InvalidTopicName(_) => ErrorCode::InvalidTopicName,
        CommandError::InvalidPartitionCount { .. } => ErrorCode::InvalidPartitions,
        CommandError::InvalidReplicationFactor { .. } => ErrorCode::InvalidReplicationFactor,
        CommandError::InvalidConfig { .. } => ErrorCode::InvalidConfig,
        CommandError::TopicCountMax(_)
        | CommandError::PartitionCountMax(_)
        | CommandError::BrokerCountMax(_) => ErrorCode::PolicyViolation,
        CommandError::StaleLeaderEpoch { .. } => ErrorCode::StaleLeaderEpoch,
        CommandError::NotLeader { .. } => ErrorCode::NotLeaderOrFollower,
        CommandError::UnknownBroker(_)
        | CommandError::StaleBrokerEpoch { .. }
        | CommandError::InvalidEndpoints(_)
        | CommandError::ShardCountChanged { .. }
        | CommandError::SessionTimeoutOutOfRange { .. }
        | CommandError::StalePartitionEpoch { .. }
        | CommandError::IsrMissingLeader(_)
        | CommandError::IsrNotReplica(_)
        | CommandError::IsrIneligible(_)
        | CommandError::IsrDuplicate(_)
        | CommandError::IsrStaleBrokerEpoch { .. } => ErrorCode::InvalidRequest,
        CommandError::ProducerIdsExhausted => ErrorCode::PolicyViolation,
    }
}
