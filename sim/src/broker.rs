//! One simulated broker: the shard's sequencing around the broker's own
//! code, on simulated time and disk. The code is the broker's: the metadata
//! view (`ClusterView::apply`) and the replicas it places here
//! (`shard::desired_replicas`), and each replica's replication state machine
//! (`replication::replica::ReplicaCore`: role changes, epoch history, the
//! leader's checks of follower fetches, follower progress, high watermark,
//! ISR changes, acks=all answers, the follower's handling of its leader's
//! answers). Metadata arrives encoded by the controller's real codec and is
//! decoded by it.
//!
//! What this module adds is the order in which the shard calls them,
//! mirrored from `broker::shard` (produce, fetch, follower, fetcher,
//! maintenance, replica), and the waits the shard does with futures done
//! here with timers.

use std::collections::BTreeMap;

use broker::cluster_view::ClusterView;
use broker::log::LogConfig;
use broker::replication::ack::AckDecision;
use broker::replication::epochs::EpochHistory;
use broker::replication::follower::{self, FollowerAction, LeaderAnswer};
use broker::replication::leader::FollowerFetch;
use broker::replication::replica::{FollowerFetchVerdict, ReplicaCore};
use broker::replication::role::Role;
use broker::shard::{desired_replicas, UNKNOWN_OFFSET};
use protocol::control::codec::decode_fetch_metadata_response;
use protocol::{BrokerEpoch, BrokerId, ErrorCode, LeaderEpoch, Offset, PartitionIndex, TopicId};

use crate::disk::{Disk, Rec};
use crate::msg::{Action, BrokerTimer, Msg, Node, Observation, Session, Timer};

/// The only topic of a simulation.
pub const TOPIC: &str = "sim";
pub const SESSION_TIMEOUT_MS: u64 = 1_500;
const HEARTBEAT_MS: u64 = SESSION_TIMEOUT_MS / 3;
const HEARTBEAT_STARTING_MS: u64 = 20;
const METADATA_POLL_MS: u64 = 50;
const ISR_CHECK_MS: u64 = 100;
pub const REPLICA_LAG_TIME_MAX_MS: u64 = 1_000;
const FOLLOWER_FETCH_WAIT_MS: u64 = 500;
const FOLLOWER_REQUEST_MS_MAX: u64 = 1_500;
const FOLLOWER_BACKOFF_MS: u64 = 100;
const FOLLOWER_STABLE_POLL_MS: u64 = 2;
const CONTROLLER_REQUEST_MS_MAX: u64 = 3_000;
const FETCH_RECORDS_MAX: usize = 64;
const CONSUME_RECORDS_MAX: usize = 32;
pub const PRODUCE_TIMEOUT_MS: u64 = 3_000;

/// One acks=1 or acks=all write waiting for its answer.
#[derive(Clone, Debug)]
pub struct PendingAck {
    pub client: u32,
    pub request_id: u64,
    pub acks: i16,
    pub base: i64,
    pub end: i64,
    pub leader_epoch: LeaderEpoch,
    pub deadline_ms: u64,
}

/// A follower fetch the leader holds until records arrive or it expires.
#[derive(Clone, Debug)]
struct Parked {
    follower: Node,
    request_id: u64,
    offset: i64,
}

#[derive(Clone, Debug)]
pub struct Replica {
    topic_id: u64,
    pub core: ReplicaCore,
    pub high_watermark: i64,
    /// The AlterIsr on its way: request id and the leader epoch it was asked at.
    alter_isr: Option<(u64, LeaderEpoch)>,
    pub pending: Vec<PendingAck>,
    parked: Vec<Parked>,
    /// The follower fetch in flight: request id and the leader epoch it
    /// was sent at.
    fetch_in_flight: Option<(u64, LeaderEpoch)>,
    fetch_armed: bool,
}

/// The state of a running incarnation; lost on a crash.
#[derive(Clone, Debug)]
pub struct Live {
    pub incarnation: u64,
    /// 0 until registered.
    pub broker_epoch: u64,
    registering: bool,
    pub view: ClusterView,
    pub serving: bool,
    pub replicas: BTreeMap<u32, Replica>,
    next_request_id: u64,
}

#[derive(Debug)]
pub struct SimBroker {
    pub id: BrokerId,
    /// One per partition of the topic; they survive crashes.
    pub disks: Vec<Disk>,
    pub live: Option<Live>,
    /// This broker's wall clock minus simulated time. Its replication reads
    /// monotonic (simulated) time only, as the shard's does, so a jump
    /// must change nothing it decides.
    pub clock_skew_ms: i64,
    /// Syncs take this long (a stalled disk) until `slow_until_ms`.
    pub slow_sync_ms: u64,
    pub slow_until_ms: u64,
    /// See `Options::plant_ack_on_append`.
    plant_ack_on_append: bool,
}

