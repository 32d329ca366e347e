//! The broker's links to the controller quorum, all on shard 0: the session
//! (register, then heartbeat at a third of the session timeout; register
//! again only when told the session is gone, never merely because the
//! controller leader changed: the registration carries this process's
//! incarnation id, so even a repeated registration keeps the epoch and fences
//! nothing), the metadata follower (long-polls
//! FetchMetadata from the leader and hands each update to every shard), and
//! topic admin forwarding. Every link follows NOT_CONTROLLER answers to the
//! leader and otherwise tries the configured controllers in turn.
//!
//! A broker heartbeats `ready` (asking to be unfenced, and so to lead) only
//! once its metadata shows its own current registration: it has caught up.

use std::rc::Rc;
use std::time::Duration;

use protocol::api::{ApiKey, ControllerApiKey};
use protocol::control::messages::{
    ApiFailure, BrokerHeartbeat, CreateTopicSpec, FetchMetadata, MetadataUpdate, RegisterBroker,
    SessionState, TopicOutcome as ControllerTopicOutcome,
};
use protocol::control::records::BrokerEndpoints;
use protocol::BrokerEpoch;
use protocol::{BrokerId, ErrorCode, PartitionEpoch};

use super::{OpError, Shard, TopicOutcome};
use crate::cluster_view::TopicSpec;
use crate::runtime::peer::{PeerConnection, PeerError};
use crate::runtime::{self};

/// Bound on a controller's response frame: a metadata image of a large cluster.
const RESPONSE_BYTES_MAX: u32 = 64 << 20;
/// Connect and request timeout towards a controller, beyond any long-poll wait.
const CONTROLLER_REQUEST_MS_MAX: u64 = 3_000;
/// Wait before trying the next controller after a failure.
const RETRY_BACKOFF_MS: u64 = 200;
/// Longest FetchMetadata long poll the broker asks for.
const METADATA_WAIT_MS: u32 = 2_000;
/// Heartbeat interval while waiting to be unfenced, so a starting broker
/// serves soon after it caught up rather than a session third later.
const HEARTBEAT_STARTING_MS: u64 = 20;
/// Redirects followed for one admin request before giving up.
const ADMIN_HOPS_MAX: usize = 6;

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("timed out")]
    Timeout,
    #[error("malformed response: {0}")]
    Malformed(String),
    #[error("not the controller leader; leader is {0:?}")]
    NotController(Option<String>),
    #[error("controller error {0}: {1}")]
    Refused(ErrorCode, String),
}

impl From<PeerError> for LinkError {
    fn from(e: PeerError) -> LinkError {
        match e {
            PeerError::Io(e) => LinkError::Io(e),
            PeerError::Timeout => LinkError::Timeout,
            PeerError::Malformed(m) => LinkError::Malformed(m),
        }
    }
}

impl From<ApiFailure> for LinkError {
    fn from(f: ApiFailure) -> LinkError {
        if f.code == ErrorCode::NotController {
            LinkError::NotController(f.leader_endpoint.filter(|l| !l.is_empty()))
        } else {
            LinkError::Refused(f.code, f.message)
        }
    }
}

fn malformed(e: impl std::fmt::Display) -> LinkError {
    LinkError::Malformed(e.to_string())
}

/// A connection to one controller.
struct Connection(PeerConnection);

impl Connection {
    async fn open(target: &str) -> Result<Connection, LinkError> {
        Ok(Connection(
            PeerConnection::open(target, RESPONSE_BYTES_MAX, CONTROLLER_REQUEST_MS_MAX).await?,
        ))
    }

    async fn call(
        &mut self,
        api_key: u16,
        body: &[u8],
        wait_ms: u64,
    ) -> Result<Vec<u8>, LinkError> {
        Ok(self
            .0
            .call(api_key, body, &[], wait_ms)
            .await?
            .body()
            .to_vec())
    }
}

/// Picks the controller to try next: the last leader named, else the next
/// configured one.
struct Targets {
    controllers: Vec<String>,
    index: usize,
    next: Option<String>,
}

impl Targets {
    fn new(controllers: Vec<String>) -> Targets {
        assert!(!controllers.is_empty(), "at least one controller");
        Targets {
            index: controllers.len() - 1,
            controllers,
            next: None,
        }
    }

    fn pick(&mut self) -> String {
        self.next.take().unwrap_or_else(|| {
            self.index = (self.index + 1) % self.controllers.len();
            self.controllers[self.index].clone()
        })
    }

    /// Remembers a leader named in a NOT_CONTROLLER answer for the next pick.
    /// After a failed exchange: go to the named leader at once, or back off.
    async fn failed(&mut self, what: &str, target: &str, error: &LinkError) {
        match error {
            LinkError::NotController(Some(leader)) => self.next = Some(leader.clone()),
            e => {
                tracing::debug!(controller = %target, error = %e, "{what} failed; retrying");
                runtime::sleep(Duration::from_millis(RETRY_BACKOFF_MS)).await;
            }
        }
    }
}

