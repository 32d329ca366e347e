//! The simulated world: one event queue on simulated time, the network
//! between nodes (delay, loss, duplication, reordering, partitions), the
//! fault schedule (crashes with loss of unsynced writes, isolation, link
//! cuts, controller outages, clock jumps, slow disks), and the checker run
//! after every event. Everything random comes from one seeded `Rng`, and
//! every collection iterates in a fixed order, so a seed replays exactly.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};

use protocol::BrokerId;

use crate::broker::{Out, SimBroker};
use crate::checker::{Checker, Violation};
use crate::client::{Client, ClientOut, Role as ClientRole};
use crate::controller::SimController;
use crate::msg::{Action, Msg, Node, Observation, Timer};
use crate::rng::Rng;

/// Lines of trace kept for a failure report.
const TRACE_LINES_MAX: usize = 400;
/// Bound on events of one run, so a livelock ends as a failure.
const EVENTS_MAX: u64 = 20_000_000;

/// What one run simulates.
#[derive(Clone, Debug)]
pub struct Options {
    pub brokers: u32,
    pub partitions: u32,
    pub producers: u32,
    /// Simulated time with faults.
    pub chaos_ms: u64,
    /// Simulated time after every fault healed, before the final checks.
    pub settle_ms: u64,
    pub faults: bool,
    /// Print every event as it happens.
    pub trace: bool,
    /// A planted bug for testing the checker: brokers answer acks=all writes
    /// as soon as the leader appended them.
    pub plant_ack_on_append: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            brokers: 3,
            partitions: 2,
            producers: 3,
            chaos_ms: 20_000,
            settle_ms: 15_000,
            faults: true,
            trace: false,
            plant_ack_on_append: false,
        }
    }
}

/// What a passing run did.
#[derive(Clone, Debug)]
pub struct Report {
    pub seed: u64,
    pub events: u64,
    pub faults: u64,
    pub acked_all: u64,
    pub acked_one: u64,
    pub consumed: u64,
    pub committed: u64,
}

/// A failing run: the seed replays it.
#[derive(Clone, Debug)]
pub struct Failure {
    pub seed: u64,
    pub at_ms: u64,
    pub violation: String,
    pub trace: Vec<String>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "seed {} failed at {} ms: {}",
            self.seed, self.at_ms, self.violation
        )?;
        writeln!(f, "last {} trace lines:", self.trace.len())?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        write!(
            f,
            "replay: cargo run --release -p sim --bin ringlog-sim -- --seed {} --trace",
            self.seed
        )
    }
}

#[derive(Clone, Copy, Debug)]
enum WorldTimer {
    CreateTopic,
    NextFault,
    Restart(BrokerId),
    EndIsolation(BrokerId),
    EndLinkCut(BrokerId, BrokerId),
    EndControllerCut(BrokerId),
    ControllerUp,
    NetworkCalm,
    Heal,
    End,
}

#[derive(Debug)]
enum Kind {
    Deliver { from: Node, to: Node, msg: Msg },
    Timer(Timer),
    World(WorldTimer),
}

#[derive(Debug)]
struct Event {
    at_ms: u64,
    seq: u64,
    kind: Kind,
}

impl PartialEq for Event {
    fn eq(&self, other: &Event) -> bool {
        (self.at_ms, self.seq) == (other.at_ms, other.seq)
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Event) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    fn cmp(&self, other: &Event) -> std::cmp::Ordering {
        (self.at_ms, self.seq).cmp(&(other.at_ms, other.seq))
    }
}

#[derive(Debug, Default)]
struct Network {
    isolated: BTreeSet<BrokerId>,
    cut_links: BTreeSet<(BrokerId, BrokerId)>,
    cut_from_controller: BTreeSet<BrokerId>,
    drop_ppm: u64,
    duplicate_ppm: u64,
    spike_ppm: u64,
}

impl Network {
    const CALM: (u64, u64, u64) = (1_000, 500, 5_000);

    fn calm(&mut self) {
        (self.drop_ppm, self.duplicate_ppm, self.spike_ppm) = Network::CALM;
    }

    fn blocked(&self, from: Node, to: Node) -> bool {
        let broker = |n: Node| match n {
            Node::Broker(id, _) | Node::AnyBroker(id) => Some(id),
            _ => None,
        };
        let (a, b) = (broker(from), broker(to));
        if a.is_some_and(|a| self.isolated.contains(&a))
            || b.is_some_and(|b| self.isolated.contains(&b))
        {
            return a != b;
        }
        match (a, b, from, to) {
            (Some(a), Some(b), _, _) => self.cut_links.contains(&(a.min(b), a.max(b))),
            (Some(a), None, _, Node::Controller) | (None, Some(a), Node::Controller, _) => {
                self.cut_from_controller.contains(&a)
            }
            _ => false,
        }
    }
}