/// What handling one event produced.
#[derive(Debug, Default)]
pub struct Out {
    pub actions: Vec<Action>,
    pub observations: Vec<Observation>,
    pub trace: Vec<String>,
}

impl Out {
    fn send(&mut self, to: Node, msg: Msg) {
        self.actions.push(Action::Send { to, msg });
    }
}

/// A broker's address in endpoint strings (what `desired_replicas` reads).
pub fn endpoint(id: BrokerId) -> String {
    format!("broker{}:9092", id.0)
}

fn endpoint_broker(endpoint: &str) -> BrokerId {
    let id = endpoint
        .strip_prefix("broker")
        .and_then(|rest| rest.strip_suffix(":9092"))
        .and_then(|id| id.parse().ok())
        .expect("a simulated endpoint");
    BrokerId(id)
}

impl SimBroker {
    pub fn new(id: BrokerId, partitions: u32, plant_ack_on_append: bool) -> SimBroker {
        SimBroker {
            id,
            disks: vec![Disk::default(); partitions as usize],
            live: None,
            clock_skew_ms: 0,
            slow_sync_ms: 0,
            slow_until_ms: 0,
            plant_ack_on_append,
        }
    }

    pub fn incarnation(&self) -> Option<u64> {
        self.live.as_ref().map(|l| l.incarnation)
    }

    fn timer(&self, out: &mut Out, delay_ms: u64, timer: BrokerTimer) {
        out.actions.push(Action::After {
            delay_ms,
            timer: Timer::Broker(self.id, self.incarnation().expect("running"), timer),
        });
    }

    /// A new process starts: it registers with a fresh incarnation id.
    pub fn start(&mut self, incarnation: u64, out: &mut Out) {
        assert!(self.live.is_none(), "broker {} already runs", self.id);
        self.live = Some(Live {
            incarnation,
            broker_epoch: 0,
            registering: true,
            view: ClusterView::default(),
            serving: false,
            replicas: BTreeMap::new(),
            next_request_id: 1,
        });
        out.send(Node::Controller, Msg::Register { incarnation });
        self.timer(out, HEARTBEAT_STARTING_MS, BrokerTimer::Heartbeat);
        self.timer(out, 1, BrokerTimer::MetadataPoll);
        self.timer(out, ISR_CHECK_MS, BrokerTimer::IsrCheck);
    }

    /// kill -9: memory is gone; unsynced writes may be lost or torn.
    pub fn crash(&mut self, rng: &mut crate::rng::Rng) {
        self.live = None;
        for disk in &mut self.disks {
            disk.crash(rng);
        }
    }

    fn live(&mut self) -> &mut Live {
        self.live.as_mut().expect("running")
    }

    fn next_request_id(&mut self) -> u64 {
        let live = self.live();
        live.next_request_id += 1;
        live.next_request_id
    }