fn endpoints(shard: &Shard) -> BrokerEndpoints {
    let config = &shard.config;
    BrokerEndpoints {
        client: format!("{}:{}", config.advertised_host, config.listen.port()),
        shards: (0..shard.count)
            .map(|i| format!("{}:{}", config.advertised_host, config.shard_port(i)))
            .collect(),
    }
}

/// A random id for this broker process, never 0.
fn new_incarnation_id() -> u64 {
    runtime::random_u64().max(1)
}

async fn register(
    connection: &mut Connection,
    shard: &Shard,
    incarnation_id: u64,
) -> Result<(BrokerEpoch, Duration), LinkError> {
    let request = RegisterBroker {
        broker_id: shard.broker_id(),
        endpoints: endpoints(shard),
        incarnation_id,
    };
    let body = connection
        .call(
            ControllerApiKey::RegisterBroker as u16,
            &protocol::control::codec::encode_register_broker_request(&request),
            0,
        )
        .await?;
    let registered =
        protocol::control::codec::decode_register_broker_response(&body).map_err(malformed)??;
    let interval = Duration::from_millis((registered.session_timeout_ms / 3).max(50));
    Ok((registered.broker_epoch, interval))
}

/// This process's registration, kept across controller connections.
struct Registration {
    incarnation_id: u64,
    /// Epoch and heartbeat interval, once registered.
    session: Option<(BrokerEpoch, Duration)>,
}

/// The broker's session, until the shard stops.
pub async fn run_session(shard: Rc<Shard>, controllers: Vec<String>) {
    let mut targets = Targets::new(controllers);
    let mut registration = Registration {
        incarnation_id: new_incarnation_id(),
        session: None,
    };
    while !shard.stopping.get() {
        let target = targets.pick();
        if let Err(e) = session(&shard, &target, &mut registration).await {
            targets.failed("controller session", &target, &e).await;
        }
    }
}

/// Heartbeats to `target` while it answers, registering first only if this
/// process has no registration yet.
async fn session(
    shard: &Rc<Shard>,
    target: &str,
    registration: &mut Registration,
) -> Result<(), LinkError> {
    let mut connection = Connection::open(target).await?;
    let (mut epoch, interval) = match registration.session {
        Some(session) => session,
        None => {
            let session = register(&mut connection, shard, registration.incarnation_id).await?;
            registration.session = Some(session);
            shard.broker_epoch.set(session.0 .0);
            tracing::info!(controller = %target, broker_epoch = session.0 .0, "registered with the controller");
            session
        }
    };
    while !shard.stopping.get() {
        // A broker on its way out must not ask to be unfenced again.
        let ready = shard.has_caught_up() && !shard.shutting_down.get();
        let request = BrokerHeartbeat {
            broker_id: shard.broker_id(),
            broker_epoch: epoch,
            ready,
            want_shutdown: false,
        };
        let body = connection
            .call(
                ControllerApiKey::BrokerHeartbeat as u16,
                &protocol::control::codec::encode_broker_heartbeat_request(&request),
                0,
            )
            .await?;
        let state = protocol::control::codec::decode_broker_heartbeat_response(&body)
            .map_err(malformed)??;
        match state {
            SessionState::Unregistered => {
                registration.session = None;
                let (new_epoch, _) =
                    register(&mut connection, shard, registration.incarnation_id).await?;
                registration.session = Some((new_epoch, interval));
                tracing::info!(
                    broker_epoch = new_epoch.0,
                    "registered again after the session ended"
                );
                epoch = new_epoch;
                shard.broker_epoch.set(epoch.0);
                continue;
            }
            SessionState::Alive if shard.is_serving() => runtime::sleep(interval).await,
            SessionState::Alive | SessionState::Fenced => {
                runtime::sleep(Duration::from_millis(HEARTBEAT_STARTING_MS).min(interval)).await
            }
        }
    }
    Ok(())
}

/// Follows the controller's metadata until the shard stops: the whole image
/// first (and after any error), then deltas by long poll.
pub async fn run_metadata(shard: Rc<Shard>, controllers: Vec<String>) {
    let mut targets = Targets::new(controllers);
    while !shard.stopping.get() {
        let target = targets.pick();
        if let Err(e) = follow_metadata(&shard, &target).await {
            targets.failed("metadata fetch", &target, &e).await;
        }
    }
}