pub struct World {
    seed: u64,
    options: Options,
    rng: Rng,
    now_ms: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<Event>>,
    controller: SimController,
    brokers: BTreeMap<BrokerId, SimBroker>,
    clients: BTreeMap<u32, Client>,
    network: Network,
    checker: Checker,
    trace: VecDeque<String>,
    next_incarnation: u64,
    next_value: u64,
    events: u64,
    faults: u64,
    chaos: bool,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World")
            .field("seed", &self.seed)
            .field("now_ms", &self.now_ms)
            .finish_non_exhaustive()
    }
}

impl World {
    pub fn new(seed: u64, options: Options) -> World {
        let mut network = Network::default();
        network.calm();
        let brokers = (1..=options.brokers)
            .map(|id| {
                (
                    BrokerId(id),
                    SimBroker::new(
                        BrokerId(id),
                        options.partitions,
                        options.plant_ack_on_append,
                    ),
                )
            })
            .collect();
        let mut clients = BTreeMap::new();
        for id in 0..options.producers {
            clients.insert(
                id,
                Client::new(id, ClientRole::Producer, options.partitions),
            );
        }
        for partition in 0..options.partitions {
            let id = options.producers + partition;
            clients.insert(
                id,
                Client::new(id, ClientRole::Consumer { partition }, options.partitions),
            );
        }
        World {
            seed,
            options,
            rng: Rng::new(seed),
            now_ms: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            controller: SimController::new(),
            brokers,
            clients,
            network,
            checker: Checker::default(),
            trace: VecDeque::new(),
            next_incarnation: 1,
            next_value: 0,
            events: 0,
            faults: 0,
            chaos: true,
        }
    }

    fn log(&mut self, line: String) {
        let line = format!("{:>7} {line}", self.now_ms);
        if self.options.trace {
            eprintln!("{line}");
        }
        if self.trace.len() == TRACE_LINES_MAX {
            self.trace.pop_front();
        }
        self.trace.push_back(line);
    }

    fn push(&mut self, delay_ms: u64, kind: Kind) {
        self.seq += 1;
        self.queue.push(Reverse(Event {
            at_ms: self.now_ms + delay_ms,
            seq: self.seq,
            kind,
        }));
    }

    fn fail(&self, violation: Violation) -> Failure {
        Failure {
            seed: self.seed,
            at_ms: self.now_ms,
            violation: violation.0,
            trace: self.trace.iter().cloned().collect(),
        }
    }

    pub fn run(mut self) -> Result<Report, Failure> {
        let ids: Vec<BrokerId> = self.brokers.keys().copied().collect();
        for id in ids {
            self.start_broker(id);
        }
        self.push(0, Kind::Timer(Timer::ControllerTick));
        self.push(100, Kind::World(WorldTimer::CreateTopic));
        let clients: Vec<u32> = self.clients.keys().copied().collect();
        for id in clients {
            let delay = self.rng.between(300, 600);
            self.push(
                delay,
                Kind::Timer(Timer::Client(id, crate::msg::ClientTimer::Step)),
            );
        }
        if self.options.faults {
            let delay = self.rng.between(500, 2_000);
            self.push(delay, Kind::World(WorldTimer::NextFault));
        }
        self.push(self.options.chaos_ms, Kind::World(WorldTimer::Heal));
        self.push(
            self.options.chaos_ms + self.options.settle_ms,
            Kind::World(WorldTimer::End),
        );
        while let Some(Reverse(event)) = self.queue.pop() {
            assert!(event.at_ms >= self.now_ms, "time runs forward");
            self.now_ms = event.at_ms;
            self.events += 1;
            if self.events > EVENTS_MAX {
                return Err(self.fail(Violation(format!("more than {EVENTS_MAX} events"))));
            }
            if let Kind::World(WorldTimer::End) = event.kind {
                self.final_checks().map_err(|v| self.fail(v))?;
                return Ok(Report {
                    seed: self.seed,
                    events: self.events,
                    faults: self.faults,
                    acked_all: self.checker.acked_all.len() as u64,
                    acked_one: self.checker.acked_one,
                    consumed: self.checker.consumed,
                    committed: (0..self.options.partitions)
                        .map(|p| self.checker.committed(p).len() as u64)
                        .sum(),
                });
            }
            let observations = self.handle(event.kind);
            for o in &observations {
                self.checker
                    .observe(self.now_ms, o)
                    .map_err(|v| self.fail(v))?;
            }
            self.check_leaders().map_err(|v| self.fail(v))?;
        }
        unreachable!("the End event stops the run")
    }