    pub fn on_timer(&mut self, sim_ms: u64, timer: BrokerTimer, out: &mut Out) {
        match timer {
            BrokerTimer::Heartbeat => self.heartbeat(out),
            BrokerTimer::MetadataPoll => {
                let from = self.live().view.version;
                out.send(Node::Controller, Msg::FetchMetadata { from });
                self.timer(out, METADATA_POLL_MS, BrokerTimer::MetadataPoll);
            }
            BrokerTimer::IsrCheck => {
                let partitions: Vec<u32> = self.live().replicas.keys().copied().collect();
                for p in partitions {
                    self.check_isr(sim_ms, p, out);
                }
                self.timer(out, ISR_CHECK_MS, BrokerTimer::IsrCheck);
            }
            BrokerTimer::Sync { partition } => {
                let disk = &mut self.disks[partition as usize];
                if disk.sync_done() && disk.start_sync() {
                    let delay = self.sync_delay_ms(sim_ms);
                    self.timer(out, delay, BrokerTimer::Sync { partition });
                }
                if self.live().replicas.contains_key(&partition) {
                    self.update_high_watermark(sim_ms, partition, out);
                }
            }
            BrokerTimer::FollowerFetch { partition } => self.follower_fetch(partition, out),
            BrokerTimer::FetchTimeout {
                partition,
                request_id,
            } => {
                if let Some(r) = self.live().replicas.get_mut(&partition) {
                    if r.fetch_in_flight.is_some_and(|(id, _)| id == request_id) {
                        r.fetch_in_flight = None;
                        out.trace.push(format!(
                            "p{partition}: follower fetch {request_id} timed out"
                        ));
                        self.arm_fetch(partition, FOLLOWER_BACKOFF_MS, out);
                    }
                }
            }
            BrokerTimer::ParkExpired {
                partition,
                request_id,
            } => {
                let Some(r) = self.live().replicas.get_mut(&partition) else {
                    return;
                };
                let Some(i) = r.parked.iter().position(|p| p.request_id == request_id) else {
                    return;
                };
                let parked = r.parked.remove(i);
                self.answer_parked(partition, parked, out);
            }
            BrokerTimer::AckDeadline {
                partition,
                request_id,
            } => {
                let Some(r) = self.live().replicas.get_mut(&partition) else {
                    return;
                };
                if let Some(i) = r.pending.iter().position(|a| a.request_id == request_id) {
                    let ack = r.pending.remove(i);
                    out.send(
                        Node::Client(ack.client),
                        Msg::ProduceAnswer {
                            request_id: ack.request_id,
                            result: Err(ErrorCode::RequestTimedOut),
                        },
                    );
                }
            }
            BrokerTimer::AlterIsrTimeout {
                partition,
                request_id,
            } => {
                // As `controller_link`: a lost answer is a failed call.
                self.timer(
                    out,
                    ISR_CHECK_MS * 5,
                    BrokerTimer::AlterIsrBackoff {
                        partition,
                        request_id,
                    },
                );
            }
            BrokerTimer::AlterIsrBackoff {
                partition,
                request_id,
            } => {
                if let Some(r) = self.live().replicas.get_mut(&partition) {
                    if r.alter_isr.is_some_and(|(id, _)| id == request_id) {
                        r.alter_isr = None;
                        r.core.isr_change_failed();
                    }
                }
            }
        }
    }

    fn sync_delay_ms(&self, sim_ms: u64) -> u64 {
        if sim_ms < self.slow_until_ms {
            self.slow_sync_ms
        } else {
            1
        }
    }

    fn heartbeat(&mut self, out: &mut Out) {
        let me = self.id;
        let live = self.live();
        let interval = if live.serving {
            HEARTBEAT_MS
        } else {
            HEARTBEAT_STARTING_MS
        };
        if live.broker_epoch == 0 {
            if !live.registering {
                live.registering = true;
            }
            let incarnation = live.incarnation;
            out.send(Node::Controller, Msg::Register { incarnation });
        } else {
            let ready = live.view.knows_registration(me, live.broker_epoch);
            let epoch = BrokerEpoch(live.broker_epoch);
            out.send(Node::Controller, Msg::Heartbeat { epoch, ready });
        }
        self.timer(out, interval, BrokerTimer::Heartbeat);
    }

    pub fn on_message(&mut self, sim_ms: u64, from: Node, msg: Msg, out: &mut Out) {
        match msg {
            Msg::Registered(Ok(epoch)) => {
                let live = self.live();
                if live.registering || live.broker_epoch == 0 {
                    live.broker_epoch = epoch.0;
                    live.registering = false;
                    out.trace.push(format!("registered at epoch {}", epoch.0));
                }
            }
            Msg::Registered(Err(e)) => {
                out.trace.push(format!("registration refused: {e}"));
                self.live().registering = false;
            }
            Msg::HeartbeatAnswer(Session::Unregistered) => {
                let live = self.live();
                live.broker_epoch = 0;
                live.registering = false;
            }
            Msg::HeartbeatAnswer(_) => {}
            Msg::Metadata(body) => self.apply_metadata(sim_ms, &body, out),
            Msg::AlterIsrAnswer {
                request_id,
                partition,
                result,
            } => self.on_alter_isr_answer(sim_ms, request_id, partition, result, out),
            Msg::ReplicaFetch {
                request_id,
                partition,
                fetch,
                offset,
            } => self.on_replica_fetch(sim_ms, from, request_id, partition, fetch, offset, out),
            Msg::ReplicaFetchAnswer {
                request_id,
                partition,
                answer,
                first_offset,
                records,
            } => self.on_fetch_answer(
                sim_ms,
                request_id,
                partition,
                answer,
                first_offset,
                records,
                out,
            ),
            Msg::Produce {
                request_id,
                partition,
                acks,
                values,
            } => self.on_produce(sim_ms, from, request_id, partition, acks, values, out),
            Msg::Consume {
                request_id,
                partition,
                offset,
            } => self.on_consume(from, request_id, partition, offset, out),
            other => panic!("broker {} got an unexpected {other:?}", self.id),
        }
    }