async fn follow_metadata(shard: &Rc<Shard>, target: &str) -> Result<(), LinkError> {
    let mut connection = Connection::open(target).await?;
    let mut full_image = true;
    while !shard.stopping.get() {
        let request = FetchMetadata {
            from_version: shard.view.borrow().version,
            max_wait_ms: if full_image { 0 } else { METADATA_WAIT_MS },
            full_image,
        };
        let body = connection
            .call(
                ControllerApiKey::FetchMetadata as u16,
                &protocol::control::codec::encode_fetch_metadata_request(&request),
                u64::from(request.max_wait_ms),
            )
            .await?;
        let update = protocol::control::codec::decode_fetch_metadata_response(&body)
            .map_err(malformed)??;
        *shard.controller_hint.borrow_mut() = Some(target.to_owned());
        let empty = matches!(&update, MetadataUpdate::Deltas { deltas, metadata_version } if deltas.is_empty() && *metadata_version == request.from_version);
        if !empty {
            if let Err(e) = shard.clone().publish_metadata(update).await {
                tracing::warn!(error = %e, "metadata update did not apply; loading the whole image");
                full_image = true;
                continue;
            }
        }
        full_image = false;
    }
    Ok(())
}

/// Sends topic creations to the controller leader; one outcome per spec.
pub async fn forward_create(shard: &Shard, specs: &[TopicSpec]) -> Vec<TopicOutcome> {
    let requests: Vec<CreateTopicSpec> = specs
        .iter()
        .map(|s| CreateTopicSpec {
            name: s.name.clone(),
            partition_count: u32::try_from(s.partitions).expect("validated positive"),
            replication_factor: u16::try_from(s.replication_factor).expect("validated positive"),
            config: s.configs.clone(),
        })
        .collect();
    let body = protocol::control::codec::encode_create_topics_request(&requests);
    let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
    forward(
        shard,
        ApiKey::CreateTopics,
        &body,
        &names,
        protocol::control::codec::decode_create_topics_response,
    )
    .await
}

/// Sends topic deletions to the controller leader; one outcome per name.
pub async fn forward_delete(shard: &Shard, names: &[String]) -> Vec<TopicOutcome> {
    let body = protocol::control::codec::encode_delete_topics_request(names);
    forward(
        shard,
        ApiKey::DeleteTopics,
        &body,
        names,
        protocol::control::codec::decode_delete_topics_response,
    )
    .await
}

/// Sends topic config changes to the controller leader; one outcome per topic.
pub async fn forward_alter_configs(
    shard: &Shard,
    specs: &[protocol::control::messages::AlterTopicConfigSpec],
) -> Vec<TopicOutcome> {
    let body = protocol::control::codec::encode_alter_topic_configs_request(specs);
    let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
    forward(
        shard,
        ApiKey::AlterTopicConfigs,
        &body,
        &names,
        protocol::control::codec::decode_alter_topic_configs_response,
    )
    .await
}

/// One request to the controller leader, on a fresh connection: the
/// controller that last answered first, then the others in turn, following
/// NOT_CONTROLLER. Stops at the first answer `decode` accepts, at a refusal,
/// after `attempts_max` tries or at `deadline`.
async fn call_leader<T>(
    shard: &Shard,
    what: &str,
    api_key: u16,
    body: &[u8],
    attempts_max: usize,
    deadline: Option<Duration>,
    decode: impl Fn(&[u8]) -> Result<T, LinkError>,
) -> Result<T, LinkError> {
    let mut targets = Targets::new(shard.config.controllers.clone());
    targets.next = shard.controller_hint.borrow().clone();
    let mut last_error = LinkError::Timeout;
    for _ in 0..attempts_max {
        if deadline.is_some_and(|d| shard.clock.monotonic() >= d) {
            break;
        }
        let target = targets.pick();
        let answer = async {
            let mut connection = Connection::open(&target).await?;
            let body = connection.call(api_key, body, 0).await?;
            decode(&body)
        }
        .await;
        match answer {
            Ok(value) => return Ok(value),
            Err(e @ LinkError::Refused(..)) => return Err(e),
            Err(e) => {
                targets.failed(what, &target, &e).await;
                last_error = e;
            }
        }
    }
    Err(last_error)
}

/// Tries per admin request: every controller twice, at least `ADMIN_HOPS_MAX`.
fn admin_attempts_max(shard: &Shard) -> usize {
    ADMIN_HOPS_MAX.max(2 * shard.config.controllers.len())
}