    fn start_broker(&mut self, id: BrokerId) {
        let incarnation = self.next_incarnation;
        self.next_incarnation += 1;
        let mut out = Out::default();
        self.brokers
            .get_mut(&id)
            .expect("known")
            .start(incarnation, &mut out);
        self.log(format!("broker {id} starts (incarnation {incarnation})"));
        self.apply_out(Node::Broker(id, incarnation), out);
    }

    fn handle(&mut self, kind: Kind) -> Vec<Observation> {
        match kind {
            Kind::Deliver { from, to, msg } => self.deliver(from, to, msg),
            Kind::Timer(Timer::Broker(id, incarnation, timer)) => {
                let broker = self.brokers.get_mut(&id).expect("known");
                if broker.incarnation() != Some(incarnation) {
                    return Vec::new();
                }
                let mut out = Out::default();
                broker.on_timer(self.now_ms, timer, &mut out);
                self.apply_out(Node::Broker(id, incarnation), out)
            }
            Kind::Timer(Timer::Client(id, timer)) => {
                let mut out = ClientOut::default();
                let client = self.clients.get_mut(&id).expect("known");
                client.on_timer(timer, &mut self.rng, &mut self.next_value, &mut out);
                self.apply_client_out(id, out)
            }
            Kind::Timer(Timer::ControllerTick) => {
                let actions = self.controller.tick(self.now_ms);
                self.drain_controller_trace();
                self.apply_actions(Node::Controller, actions);
                Vec::new()
            }
            Kind::World(timer) => {
                self.world_timer(timer);
                Vec::new()
            }
        }
    }

    fn deliver(&mut self, from: Node, to: Node, msg: Msg) -> Vec<Observation> {
        match to {
            Node::Controller => {
                if !self.controller.up {
                    return Vec::new();
                }
                let actions = self.controller.on_message(self.now_ms, from, msg);
                self.drain_controller_trace();
                self.apply_actions(Node::Controller, actions);
                Vec::new()
            }
            Node::Broker(id, _) | Node::AnyBroker(id) => {
                let broker = self.brokers.get_mut(&id).expect("known");
                let Some(incarnation) = broker.incarnation() else {
                    return Vec::new();
                };
                if matches!(to, Node::Broker(_, wanted) if wanted != incarnation) {
                    return Vec::new();
                }
                let mut out = Out::default();
                broker.on_message(self.now_ms, from, msg, &mut out);
                self.apply_out(Node::Broker(id, incarnation), out)
            }
            Node::Client(id) => {
                let mut out = ClientOut::default();
                let client = self.clients.get_mut(&id).expect("known");
                client.on_message(&mut self.rng, msg, &mut out);
                self.apply_client_out(id, out)
            }
        }
    }

    fn drain_controller_trace(&mut self) {
        for line in std::mem::take(&mut self.controller.trace) {
            self.log(line);
        }
    }

    fn apply_out(&mut self, node: Node, out: Out) -> Vec<Observation> {
        for line in out.trace {
            self.log(format!("{node:?}: {line}"));
        }
        self.apply_actions(node, out.actions);
        out.observations
    }

    fn apply_client_out(&mut self, id: u32, out: ClientOut) -> Vec<Observation> {
        self.apply_actions(Node::Client(id), out.actions);
        out.observations
    }