    /// As `Shard::publish_metadata` and `reconcile`: the view takes the update,
    /// then replicas follow `desired_replicas`.
    fn apply_metadata(&mut self, sim_ms: u64, body: &[u8], out: &mut Out) {
        let update = match decode_fetch_metadata_response(body) {
            Ok(Ok(update)) => update,
            Ok(Err(failure)) => {
                out.trace.push(format!("metadata refused: {failure:?}"));
                return;
            }
            Err(e) => panic!("the controller's own encoding does not decode: {e}"),
        };
        let me = self.id;
        let live = self.live();
        if let Err(e) = live.view.apply(update) {
            out.trace.push(format!("metadata update refused: {e}"));
            return;
        }
        let (wanted, unusable) = desired_replicas(&live.view, &LogConfig::default(), me, 0);
        assert!(unusable.is_empty(), "the topic config is usable");
        let mut wanted: Vec<_> = wanted.into_iter().collect();
        wanted.sort_by_key(|(k, _)| k.partition);
        for (key, desired) in wanted {
            assert_eq!(key.topic, TOPIC);
            let p = u32::try_from(key.partition).expect("non-negative");
            if !self.live().replicas.contains_key(&p) {
                let replica = self.open_replica(p, desired.topic_id, &desired.role);
                self.live().replicas.insert(p, replica);
            }
            self.set_role(sim_ms, p, desired.role, out);
        }
        let live = self.live();
        if !live.serving && live.view.is_registered_and_unfenced(me, live.broker_epoch) {
            live.serving = true;
            out.trace.push("serving".to_string());
        }
    }

    /// As `Replica::new`: the epoch history from its file, cut to the log.
    fn open_replica(&mut self, p: u32, topic_id: u64, role: &Role) -> Replica {
        let disk = &self.disks[p as usize];
        let fallback = match disk.records().last() {
            Some(last) => EpochHistory::from_entries(vec![(LeaderEpoch(last.epoch), Offset::ZERO)]),
            None => EpochHistory::default(),
        };
        let epochs = EpochHistory::recovered(disk.epoch_file.clone(), Offset(disk.log_end()))
            .unwrap_or(fallback);
        Replica {
            topic_id,
            core: ReplicaCore::new(self.id, role, epochs),
            high_watermark: 0,
            alter_isr: None,
            pending: Vec::new(),
            parked: Vec::new(),
            fetch_in_flight: None,
            fetch_armed: false,
        }
    }

    /// As `Shard::set_role`.
    fn set_role(&mut self, sim_ms: u64, p: u32, role: Role, out: &mut Out) {
        // Monotonic, as the shard's `monotonic_ms`: skew moves wall time only.
        let now_ms = sim_ms;
        let end = self.disks[p as usize].log_end();
        let replica = self.live().replicas.get_mut(&p).expect("opened");
        let hw = replica.high_watermark;
        let Some(applied) = replica
            .core
            .apply_role(role.clone(), Offset(end), Offset(hw), now_ms)
        else {
            return;
        };
        if applied.new_leadership {
            replica.alter_isr = None;
        }
        out.trace.push(format!(
            "p{p}: role leader={} leader_epoch={} partition_epoch={} isr={:?}",
            role.leader, role.leader_epoch, role.partition_epoch, role.isr
        ));
        if applied.epochs_changed {
            self.save_epochs(p);
        }
        if !role.leader && role.leader_endpoint.is_some() {
            self.arm_fetch(p, 0, out);
        }
        self.update_high_watermark(sim_ms, p, out);
    }

    /// The epoch history is saved at once, as the shard does.
    fn save_epochs(&mut self, p: u32) {
        let replica = &self.live.as_ref().expect("running").replicas[&p];
        self.disks[p as usize].epoch_file = replica.core.epochs().entries().to_vec();
    }

    /// As `Shard::note_epoch`.
    fn note_epoch(&mut self, p: u32, epoch: i32, start: i64) {
        let replica = self.live().replicas.get_mut(&p).expect("opened");
        if replica.core.note_epoch(LeaderEpoch(epoch), Offset(start)) {
            self.save_epochs(p);
        }
    }