async fn forward(
    shard: &Shard,
    api: ApiKey,
    body: &[u8],
    names: &[String],
    decode: fn(&[u8]) -> Result<Vec<ControllerTopicOutcome>, protocol::control::codec::WireError>,
) -> Vec<TopicOutcome> {
    let answer = call_leader(
        shard,
        "topic admin",
        api as u16,
        body,
        admin_attempts_max(shard),
        None,
        |body| {
            let outcomes = decode(body).map_err(malformed)?;
            // A follower answers every topic with NOT_CONTROLLER.
            let redirect = outcomes.iter().find_map(|o| match &o.result {
                Err(f) if f.code == ErrorCode::NotController => Some(f.leader_endpoint.clone()),
                _ => None,
            });
            match redirect {
                Some(leader) => Err(LinkError::NotController(leader)),
                None => Ok(outcomes),
            }
        },
    )
    .await;
    match answer {
        Ok(outcomes) => outcomes
            .into_iter()
            .map(|o| TopicOutcome {
                name: o.name,
                error: o.result.err().map(|f| OpError::new(f.code, f.message)),
            })
            .collect(),
        Err(e) => {
            let message = format!("no controller leader answered: {e}");
            names
                .iter()
                .map(|name| TopicOutcome {
                    name: name.clone(),
                    error: Some(OpError::new(ErrorCode::RequestTimedOut, message.clone())),
                })
                .collect()
        }
    }
}

/// Controlled shutdown: asks the controller leader to fence this broker now,
/// so its partitions get new leaders before it stops serving. Gives up after
/// `deadline`, on the monotonic clock (the session timeout then does the
/// same, later).
pub async fn request_shutdown(shard: &Shard, deadline: Duration) {
    let epoch = shard.broker_epoch.get();
    if epoch == 0 {
        return;
    }
    let request = BrokerHeartbeat {
        broker_id: shard.broker_id(),
        broker_epoch: BrokerEpoch(epoch),
        ready: false,
        want_shutdown: true,
    };
    let body = protocol::control::codec::encode_broker_heartbeat_request(&request);
    let answer = call_leader(
        shard,
        "controlled shutdown",
        ControllerApiKey::BrokerHeartbeat as u16,
        &body,
        usize::MAX,
        Some(deadline),
        |body| {
            Ok(
                protocol::control::codec::decode_broker_heartbeat_response(body)
                    .map_err(malformed)??,
            )
        },
    )
    .await;
    match answer {
        Ok(state) => tracing::info!(
            ?state,
            "asked the controller to fence this broker for shutdown"
        ),
        Err(e) => tracing::warn!(
            error = %e,
            "controlled shutdown: no controller answered; leadership moves when the session expires"
        ),
    }
}

/// Sends a leader's ISR change to the controller leader; the new ISR and
/// partition epoch when applied.
pub async fn alter_isr(
    shard: &Shard,
    request: protocol::control::messages::AlterIsr,
) -> Result<(Vec<BrokerId>, PartitionEpoch), OpError> {
    let body = protocol::control::codec::encode_alter_isr_request(&request);
    let (_, record) = ask_leader(
        shard,
        "alter ISR",
        ControllerApiKey::AlterIsr,
        &body,
        protocol::control::codec::decode_alter_isr_response,
    )
    .await?;
    Ok((record.isr, record.partition_epoch))
}

/// The next block of producer ids for this broker, from the controller
/// leader.
pub async fn allocate_producer_ids(
    shard: &Shard,
) -> Result<protocol::control::messages::ProducerIdBlock, OpError> {
    let epoch = shard.broker_epoch.get();
    if epoch == 0 {
        return Err(OpError::new(
            ErrorCode::NotController,
            "this broker is not registered with the controller yet",
        ));
    }
    let request = protocol::control::messages::AllocateProducerIds {
        broker_id: shard.broker_id(),
        broker_epoch: BrokerEpoch(epoch),
    };
    let body = protocol::control::codec::encode_allocate_producer_ids_request(&request);
    ask_leader(
        shard,
        "allocate producer ids",
        ControllerApiKey::AllocateProducerIds,
        &body,
        protocol::control::codec::decode_allocate_producer_ids_response,
    )
    .await
}

/// A controller response decoder: the answer or the controller's refusal.
type ControllerDecoder<T> =
    fn(&[u8]) -> Result<Result<T, ApiFailure>, protocol::control::codec::WireError>;

/// One request of this broker's own to the controller leader (admin
/// attempts, no deadline): the answer, the controller's refusal as its
/// code, or `REQUEST_TIMED_OUT` when no leader answered.
async fn ask_leader<T>(
    shard: &Shard,
    what: &str,
    api: ControllerApiKey,
    body: &[u8],
    decode: ControllerDecoder<T>,
) -> Result<T, OpError> {
    let answer = call_leader(
        shard,
        what,
        api as u16,
        body,
        admin_attempts_max(shard),
        None,
        |body| Ok(decode(body).map_err(malformed)??),
    )
    .await;
    match answer {
        Ok(value) => Ok(value),
        Err(LinkError::Refused(code, message)) => Err(OpError::new(code, message)),
        Err(e) => Err(OpError::new(
            ErrorCode::RequestTimedOut,
            format!("no controller leader answered: {e}"),
        )),
    }
}
