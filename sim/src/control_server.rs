//! A controller on the simulated network: the real `ClusterState` (one
//! linearizable copy, as in the cluster simulation, so Raft itself is not
//! simulated) behind the real control protocol and codec, with the
//! sequencing `controller::service` puts around it: registration, heartbeats
//! that unfence a ready broker, metadata long polls answered with deltas or
//! the image, AlterIsr, producer id blocks, and the leader's periodic fencing
//! of expired sessions. Brokers' own controller links run against it
//! unchanged.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use broker::runtime::net::{Listener, ReadHalf, WriteHalf};
use broker::runtime::{self, sim};
use controller::command::{Command, Outcome};
use controller::service::ProposeError;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use protocol::api::ControllerApiKey;
use protocol::control::codec;
use protocol::control::messages::{
    ApiFailure, MetadataAnswer, ProducerIdBlock, Registered, SessionState,
};
use protocol::frame::{decode_request, encode_response, frame_len, LENGTH_PREFIX_BYTES};

use crate::controller::SimController;
use crate::msg::Session;

/// Where the controller listens.
pub const CONTROLLER_LISTEN: &str = "127.0.0.1:9990";
/// A broker's session lasts this long without a heartbeat.
pub const SESSION_TIMEOUT_MS: u64 = 1_500;
const FENCE_CHECK_MS: u64 = 100;
/// How often a metadata long poll looks for a new version.
const METADATA_POLL_MS: u64 = 5;
const METADATA_WAIT_MS_MAX: u64 = 5_000;
const FRAME_BYTES_MAX: u32 = 1 << 20;

/// The controller's state and its clock, shared by every connection. The
/// state outlives a simulation run (a whole-cluster restart keeps it), so
/// its clock goes on from `base_ms`.
#[derive(Debug)]
pub struct ControlState {
    pub controller: RefCell<SimController>,
    pub base_ms: std::cell::Cell<u64>,
}

impl ControlState {
    pub fn new() -> ControlState {
        ControlState {
            controller: RefCell::new(SimController::new()),
            base_ms: std::cell::Cell::new(0),
        }
    }

    /// The controller's clock, in milliseconds.
    pub fn now_ms(&self) -> u64 {
        self.base_ms.get() + sim::now().as_millis() as u64
    }
}

impl Default for ControlState {
    fn default() -> ControlState {
        ControlState::new()
    }
}

/// Serves the control protocol on `CONTROLLER_LISTEN` and fences expired
/// sessions, until the run ends.
pub async fn serve(state: Rc<ControlState>) {
    let listener =
        Listener::bind(CONTROLLER_LISTEN.parse().expect("address")).expect("controller binds");
    // Ends with the run, as everything here does.
    let _fencer = {
        let state = state.clone();
        runtime::spawn(async move {
            loop {
                runtime::sleep(Duration::from_millis(FENCE_CHECK_MS)).await;
                let now_ms = state.now_ms();
                let mut controller = state.controller.borrow_mut();
                if !controller.state.expired_brokers(now_ms).is_empty() {
                    let _ = controller.apply(Command::FenceExpiredBrokers { now_ms });
                }
            }
        })
    };
    loop {
        let Ok((reader, writer, _)) = listener.accept().await else {
            continue;
        };
        runtime::spawn(connection(state.clone(), reader, writer)).detach();
    }
}

async fn connection(state: Rc<ControlState>, mut reader: ReadHalf, mut writer: WriteHalf) {
    loop {
        let mut prefix = [0u8; LENGTH_PREFIX_BYTES];
        if reader.read_exact(&mut prefix).await.is_err() {
            return;
        }
        let Ok(len) = frame_len(prefix, FRAME_BYTES_MAX) else {
            return;
        };
        let mut frame = vec![0u8; len];
        if reader.read_exact(&mut frame).await.is_err() {
            return;
        }
        let Ok(request) = decode_request(&frame) else {
            return;
        };
        let Some(body) = answer(&state, request.header.api_key, request.body).await else {
            return;
        };
        let mut out = Vec::new();
        encode_response(&mut out, request.header.correlation_id, &body, &[]);
        if writer.write_all(&out).await.is_err() {
            return;
        }
    }
}

fn refused(e: controller::command::CommandError) -> ApiFailure {
    ProposeError::Refused(e).into_failure()
}

