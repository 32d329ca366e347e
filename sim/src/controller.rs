//! The simulated controller: the real `ClusterState` (the Raft quorum's
//! replicated state machine, applied here as one linearizable copy, so Raft
//! itself is not simulated), with the sequencing `controller::service` puts
//! around it (a ready heartbeat unfences, metadata is answered with deltas or
//! the image and encoded by the real codec) and the leader's periodic fencing
//! of expired sessions. Its invariants are checked after every command.

use std::collections::BTreeMap;

use controller::command::{Command, CommandError, Outcome};
use controller::state::ClusterState;
use protocol::control::codec::encode_fetch_metadata_response;
use protocol::control::messages::MetadataAnswer;
use protocol::control::records::BrokerEndpoints;
use protocol::BrokerId;

use crate::broker::{endpoint, SESSION_TIMEOUT_MS, TOPIC};
use crate::msg::{Action, Msg, Node, Session, Timer};

pub const TICK_MS: u64 = 100;

#[derive(Debug)]
pub struct SimController {
    pub state: ClusterState,
    /// Down: every message to it is lost (no quorum); its state is kept.
    pub up: bool,
    pub clock_skew_ms: i64,
    pub trace: Vec<String>,
}

impl SimController {
    pub fn new() -> SimController {
        SimController {
            state: ClusterState::default(),
            up: true,
            clock_skew_ms: 0,
            trace: Vec::new(),
        }
    }

    fn now_ms(&self, sim_ms: u64) -> u64 {
        (sim_ms as i64 + self.clock_skew_ms).max(0) as u64
    }

    pub fn apply(&mut self, command: Command) -> Result<Outcome, CommandError> {
        let before = self.state.clone();
        let reply = self.state.apply(&command);
        self.state.check_invariants();
        self.state.check_successor(&before);
        if let Ok(outcome) = &reply.result {
            if !matches!(outcome, Outcome::HeartbeatAccepted { .. }) {
                self.trace
                    .push(format!("controller: {command:?} -> {outcome:?}"));
            }
        }
        reply.result
    }

    pub fn create_topic(&mut self, partitions: u32, replication_factor: u16) -> bool {
        let config = BTreeMap::from([("min.insync.replicas".to_string(), "2".to_string())]);
        self.apply(Command::CreateTopic {
            name: TOPIC.to_string(),
            partition_count: partitions,
            replication_factor,
            config,
        })
        .is_ok()
    }

    pub fn tick(&mut self, sim_ms: u64) -> Vec<Action> {
        let now_ms = self.now_ms(sim_ms);
        if self.up && !self.state.expired_brokers(now_ms).is_empty() {
            let _ = self.apply(Command::FenceExpiredBrokers { now_ms });
        }
        vec![Action::After {
            delay_ms: TICK_MS,
            timer: Timer::ControllerTick,
        }]
    }

    pub fn on_message(&mut self, sim_ms: u64, from: Node, msg: Msg) -> Vec<Action> {
        let now_ms = self.now_ms(sim_ms);
        let reply = match msg {
            Msg::Register { incarnation } => {
                let Node::Broker(broker_id, _) = from else {
                    panic!("register from {from:?}")
                };
                let id = endpoint(broker_id);
                let result = self.apply(Command::RegisterBroker {
                    broker_id,
                    endpoints: BrokerEndpoints {
                        client: id.clone(),
                        shards: vec![id],
                    },
                    now_ms,
                    session_timeout_ms: SESSION_TIMEOUT_MS,
                    incarnation_id: incarnation,
                });
                Msg::Registered(result.map(|o| match o {
                    Outcome::BrokerRegistered { broker_epoch } => broker_epoch,
                    other => panic!("RegisterBroker gave {other:?}"),
                }))
            }
            Msg::Heartbeat { epoch, ready } => {
                let Node::Broker(broker_id, _) = from else {
                    panic!("heartbeat from {from:?}")
                };
                Msg::HeartbeatAnswer(self.heartbeat(broker_id, epoch, ready, now_ms))
            }
            Msg::FetchMetadata { from: version } => {
                let answer = match self.state.deltas_since(version) {
                    Ok(deltas) => MetadataAnswer::Deltas {
                        metadata_version: self.state.metadata_version(),
                        deltas,
                    },
                    Err(_) => MetadataAnswer::Image(self.state.image()),
                };
                Msg::Metadata(encode_fetch_metadata_response(&Ok(answer)))
            }
            Msg::AlterIsr {
                request_id,
                request,
            } => {
                let partition = request.partition.0;
                let result = self.apply(Command::alter_isr(&request)).map(|o| match o {
                    Outcome::IsrAltered { partition } => partition,
                    other => panic!("AlterIsr gave {other:?}"),
                });
                Msg::AlterIsrAnswer {
                    request_id,
                    partition,
                    result,
                }
            }
            Msg::ClientMetadata => Msg::ClientMetadataAnswer {
                leaders: self.leaders(),
            },
            other => panic!("controller got an unexpected {other:?}"),
        };
        vec![Action::Send {
            to: from,
            msg: reply,
        }]
    }

    /// As `controller::service::heartbeat`.
    pub fn heartbeat(
        &mut self,
        broker_id: BrokerId,
        broker_epoch: protocol::BrokerEpoch,
        ready: bool,
        now_ms: u64,
    ) -> Session {
        let fenced = match self.apply(Command::BrokerHeartbeat {
            broker_id,
            broker_epoch,
            now_ms,
        }) {
            Ok(Outcome::HeartbeatAccepted { fenced }) => fenced,
            Ok(other) => panic!("BrokerHeartbeat gave {other:?}"),
            Err(CommandError::UnknownBroker(_) | CommandError::StaleBrokerEpoch { .. }) => {
                return Session::Unregistered
            }
            Err(e) => panic!("heartbeat refused: {e}"),
        };
        if !fenced {
            return Session::Alive;
        }
        if !ready {
            return Session::Fenced;
        }
        match self.apply(Command::UnfenceBroker {
            broker_id,
            broker_epoch,
        }) {
            Ok(_) => Session::Alive,
            Err(_) => Session::Unregistered,
        }
    }

    pub fn leaders(&self) -> Vec<Option<BrokerId>> {
        self.state
            .topic_by_name(TOPIC)
            .map(|t| t.partitions.iter().map(|p| p.leader).collect())
            .unwrap_or_default()
    }
}

impl Default for SimController {
    fn default() -> SimController {
        SimController::new()
    }
}