    /// As `Shard::update_high_watermark` on a leader, then every waiting
    /// write is decided again (the shard's waiters wake on the watermark and
    /// on role changes).
    fn update_high_watermark(&mut self, sim_ms: u64, p: u32, out: &mut Out) {
        let stable = self.disks[p as usize].durable_end();
        let replica = self.live().replicas.get_mut(&p).expect("opened");
        let hw = replica
            .core
            .high_watermark(Offset(replica.high_watermark), Offset(stable));
        if let Some(Offset(hw)) = hw {
            let log_end = self.disks[p as usize].log_end();
            assert!(
                hw <= log_end,
                "a leader's high watermark {hw} passed its log end {log_end}"
            );
            self.live()
                .replicas
                .get_mut(&p)
                .expect("opened")
                .high_watermark = hw;
        }
        self.settle_acks(sim_ms, p, out);
    }

    /// As `produce_local` after the append: acks=1 once the records are
    /// stable, acks=all once `replication::ack::decide` commits them.
    fn settle_acks(&mut self, sim_ms: u64, p: u32, out: &mut Out) {
        let stable = self.disks[p as usize].durable_end();
        let log_end = self.disks[p as usize].log_end();
        let replica = self.live().replicas.get_mut(&p).expect("opened");
        let mut answers = Vec::new();
        replica.pending.retain(|a| {
            if a.deadline_ms <= sim_ms {
                answers.push((a.client, a.request_id, Err(ErrorCode::RequestTimedOut)));
                return false;
            }
            if stable < a.end {
                if log_end < a.end {
                    // Cut below the write before it became stable.
                    answers.push((a.client, a.request_id, Err(ErrorCode::NotLeaderOrFollower)));
                    return false;
                }
                return true;
            }
            if a.acks == 1 {
                answers.push((a.client, a.request_id, Ok(a.base)));
                return false;
            }
            let decision = replica.core.ack(
                a.leader_epoch,
                Offset(replica.high_watermark),
                Offset(a.end),
            );
            let result = match decision {
                AckDecision::Wait => return true,
                AckDecision::Committed => Ok(a.base),
                AckDecision::NotLeader => Err(ErrorCode::NotLeaderOrFollower),
                AckDecision::NotEnoughReplicasAfterAppend => {
                    Err(ErrorCode::NotEnoughReplicasAfterAppend)
                }
            };
            answers.push((a.client, a.request_id, result));
            false
        });
        for (client, request_id, result) in answers {
            out.send(
                Node::Client(client),
                Msg::ProduceAnswer { request_id, result },
            );
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_produce(
        &mut self,
        sim_ms: u64,
        from: Node,
        request_id: u64,
        p: u32,
        acks: i16,
        values: Vec<u64>,
        out: &mut Out,
    ) {
        let Node::Client(client) = from else {
            panic!("produce from {from:?}")
        };
        let refuse = |out: &mut Out, code| {
            out.send(
                from,
                Msg::ProduceAnswer {
                    request_id,
                    result: Err(code),
                },
            );
        };
        let live = self.live();
        let Some(replica) = live.replicas.get(&p).filter(|_| live.serving) else {
            return refuse(out, ErrorCode::NotLeaderOrFollower);
        };
        let role = replica.core.role();
        if !role.leader {
            return refuse(out, ErrorCode::NotLeaderOrFollower);
        }
        if acks == -1 && role.isr.len() < role.min_insync {
            return refuse(out, ErrorCode::NotEnoughReplicas);
        }
        let epoch = role.leader_epoch;
        let disk = &mut self.disks[p as usize];
        let base = disk.log_end();
        let records: Vec<Rec> = values
            .iter()
            .map(|&value| Rec {
                epoch: epoch.0,
                value,
            })
            .collect();
        disk.append(&records);
        let end = disk.log_end();
        out.observations.push(Observation::LeaderAppend {
            partition: p,
            broker: self.id,
            incarnation: self.incarnation().expect("running"),
            leader_epoch: epoch,
        });
        out.trace.push(format!(
            "p{p}: appended {values:?} at {base} epoch {epoch} acks={acks}"
        ));
        self.note_epoch(p, epoch.0, base);
        self.start_sync(sim_ms, p, out);
        self.wake_parked(p, out);
        if acks == 0 || (acks == -1 && self.plant_ack_on_append) {
            out.send(
                from,
                Msg::ProduceAnswer {
                    request_id,
                    result: Ok(base),
                },
            );
        } else {
            let ack = PendingAck {
                client,
                request_id,
                acks,
                base,
                end,
                leader_epoch: epoch,
                deadline_ms: sim_ms + PRODUCE_TIMEOUT_MS,
            };
            self.live()
                .replicas
                .get_mut(&p)
                .expect("opened")
                .pending
                .push(ack);
            self.timer(
                out,
                PRODUCE_TIMEOUT_MS,
                BrokerTimer::AckDeadline {
                    partition: p,
                    request_id,
                },
            );
        }
        self.update_high_watermark(sim_ms, p, out);
    }

    fn start_sync(&mut self, sim_ms: u64, p: u32, out: &mut Out) {
        if self.disks[p as usize].start_sync() {
            let delay = self.sync_delay_ms(sim_ms);
            self.timer(out, delay, BrokerTimer::Sync { partition: p });
        }
    }

    /// A consumer reads committed records only (below the high watermark).
    fn on_consume(&mut self, from: Node, request_id: u64, p: u32, offset: i64, out: &mut Out) {
        let disk = &self.disks[p as usize];
        let live = self.live.as_ref().expect("running");
        let result = match live
            .replicas
            .get(&p)
            .filter(|r| live.serving && r.core.role().leader)
        {
            None => Err(ErrorCode::NotLeaderOrFollower),
            Some(r) => {
                let end = disk.log_end();
                let hw = r.high_watermark.min(end);
                if offset < 0 || offset > end {
                    Err(ErrorCode::OffsetOutOfRange)
                } else {
                    let upto = hw.min(offset + CONSUME_RECORDS_MAX as i64).max(offset);
                    Ok((
                        offset,
                        disk.records()[offset as usize..upto as usize].to_vec(),
                    ))
                }
            }
        };
        out.send(
            from,
            Msg::ConsumeAnswer {
                request_id,
                partition: p,
                result,
            },
        );
    }

    /// As `fetch_local` with `accept_follower_fetch` for a follower.
    #[allow(clippy::too_many_arguments)]
    fn on_replica_fetch(
        &mut self,
        sim_ms: u64,
        from: Node,
        request_id: u64,
        p: u32,
        fetch: FollowerFetch,
        offset: i64,
        out: &mut Out,
    ) {
        // Monotonic, as the shard's `monotonic_ms`: skew moves wall time only.
        let now_ms = sim_ms;
        let end = self.disks[p as usize].log_end();
        let refuse = |out: &mut Out, error| {
            out.send(
                from,
                Msg::ReplicaFetchAnswer {
                    request_id,
                    partition: p,
                    answer: LeaderAnswer {
                        error,
                        high_watermark: UNKNOWN_OFFSET,
                        log_start_offset: UNKNOWN_OFFSET,
                        log_end_offset: None,
                        diverging: None,
                    },
                    first_offset: offset,
                    records: Vec::new(),
                },
            )
        };
        let live = self.live();
        let registered = live.view.brokers.get(&fetch.broker_id).map(|b| b.epoch);
        let Some(replica) = live.replicas.get_mut(&p) else {
            return refuse(out, ErrorCode::NotLeaderOrFollower);
        };
        match replica
            .core
            .follower_fetch(&fetch, Offset(offset), Offset(end), registered, now_ms)
        {
            FollowerFetchVerdict::Serve => {}
            FollowerFetchVerdict::Refuse(code, _) => return refuse(out, code),
            FollowerFetchVerdict::Diverging { epoch, end_offset } => {
                let hw = replica.high_watermark;
                out.send(
                    from,
                    Msg::ReplicaFetchAnswer {
                        request_id,
                        partition: p,
                        answer: LeaderAnswer {
                            error: ErrorCode::None,
                            high_watermark: Offset(hw),
                            log_start_offset: Offset::ZERO,
                            log_end_offset: Some(Offset(end)),
                            diverging: Some((epoch, end_offset)),
                        },
                        first_offset: offset,
                        records: Vec::new(),
                    },
                );
                return;
            }
        }
        self.update_high_watermark(sim_ms, p, out);
        if offset > end {
            return refuse(out, ErrorCode::OffsetOutOfRange);
        }
        let parked = Parked {
            follower: from,
            request_id,
            offset,
        };
        if offset < end {
            self.answer_parked(p, parked, out);
        } else {
            self.live()
                .replicas
                .get_mut(&p)
                .expect("opened")
                .parked
                .push(parked);
            self.timer(
                out,
                FOLLOWER_FETCH_WAIT_MS,
                BrokerTimer::ParkExpired {
                    partition: p,
                    request_id,
                },
            );
        }
    }

    /// New records: answer the follower fetches waiting for them.
    fn wake_parked(&mut self, p: u32, out: &mut Out) {
        let parked = std::mem::take(&mut self.live().replicas.get_mut(&p).expect("opened").parked);
        for parked in parked {
            self.answer_parked(p, parked, out);
        }
    }

    /// The read a follower's fetch ends with, as things stand now.
    fn answer_parked(&mut self, p: u32, parked: Parked, out: &mut Out) {
        let disk = &self.disks[p as usize];
        let end = disk.log_end();
        let replica = &self.live.as_ref().expect("running").replicas[&p];
        let mut answer = LeaderAnswer {
            error: ErrorCode::None,
            high_watermark: Offset(replica.high_watermark.min(end)),
            log_start_offset: Offset::ZERO,
            log_end_offset: Some(Offset(end)),
            diverging: None,
        };
        let mut records = Vec::new();
        if !replica.core.role().leader {
            answer = LeaderAnswer {
                error: ErrorCode::NotLeaderOrFollower,
                high_watermark: UNKNOWN_OFFSET,
                log_start_offset: UNKNOWN_OFFSET,
                log_end_offset: None,
                diverging: None,
            };
        } else if parked.offset > end {
            answer.error = ErrorCode::OffsetOutOfRange;
        } else {
            let upto = end.min(parked.offset + FETCH_RECORDS_MAX as i64);
            records = disk.records()[parked.offset as usize..upto as usize].to_vec();
        }
        out.send(
            parked.follower,
            Msg::ReplicaFetchAnswer {
                request_id: parked.request_id,
                partition: p,
                answer,
                first_offset: parked.offset,
                records,
            },
        );
    }

    fn arm_fetch(&mut self, p: u32, delay_ms: u64, out: &mut Out) {
        let replica = self.live().replicas.get_mut(&p).expect("opened");
        if replica.fetch_armed || replica.fetch_in_flight.is_some() {
            return;
        }
        replica.fetch_armed = true;
        self.timer(out, delay_ms, BrokerTimer::FollowerFetch { partition: p });
    }

    /// As `shard::fetcher`: fetch from the log end once it is stable.
    fn follower_fetch(&mut self, p: u32, out: &mut Out) {
        let me = self.id;
        let disk = &self.disks[p as usize];
        let (end, stable) = (disk.log_end(), disk.durable_end());
        let live = self.live.as_mut().expect("running");
        let broker_epoch = live.broker_epoch;
        let Some(replica) = live.replicas.get_mut(&p) else {
            return;
        };
        replica.fetch_armed = false;
        let role = replica.core.role();
        if role.leader || replica.fetch_in_flight.is_some() {
            return;
        }
        let Some(leader) = role.leader_endpoint.as_deref().map(endpoint_broker) else {
            return;
        };
        if stable < end {
            replica.fetch_armed = true;
            self.timer(
                out,
                FOLLOWER_STABLE_POLL_MS,
                BrokerTimer::FollowerFetch { partition: p },
            );
            return;
        }
        let fetch = FollowerFetch {
            broker_id: me,
            broker_epoch: BrokerEpoch(broker_epoch),
            current_leader_epoch: role.leader_epoch,
            last_fetched_epoch: replica
                .core
                .epochs()
                .latest_epoch()
                .unwrap_or(LeaderEpoch::NONE),
        };
        let epoch = role.leader_epoch;
        let request_id = self.next_request_id();
        let replica = self.live().replicas.get_mut(&p).expect("opened");
        replica.fetch_in_flight = Some((request_id, epoch));
        out.send(
            Node::AnyBroker(leader),
            Msg::ReplicaFetch {
                request_id,
                partition: p,
                fetch,
                offset: end,
            },
        );
        self.timer(
            out,
            FOLLOWER_FETCH_WAIT_MS + FOLLOWER_REQUEST_MS_MAX,
            BrokerTimer::FetchTimeout {
                partition: p,
                request_id,
            },
        );
    }

    /// As `Shard::apply_fetched`.
    #[allow(clippy::too_many_arguments)]
    fn on_fetch_answer(
        &mut self,
        sim_ms: u64,
        request_id: u64,
        p: u32,
        answer: LeaderAnswer,
        first_offset: i64,
        records: Vec<Rec>,
        out: &mut Out,
    ) {
        let own_end = self.disks[p as usize].log_end();
        let Some(replica) = self.live.as_mut().expect("running").replicas.get_mut(&p) else {
            return;
        };
        let Some((id, epoch)) = replica.fetch_in_flight else {
            return;
        };
        if id != request_id {
            return;
        }
        replica.fetch_in_flight = None;
        let still_following = replica.core.follows_at(epoch);
        if !still_following {
            self.arm_fetch(p, 0, out);
            return;
        }
        let action = replica.core.follower_action(&answer, Offset(own_end));
        match action {
            FollowerAction::Retry => self.arm_fetch(p, FOLLOWER_BACKOFF_MS, out),
            FollowerAction::Truncate(cut) => {
                out.trace.push(format!(
                    "p{p}: follower cuts its log from {own_end} to {cut}"
                ));
                self.disks[p as usize].truncate(cut.0);
                self.after_cut(p, cut.0);
                self.arm_fetch(p, 0, out);
            }
            FollowerAction::RestartAt(start) => {
                panic!("p{p}: restart at {start}, but the simulated log has no retention")
            }
            FollowerAction::Append => {
                let mut offset = first_offset;
                for rec in records {
                    let end = self.disks[p as usize].log_end();
                    if offset < end {
                        offset += 1;
                        continue;
                    }
                    if offset > end {
                        // The log changed while the fetch was out.
                        break;
                    }
                    self.disks[p as usize].append(&[rec]);
                    self.note_epoch(p, rec.epoch, offset);
                    offset += 1;
                }
                let end = self.disks[p as usize].log_end();
                let replica = self.live().replicas.get_mut(&p).expect("opened");
                replica.high_watermark =
                    follower::follower_high_watermark(answer.high_watermark, Offset(end)).0;
                self.start_sync(sim_ms, p, out);
                self.arm_fetch(p, 0, out);
            }
        }
    }

    /// As `Shard::after_cut`.
    fn after_cut(&mut self, p: u32, new_end: i64) {
        let replica = self.live().replicas.get_mut(&p).expect("opened");
        if replica.core.cut(Offset(new_end)) {
            self.save_epochs(p);
        }
        let replica = self.live().replicas.get_mut(&p).expect("opened");
        if replica.high_watermark > new_end {
            replica.high_watermark = new_end;
        }
    }

    /// As `Shard::check_isr`.
    fn check_isr(&mut self, sim_ms: u64, p: u32, out: &mut Out) {
        let me = self.id;
        // Monotonic, as the shard's `monotonic_ms`: skew moves wall time only.
        let now_ms = sim_ms;
        let live = self.live.as_mut().expect("running");
        let ineligible = broker::shard::ineligible_for_isr(
            &live.view,
            &live.replicas.get(&p).expect("opened").core.role().replicas,
        );
        let my_epoch = live.broker_epoch;
        let replica = live.replicas.get_mut(&p).expect("opened");
        let from = replica.core.role().isr.clone();
        let Some(change) = replica.core.isr_change(
            now_ms,
            REPLICA_LAG_TIME_MAX_MS,
            BrokerEpoch(my_epoch),
            &ineligible,
        ) else {
            return;
        };
        let request = protocol::control::messages::AlterIsr {
            leader_id: me,
            topic_id: TopicId(replica.topic_id),
            partition: PartitionIndex(p),
            leader_epoch: change.leader_epoch,
            partition_epoch: change.partition_epoch,
            new_isr: change.new_isr.clone(),
            new_isr_epochs: change.new_isr_epochs,
        };
        let request_id = self.next_request_id();
        self.live().replicas.get_mut(&p).expect("opened").alter_isr =
            Some((request_id, change.leader_epoch));
        out.trace.push(format!(
            "p{p}: asks for ISR {:?} (from {from:?})",
            change.new_isr
        ));
        out.send(
            Node::Controller,
            Msg::AlterIsr {
                request_id,
                request,
            },
        );
        self.timer(
            out,
            CONTROLLER_REQUEST_MS_MAX,
            BrokerTimer::AlterIsrTimeout {
                partition: p,
                request_id,
            },
        );
    }

    fn on_alter_isr_answer(
        &mut self,
        sim_ms: u64,
        request_id: u64,
        p: u32,
        result: Result<
            protocol::control::records::PartitionRecord,
            controller::command::CommandError,
        >,
        out: &mut Out,
    ) {
        let Some(replica) = self.live().replicas.get_mut(&p) else {
            return;
        };
        let Some((id, asked)) = replica.alter_isr else {
            return;
        };
        if id != request_id {
            return;
        }
        match result {
            Ok(record) => {
                replica.alter_isr = None;
                let next = replica
                    .core
                    .isr_changed(asked, record.isr, record.partition_epoch);
                if let Some(next) = next {
                    self.set_role(sim_ms, p, next, out);
                }
            }
            Err(e) => {
                out.trace.push(format!("p{p}: ISR change refused: {e}"));
                self.timer(
                    out,
                    ISR_CHECK_MS * 5,
                    BrokerTimer::AlterIsrBackoff {
                        partition: p,
                        request_id,
                    },
                );
            }
        }
    }
}