/// The encoded answer to one request; `None` closes the connection (what
/// the real server does with a request it cannot decode).
async fn answer(state: &ControlState, api_key: u16, body: &[u8]) -> Option<Vec<u8>> {
    let api = ControllerApiKey::from_u16(api_key)?;
    Some(match api {
        ControllerApiKey::RegisterBroker => {
            let request = codec::decode_register_broker_request(body).ok()?;
            let now_ms = state.now_ms();
            let result = state
                .controller
                .borrow_mut()
                .apply(Command::RegisterBroker {
                    broker_id: request.broker_id,
                    endpoints: request.endpoints,
                    now_ms,
                    session_timeout_ms: SESSION_TIMEOUT_MS,
                    incarnation_id: request.incarnation_id,
                })
                .map(|outcome| match outcome {
                    Outcome::BrokerRegistered { broker_epoch } => Registered {
                        broker_epoch,
                        session_timeout_ms: SESSION_TIMEOUT_MS,
                    },
                    other => panic!("RegisterBroker gave {other:?}"),
                })
                .map_err(refused);
            codec::encode_register_broker_response(&result)
        }
        ControllerApiKey::BrokerHeartbeat => {
            let request = codec::decode_broker_heartbeat_request(body).ok()?;
            let now_ms = state.now_ms();
            let mut controller = state.controller.borrow_mut();
            let session = if request.want_shutdown {
                match controller.apply(Command::FenceBroker {
                    broker_id: request.broker_id,
                    broker_epoch: request.broker_epoch,
                }) {
                    Ok(_) => Session::Fenced,
                    Err(_) => Session::Unregistered,
                }
            } else {
                controller.heartbeat(
                    request.broker_id,
                    request.broker_epoch,
                    request.ready,
                    now_ms,
                )
            };
            let session = match session {
                Session::Alive => SessionState::Alive,
                Session::Fenced => SessionState::Fenced,
                Session::Unregistered => SessionState::Unregistered,
            };
            codec::encode_broker_heartbeat_response(&Ok(session))
        }
        ControllerApiKey::FetchMetadata => {
            let request = codec::decode_fetch_metadata_request(body).ok()?;
            let wait =
                Duration::from_millis(u64::from(request.max_wait_ms).min(METADATA_WAIT_MS_MAX));
            let deadline = sim::now() + wait;
            loop {
                let answer = {
                    let controller = state.controller.borrow();
                    let cluster = &controller.state;
                    if request.full_image {
                        MetadataAnswer::Image(cluster.image())
                    } else {
                        match cluster.deltas_since(request.from_version) {
                            Ok(deltas) => MetadataAnswer::Deltas {
                                metadata_version: cluster.metadata_version(),
                                deltas,
                            },
                            Err(_) => MetadataAnswer::Image(cluster.image()),
                        }
                    }
                };
                let empty =
                    matches!(&answer, MetadataAnswer::Deltas { deltas, .. } if deltas.is_empty());
                if !empty || sim::now() >= deadline {
                    break codec::encode_fetch_metadata_response(&Ok(answer));
                }
                runtime::sleep(Duration::from_millis(METADATA_POLL_MS)).await;
            }
        }
        ControllerApiKey::AlterIsr => {
            let request = codec::decode_alter_isr_request(body).ok()?;
            let result = state
                .controller
                .borrow_mut()
                .apply(Command::alter_isr(&request))
                .map(|outcome| match outcome {
                    Outcome::IsrAltered { partition } => (request.partition, partition),
                    other => panic!("AlterIsr gave {other:?}"),
                })
                .map_err(refused);
            codec::encode_alter_isr_response(&result)
        }
        ControllerApiKey::AllocateProducerIds => {
            let request = codec::decode_allocate_producer_ids_request(body).ok()?;
            let result = state
                .controller
                .borrow_mut()
                .apply(Command::AllocateProducerIds {
                    broker_id: request.broker_id,
                    broker_epoch: request.broker_epoch,
                })
                .map(|outcome| match outcome {
                    Outcome::ProducerIdsAllocated { first, count } => {
                        ProducerIdBlock { first, count }
                    }
                    other => panic!("AllocateProducerIds gave {other:?}"),
                })
                .map_err(refused);
            codec::encode_allocate_producer_ids_response(&result)
        }
        // Raft between controllers and DescribeCluster: not in this simulation.
        _ => return None,
    })
}