    fn apply_actions(&mut self, from: Node, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::After { delay_ms, timer } => self.push(delay_ms, Kind::Timer(timer)),
                Action::Send { to, msg } => self.send(from, to, msg),
            }
        }
    }

    /// The network: partitions drop, then loss, delay spikes (which reorder)
    /// and duplicates, each by the current rates.
    fn send(&mut self, from: Node, to: Node, msg: Msg) {
        if self.network.blocked(from, to) || self.rng.chance(self.network.drop_ppm) {
            if self.options.trace {
                self.log(format!("dropped {from:?} -> {to:?}: {msg:?}"));
            }
            return;
        }
        let copies = if self.rng.chance(self.network.duplicate_ppm) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = if self.rng.chance(self.network.spike_ppm) {
                self.rng.between(20, 400)
            } else {
                self.rng.between(0, 3)
            };
            if self.options.trace {
                self.log(format!("send {from:?} -> {to:?} in {delay} ms: {msg:?}"));
            }
            self.push(
                delay,
                Kind::Deliver {
                    from,
                    to,
                    msg: msg.clone(),
                },
            );
        }
    }

    fn live_brokers(&self) -> Vec<BrokerId> {
        self.brokers
            .values()
            .filter(|b| b.live.is_some())
            .map(|b| b.id)
            .collect()
    }

    fn world_timer(&mut self, timer: WorldTimer) {
        match timer {
            WorldTimer::CreateTopic => {
                let rf = self.options.brokers.min(3) as u16;
                if self.controller.create_topic(self.options.partitions, rf) {
                    self.drain_controller_trace();
                } else {
                    self.push(100, Kind::World(WorldTimer::CreateTopic));
                }
            }
            WorldTimer::NextFault => {
                if !self.chaos {
                    return;
                }
                self.inject_fault();
                let delay = self.rng.between(200, 2_500);
                self.push(delay, Kind::World(WorldTimer::NextFault));
            }
            WorldTimer::Restart(id) => {
                if self.brokers[&id].live.is_none() {
                    self.start_broker(id);
                }
            }
            WorldTimer::EndIsolation(id) => {
                self.network.isolated.remove(&id);
                self.log(format!("broker {id} reconnected"));
            }
            WorldTimer::EndLinkCut(a, b) => {
                self.network.cut_links.remove(&(a, b));
                self.log(format!("link {a}-{b} restored"));
            }
            WorldTimer::EndControllerCut(id) => {
                self.network.cut_from_controller.remove(&id);
                self.log(format!("broker {id} reaches the controller again"));
            }
            WorldTimer::ControllerUp => {
                self.controller.up = true;
                self.log("controller quorum back".to_string());
            }
            WorldTimer::NetworkCalm => {
                if !self.chaos {
                    return;
                }
                self.network.calm();
                self.log("network calm".to_string());
            }
            WorldTimer::Heal => {
                self.chaos = false;
                self.log("healing: every broker up, network whole, controller up".to_string());
                // A whole network loses nothing: a lost message would stand
                // for a broken connection, which is a fault.
                self.network = Network::default();
                self.controller.up = true;
                let dead: Vec<BrokerId> = self
                    .brokers
                    .values()
                    .filter(|b| b.live.is_none())
                    .map(|b| b.id)
                    .collect();
                for id in dead {
                    self.start_broker(id);
                }
                for broker in self.brokers.values_mut() {
                    broker.slow_until_ms = 0;
                }
            }
            WorldTimer::End => unreachable!("handled by run"),
        }
    }

    fn inject_fault(&mut self) {
        self.faults += 1;
        let ids: Vec<BrokerId> = self.brokers.keys().copied().collect();
        let id = self.rng.pick(&ids);
        let span = self.rng.between(200, 5_000);
        match self.rng.between(0, 99) {
            0..=24 => {
                if self.brokers[&id].live.is_some() {
                    let broker = self.brokers.get_mut(&id).expect("known");
                    broker.crash(&mut self.rng);
                    self.log(format!(
                        "broker {id} killed (kill -9); restarts in {span} ms"
                    ));
                    self.push(span, Kind::World(WorldTimer::Restart(id)));
                }
            }
            25..=39 => {
                self.network.isolated.insert(id);
                self.log(format!("broker {id} isolated for {span} ms"));
                self.push(span, Kind::World(WorldTimer::EndIsolation(id)));
            }
            40..=54 => {
                let other = self.rng.pick(&ids);
                if other != id {
                    let link = (id.min(other), id.max(other));
                    self.network.cut_links.insert(link);
                    self.log(format!("link {}-{} cut for {span} ms", link.0, link.1));
                    self.push(span, Kind::World(WorldTimer::EndLinkCut(link.0, link.1)));
                }
            }
            55..=64 => {
                self.network.cut_from_controller.insert(id);
                self.log(format!("broker {id} cut from the controller for {span} ms"));
                self.push(span, Kind::World(WorldTimer::EndControllerCut(id)));
            }
            65..=72 => {
                let span = span.min(3_000);
                self.controller.up = false;
                self.log(format!("controller quorum lost for {span} ms"));
                self.push(span, Kind::World(WorldTimer::ControllerUp));
            }
            73..=84 => {
                let jump = self.rng.between(0, 6_000) as i64 - 3_000;
                if self.rng.chance(300_000) {
                    self.controller.clock_skew_ms += jump;
                    self.log(format!("controller clock jumps {jump} ms"));
                } else {
                    self.brokers.get_mut(&id).expect("known").clock_skew_ms += jump;
                    self.log(format!("broker {id} clock jumps {jump} ms"));
                }
            }
            85..=94 => {
                let sync_ms = self.rng.between(20, 400);
                let broker = self.brokers.get_mut(&id).expect("known");
                broker.slow_sync_ms = sync_ms;
                broker.slow_until_ms = self.now_ms + span;
                self.log(format!(
                    "broker {id} disk slow ({sync_ms} ms per sync) for {span} ms"
                ));
            }
            _ => {
                self.network.drop_ppm = 100_000;
                self.network.duplicate_ppm = 50_000;
                self.network.spike_ppm = 50_000;
                self.log(format!("network storm for {span} ms"));
                self.push(span, Kind::World(WorldTimer::NetworkCalm));
            }
        }
    }

    /// After every event: each leader's watermark and committed records.
    fn check_leaders(&mut self) -> Result<(), Violation> {
        for broker in self.brokers.values() {
            let Some(live) = &broker.live else { continue };
            for (&p, replica) in &live.replicas {
                if !replica.core.role().leader || replica.core.leader_state().is_none() {
                    continue;
                }
                let leadership = (
                    p,
                    broker.id,
                    live.incarnation,
                    replica.core.role().leader_epoch,
                );
                self.checker.leader(
                    leadership,
                    replica.high_watermark,
                    broker.disks[p as usize].records(),
                )?;
            }
        }
        Ok(())
    }

    /// Once healed and settled: every partition has a serving leader that
    /// holds every committed record, every replica is back in the ISR with
    /// the leader's records, and acks=all writes still commit.
    fn final_checks(&mut self) -> Result<(), Violation> {
        let live = self.live_brokers();
        if live.len() != self.brokers.len() {
            return Err(Violation(format!(
                "only brokers {live:?} run after healing"
            )));
        }
        let topic = self
            .controller
            .state
            .topic_by_name(crate::broker::TOPIC)
            .ok_or_else(|| Violation("the topic was never created".to_string()))?
            .clone();
        for (p, record) in topic.partitions.iter().enumerate() {
            let p = p as u32;
            let leader = record
                .leader
                .ok_or_else(|| Violation(format!("p{p}: no leader after healing")))?;
            let broker = &self.brokers[&leader];
            let replica = broker
                .live
                .as_ref()
                .and_then(|l| l.replicas.get(&p))
                .filter(|r| r.core.leads_at(record.leader_epoch))
                .ok_or_else(|| {
                    Violation(format!(
                        "p{p}: broker {leader} does not lead at epoch {} after healing",
                        record.leader_epoch
                    ))
                })?;
            let committed = self.checker.committed(p).len() as i64;
            if replica.high_watermark < committed {
                return Err(Violation(format!(
                    "p{p}: leader {leader} high watermark {} is below the {committed} records once committed",
                    replica.high_watermark
                )));
            }
            let replicas: Vec<BrokerId> = record.replicas.iter().map(|r| r.broker_id).collect();
            let mut isr = record.isr.clone();
            isr.sort();
            let mut all = replicas.clone();
            all.sort();
            if isr != all {
                return Err(Violation(format!(
                    "p{p}: ISR {isr:?} is not every replica {all:?} after healing"
                )));
            }
            let leader_log = broker.disks[p as usize].records();
            let hw = replica.high_watermark as usize;
            for &r in &replicas {
                let log = self.brokers[&r].disks[p as usize].records();
                if log.len() < hw || log[..hw] != leader_log[..hw] {
                    return Err(Violation(format!(
                        "p{p}: replica {r} does not hold the leader's {hw} committed records"
                    )));
                }
            }
            let last = self.checker.last_ack_all_ms.get(&p).copied().unwrap_or(0);
            let since = self.options.chaos_ms + self.options.settle_ms / 2;
            if last < since {
                return Err(Violation(format!(
                    "p{p}: no acks=all write committed after {since} ms (last at {last} ms)"
                )));
            }
            for (&(ap, offset), &value) in self.checker.acked_all.range((p, 0)..(p + 1, 0)) {
                assert_eq!(ap, p);
                if leader_log.get(offset as usize).map(|r| r.value) != Some(value) {
                    return Err(Violation(format!(
                        "p{p}: acknowledged value {value} at offset {offset} is gone from leader {leader}"
                    )));
                }
            }
        }
        // Every pending write has an answer coming: none is older than its
        // deadline.
        for broker in self.brokers.values() {
            for (p, replica) in broker.live.iter().flat_map(|l| l.replicas.iter()) {
                if let Some(stuck) = replica.pending.iter().find(|a| a.deadline_ms < self.now_ms) {
                    return Err(Violation(format!(
                        "p{p}: broker {} holds a write past its deadline: {stuck:?}",
                        broker.id
                    )));
                }
            }
        }
        Ok(())
    }
}
