//! The replicated simulation: three real brokers, each a `Shard` started as
//! the broker binary starts one (controller session and metadata links,
//! listeners, maintenance; follower fetchers as reconcile makes them),
//! replicating over the simulated network under the simulated controller
//! (`control_server`), on one deterministic executor and simulated disk.
//! Brokers are simulated processes: kill -9 ends every task of one at once,
//! and it restarts with a new incarnation after a drawn pause.
//!
//! One run: producers send acks=all and acks=1 batches to whoever the
//! controller names as each partition's leader, and consumers read from it,
//! while brokers are killed and restarted, paused, have their links to the
//! others slowed or cut, their disk slowed, their wall clock jumped or
//! their connections reset, one at a time; then every broker is up again for a settling period, whose
//! quiet end must answer every produce request promptly and without error
//! with every broker back in every ISR; then the whole cluster is killed at
//! once, often with a power loss under `flush.policy=always`. An observer
//! reads every broker's replicas each simulated millisecond: one leader per
//! leader epoch, and a leader's high watermark never goes back. A second run restarts every broker,
//! waits for leaders, reads every partition back from its leader through
//! Fetch and checks every acks=all acknowledgement and every batch the
//! consumers were served; the brokers close cleanly and `verify-log` must
//! find every replica directory clean.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use broker::cluster_view::partition_dir;
use broker::config::{BrokerConfig, FileConfig, FileLogConfig};
use broker::net::serve_listener;
use broker::partition::PartitionKey;
use broker::runtime::net::Listener;
use broker::runtime::peer::PeerConnection;
use broker::runtime::shards::Mesh;
use broker::runtime::sim::net::{heal_all, reset_connections, set_link, Link};
use broker::runtime::{self, sim};
use broker::shard::{controller_link, Shard};
use client::messages::{
    fetch_request, fetch_response, produce_request, produce_response, FetchEntry, ProduceEntry,
};
use client::IsolationLevel;
use controller::command::Command;
use protocol::{
    ApiKey, BatchBuilder, BrokerId, Compression, ErrorCode, LeaderEpoch, Offset, RecordBatch,
};

use crate::control_server::{self, ControlState, CONTROLLER_LISTEN};
use crate::tagged::{Journal, SeedFailure, Sent};

const TOPIC: &str = "replicated";
const REQUEST_MS_MAX: u64 = 3_000;
const RESPONSE_BYTES_MAX: u32 = 16 << 20;
const FETCH_BYTES_MAX: i32 = 1 << 20;
const PRODUCE_TIMEOUT_MS: u64 = 5_000;
/// The controller's simulated process (brokers' processes count up from 2).
const CONTROLLER_PROCESS: u32 = 1;
/// How long the brokers have to register before the topic is made.
const STARTUP_MS_MAX: u64 = 2_000;
/// How long the read-back waits for leaders and records.
const READ_BACK_MS_MAX: u64 = 20_000;
/// A follower that has not caught up for this long leaves the ISR.
const REPLICA_LAG_TIME_MAX_MS: u64 = 1_000;
/// How long a clean close of every broker may take.
const CLOSE_MS_MAX: u64 = 10_000;
/// After the faults' end (the last one is undone 1.5 s before it at the
/// latest), how long the cluster has to take the restarted or fenced broker
/// back (register, catch up, rejoin the ISR) before the quiet period's
/// checks begin.
const SETTLE_GRACE_MS: u64 = 3_000;
/// A cut from the other brokers longer than this must have taken the cut
/// broker out of every ISR it shared: the lag bound, an ISR check and the
/// controller's round trip.
const CUT_ISR_MS_MAX: u64 = REPLICA_LAG_TIME_MAX_MS + 500;
/// In the quiet period every produce request must be answered, without an
/// error, within this long: a partition whose writes stall there (an ISR
/// that never grows back, a leader waiting on a sync that never ends) fails
/// the seed instead of passing on what it acknowledged before.
const QUIET_ANSWER_MS_MAX: u64 = 1_000;
/// How often the observer looks at every broker's replicas.
const OBSERVE_EVERY_MS: u64 = 1;

#[derive(Clone, Debug)]
pub struct ReplicatedOptions {
    pub brokers: u32,
    pub partitions: u32,
    pub producers: u32,
    /// Simulated milliseconds of kills and restarts.
    pub chaos_ms: u64,
    /// Simulated milliseconds with every broker up before the cluster is killed.
    pub settle_ms: u64,
    pub trace: bool,
    /// Send every acks=all batch with acks=1 but count it as acks=all: the
    /// checker's self-test (leader failovers then lose some of them).
    pub acks_all_sent_as_acks_one: bool,
    /// Kill one broker when the faults end and leave it down: the checker's
    /// self-test (the quiet period's checks then see a partition's ISR
    /// short of a broker).
    pub leave_a_broker_down: bool,
    /// Instead of drawn faults: a broker cut off from the others past the
    /// ISR's lag bound while every wall clock jumps five minutes back (a
    /// leader measuring lag on the wall clock keeps it in the ISR), then
    /// another while every clock jumps forward (acks=all deadlines on the
    /// wall clock time out at once).
    pub wall_clock_jumps_during_cuts: bool,
    /// Instead of drawn faults: a broker fenced (cut off from the
    /// controller alone) while it still fetches, then another cut off from
    /// the brokers (a leader that asks to take the fenced one back into the
    /// ISR is refused, and so never drops the cut one).
    pub fenced_follower_during_cut: bool,
}

impl ReplicatedOptions {
    /// Simulated milliseconds of the first run: startup, faults, settling.
    pub fn run_ms(&self) -> u64 {
        STARTUP_MS_MAX + self.chaos_ms + self.settle_ms
    }

    /// When the faults end (the last is undone 1.5 s before).
    fn chaos_end(&self) -> Duration {
        Duration::from_millis(STARTUP_MS_MAX + self.chaos_ms)
    }

    /// When the quiet period's checks begin: from then to the run's end,
    /// every produce request must be answered promptly and without error.
    fn quiet_from(&self) -> Duration {
        self.chaos_end() + Duration::from_millis(SETTLE_GRACE_MS)
    }

    /// The `ringlog-sim` flags for what differs from the defaults.
    pub fn flags(&self) -> String {
        let mut flags = String::new();
        if self.partitions != ReplicatedOptions::default().partitions {
            flags += &format!(" --partitions {}", self.partitions);
        }
        if self.acks_all_sent_as_acks_one {
            flags += " --acks-all-sent-as-acks-one";
        }
        if self.leave_a_broker_down {
            flags += " --leave-a-broker-down";
        }
        if self.wall_clock_jumps_during_cuts {
            flags += " --wall-clock-jumps-during-cuts";
        }
        if self.fenced_follower_during_cut {
            flags += " --fenced-follower-during-cut";
        }
        flags
    }
}

impl Default for ReplicatedOptions {
    fn default() -> ReplicatedOptions {
        ReplicatedOptions {
            brokers: 3,
            partitions: 3,
            producers: 3,
            chaos_ms: 10_000,
            settle_ms: SETTLE_GRACE_MS + 3_000,
            trace: false,
            acks_all_sent_as_acks_one: false,
            leave_a_broker_down: false,
            wall_clock_jumps_during_cuts: false,
            fenced_follower_during_cut: false,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicatedReport {
    pub requests: u64,
    pub acked_all: u64,
    pub acked_one: u64,
    /// Produce answers with an error (not leader, not enough replicas, ...).
    pub refused: u64,
    pub kills: u64,
    /// Brokers cut off from the others for a while.
    pub link_faults: u64,
    /// Brokers stopped (as by SIGSTOP) for a while.
    pub pauses: u64,
    /// Brokers whose disk turned slow for a while.
    pub slow_disks: u64,
    /// Brokers whose wall clock jumped.
    pub clock_jumps: u64,
    /// Connections reset (each end failing, what was in flight lost).
    pub connections_reset: u64,
    pub power_losses: u64,
    pub writes_torn: u64,
    /// Rounds the brokers' shard journals wrote.
    pub journal_rounds: u64,
    /// Chunk images written back from shard journals at brokers' starts.
    pub journal_writes_replayed: u64,
    /// Produce requests answered in the quiet period after the faults.
    pub quiet_answers: u64,
    /// Records read back after the whole cluster restarted.
    pub records_read_back: u64,
    /// Records the consumers were served while the faults went on.
    pub records_consumed: u64,
}

#[derive(Default)]
struct Model {
    /// acks=all acknowledgements, by partition and base offset.
    acked_all: BTreeMap<(i32, i64), Sent>,
    /// What consumers were served (below a leader's high watermark), by
    /// partition and base offset: committed, so as permanent as acks=all.
    served: BTreeMap<(i32, i64), Sent>,
    next_tag: u64,
    journal: Journal,
    report: ReplicatedReport,
    /// Which broker led each partition at each leader epoch, as observed.
    epoch_leaders: BTreeMap<(i32, LeaderEpoch), BrokerId>,
    /// A leader's latest observed epoch and high watermark, by process and
    /// partition (process numbers start over in each run: cleared then).
    leader_watermarks: BTreeMap<(u32, i32), (LeaderEpoch, Offset)>,
    /// From when every produce request must be answered promptly.
    quiet_from: Option<Duration>,
    /// Produce requests sent and not yet answered: partition and send time.
    in_flight: BTreeMap<u64, (i32, Duration)>,
    /// acks=all batches acknowledged in the quiet period, by partition.
    quiet_acked_all: BTreeMap<i32, u64>,
}

/// A running broker: its simulated process, its stop flag, its root task,
/// its wall clock (which the faults may jump) and its shard once made (which
/// the observer reads).
struct Running {
    process: u32,
    stop: Rc<Cell<bool>>,
    task: sim::SimTask<()>,
    clock: Rc<sim::SimClock>,
    shard: Rc<RefCell<Option<Rc<Shard>>>>,
}

/// A broker's fixed parts: its id, config (ports, data directory) and how
/// far its machine's wall clock is off (a jump outlives a restart).
struct BrokerSlot {
    id: u32,
    config: Rc<BrokerConfig>,
    clock_offset_ms: i64,
    running: Option<Running>,
}

struct Cluster {
    brokers: RefCell<Vec<BrokerSlot>>,
    next_process: Cell<u32>,
    control: Rc<ControlState>,
    partitions: u32,
    /// The disk every broker's start replays its shard journal onto.
    disk: sim::SimDisk,
    model: Rc<RefCell<Model>>,
}

impl Cluster {
    fn start(&self, index: usize) {
        let process = self.next_process.get();
        self.next_process.set(process + 1);
        let stop = Rc::new(Cell::new(false));
        let clock = Rc::new(sim::SimClock::new());
        clock.jump(self.brokers.borrow()[index].clock_offset_ms);
        let shard = Rc::new(RefCell::new(None));
        let config = self.brokers.borrow()[index].config.clone();
        let replayed = match crate::replay_journals_at_start(&config.data_dir, &self.disk) {
            Ok(replayed) => replayed,
            Err(e) => {
                self.model.borrow_mut().journal.violation(format!(
                    "broker {}: journal replay at start: {e}",
                    index + 1
                ));
                return;
            }
        };
        if replayed.records > 0 {
            let mut m = self.model.borrow_mut();
            m.report.journal_writes_replayed += replayed.writes as u64;
            m.journal.note(format!(
                "{:?}: broker {} replayed {} journal records, {} writes into {} files",
                sim::now(),
                index + 1,
                replayed.records,
                replayed.writes,
                replayed.files.len()
            ));
        }
        let task = sim::spawn_process(
            process,
            broker_process(
                config,
                stop.clone(),
                clock.clone(),
                shard.clone(),
                self.model.clone(),
            ),
        );
        self.brokers.borrow_mut()[index].running = Some(Running {
            process,
            stop,
            task,
            clock,
            shard,
        });
    }

    /// Starts the controller and every broker; how many brokers.
    fn start_all(&self) -> usize {
        sim::spawn_process(
            CONTROLLER_PROCESS,
            control_server::serve(self.control.clone()),
        )
        .detach();
        let brokers = self.brokers.borrow().len();
        for index in 0..brokers {
            self.start(index);
        }
        brokers
    }

    /// Brokers the controller counts as unfenced.
    fn unfenced(&self) -> usize {
        self.control
            .controller
            .borrow()
            .state
            .brokers()
            .filter(|b| !b.fenced)
            .count()
    }

    fn kill(&self, index: usize) {
        let running = self.brokers.borrow_mut()[index].running.take();
        if let Some(running) = running {
            sim::kill_process(running.process);
            running.task.detach();
        }
    }

    /// Each partition's leader epoch, as the controller has it.
    fn leader_epochs(&self) -> Vec<LeaderEpoch> {
        let controller = self.control.controller.borrow();
        controller
            .state
            .topic_by_name(TOPIC)
            .map(|topic| topic.partitions.iter().map(|p| p.leader_epoch).collect())
            .unwrap_or_default()
    }

    /// Running brokers whose shard holds a replica of every partition.
    fn brokers_with_every_replica(&self) -> usize {
        self.brokers
            .borrow()
            .iter()
            .filter_map(|slot| slot.running.as_ref()?.shard.borrow().clone())
            .filter(|shard| {
                (0..self.partitions as i32).all(|partition| {
                    shard
                        .replica_of(&PartitionKey {
                            topic: TOPIC.to_string(),
                            partition,
                        })
                        .is_some()
                })
            })
            .count()
    }

    fn jump_clock(&self, index: usize, delta_ms: i64) {
        let mut brokers = self.brokers.borrow_mut();
        let slot = &mut brokers[index];
        slot.clock_offset_ms += delta_ms;
        if let Some(running) = &slot.running {
            running.clock.jump(delta_ms);
        }
    }

    fn process_of(&self, index: usize) -> Option<u32> {
        self.brokers.borrow()[index]
            .running
            .as_ref()
            .map(|r| r.process)
    }

    /// The processes broker `index` talks to: the other live brokers, and
    /// the controller with `controller_too`.
    fn peers_of(&self, index: usize, controller_too: bool) -> Vec<u32> {
        let mut others: Vec<u32> = (0..self.brokers.borrow().len())
            .filter(|&i| i != index)
            .filter_map(|i| self.process_of(i))
            .collect();
        if controller_too {
            others.push(CONTROLLER_PROCESS);
        }
        others
    }

    /// Stops every broker cleanly; false if one has not finished within
    /// `CLOSE_MS_MAX`.
    async fn close_all(&self) -> bool {
        let running: Vec<Running> = self
            .brokers
            .borrow_mut()
            .iter_mut()
            .filter_map(|b| b.running.take())
            .collect();
        for r in &running {
            r.stop.set(true);
        }
        for r in running {
            if runtime::timeout(Duration::from_millis(CLOSE_MS_MAX), r.task)
                .await
                .is_none()
            {
                return false;
            }
        }
        true
    }

    /// Keeps `slot` connected to the partition's current leader: `Some(true)`
    /// when it was just (re)opened to a new one, `Some(false)` when it still
    /// leads, `None` (after a short wait) when no leader can be reached now.
    async fn follow_leader(
        &self,
        partition: i32,
        slot: &mut Option<(u32, PeerConnection)>,
    ) -> Option<bool> {
        let Some((leader, addr)) = self.leader_of(partition) else {
            runtime::sleep(Duration::from_millis(20)).await;
            return None;
        };
        if slot.as_ref().is_some_and(|(to, _)| *to == leader) {
            return Some(false);
        }
        *slot = PeerConnection::open(&addr.to_string(), RESPONSE_BYTES_MAX, REQUEST_MS_MAX)
            .await
            .ok()
            .map(|c| (leader, c));
        if slot.is_none() {
            runtime::sleep(Duration::from_millis(20)).await;
            return None;
        }
        Some(true)
    }

    /// The client address of the broker the controller names as the
    /// partition's leader, if it names a live one.
    fn leader_of(&self, partition: i32) -> Option<(u32, SocketAddr)> {
        let controller = self.control.controller.borrow();
        let topic = controller.state.topic_by_name(TOPIC)?;
        let leader = topic.partitions.get(partition as usize)?.leader?;
        let broker = controller.state.broker(leader)?;
        if broker.fenced {
            return None;
        }
        let brokers = self.brokers.borrow();
        let slot = brokers.iter().find(|b| BrokerId(b.id) == leader)?;
        Some((slot.id, slot.config.listen))
    }
}

fn flush_always(seed: u64) -> bool {
    seed % 3 != 2
}

/// Whether the brokers of seed `seed` commit through a shard journal, as a
/// broker does by default: half of the seeds under `always` (the others
/// sync their own files, as with `journal_ring_bytes_per_shard = 0`).
pub fn journal_used(seed: u64) -> bool {
    flush_always(seed) && (seed / 3).is_multiple_of(2)
}

/// A ring of 64 blocks: a few dozen commits wrap it and checkpoint.
const JOURNAL_RING_BYTES: u64 = 64 * 4096;

fn broker_config(seed: u64, id: u32, data: &Path) -> BrokerConfig {
    let port = 9_100 + 10 * id as u16;
    let log = FileLogConfig {
        segment_size_bytes: Some(64 << 10 << (seed % 3)),
        flush_policy: Some(if flush_always(seed) { "always" } else { "none" }.to_string()),
        ..FileLogConfig::default()
    };
    let file = FileConfig {
        node_id: Some(id as i32),
        data_dir: Some(data.join(format!("broker-{id}"))),
        listen: Some(format!("127.0.0.1:{port}")),
        admin_listen: Some(format!("127.0.0.1:{}", port + 5)),
        cores: Some(1),
        controller: Some(CONTROLLER_LISTEN.to_string()),
        replica_lag_time_max_ms: Some(REPLICA_LAG_TIME_MAX_MS),
        journal_ring_bytes_per_shard: Some(if journal_used(seed) {
            JOURNAL_RING_BYTES
        } else {
            0
        }),
        log: Some(log),
        ..FileConfig::default()
    };
    BrokerConfig::from_file_config(file).expect("the simulation's broker config is valid")
}

/// One broker process, as `server::run_shard` starts a shard: its shard
/// journal if it keeps one, controller links, then (once registered and
/// unfenced) listeners and maintenance, until `stop`, then a clean close
/// that empties the journal.
async fn broker_process(
    config: Rc<BrokerConfig>,
    stop: Rc<Cell<bool>>,
    clock: Rc<sim::SimClock>,
    observed: Rc<RefCell<Option<Rc<Shard>>>>,
    model: Rc<RefCell<Model>>,
) {
    let mut shard = Shard::new(0, 1, config.clone(), clock, Mesh::solo());
    let add_model = model.clone();
    let add_rounds = Box::new(move |rounds| add_model.borrow_mut().report.journal_rounds += rounds);
    let (journal, _counted) =
        match crate::attach_shard_journal(&config, &mut shard, add_rounds).await {
            Ok(attached) => attached.unzip(),
            Err(e) => {
                model
                    .borrow_mut()
                    .journal
                    .violation(format!("broker {}: {e}", config.node_id));
                return;
            }
        };
    let shard = Rc::new(shard);
    *observed.borrow_mut() = Some(shard.clone());
    let controllers = config.controllers.clone();
    let links = vec![
        runtime::spawn(controller_link::run_session(
            shard.clone(),
            controllers.clone(),
        )),
        runtime::spawn(controller_link::run_metadata(shard.clone(), controllers)),
    ];
    while !shard.is_serving() && !stop.get() {
        runtime::timeout(Duration::from_millis(50), shard.serving().wait_at_least(1)).await;
    }
    let mut tasks = Vec::new();
    for addr in [
        config.listen,
        SocketAddr::new(config.listen.ip(), config.shard_port(0)),
    ] {
        let listener = Listener::bind(addr).expect("a restarted broker finds its ports free");
        tasks.push(runtime::spawn(serve_listener(
            shard.clone(),
            listener,
            "sim",
        )));
    }
    tasks.push(runtime::spawn(shard.clone().run_maintenance()));
    while !stop.get() {
        runtime::sleep(Duration::from_millis(20)).await;
    }
    shard.stop();
    for link in links {
        link.cancel().await;
    }
    for task in tasks {
        task.await;
    }
    shard.close_all().await;
    if let Some(journal) = journal {
        if let Err(e) = journal.release_all().await {
            model.borrow_mut().journal.violation(format!(
                "broker {}: emptying the journal after a clean close: {e}",
                config.node_id
            ));
        }
    }
}

/// Runs one seed of the replicated simulation.
pub fn run(seed: u64, options: &ReplicatedOptions) -> Result<ReplicatedReport, SeedFailure> {
    assert!(
        options.settle_ms >= SETTLE_GRACE_MS + 2 * QUIET_ANSWER_MS_MAX,
        "settle_ms {} leaves no quiet period to check (at least {} ms)",
        options.settle_ms,
        SETTLE_GRACE_MS + 2 * QUIET_ANSWER_MS_MAX
    );
    crate::in_scratch_dir("replicated", seed, |root| run_in(seed, options, root))
}

fn run_in(
    seed: u64,
    options: &ReplicatedOptions,
    root: &Path,
) -> Result<ReplicatedReport, SeedFailure> {
    let model = Rc::new(RefCell::new(Model {
        journal: Journal {
            print: options.trace,
            ..Journal::default()
        },
        ..Model::default()
    }));
    let fail = |model: &Rc<RefCell<Model>>, violation: String| SeedFailure {
        mode: "replicated",
        seed,
        options: options.flags(),
        violation,
        trace: model.borrow().journal.trace.clone(),
    };
    let disk = sim::SimDisk::new();
    let data = root.join("data");
    std::fs::create_dir_all(&data).expect("data dir");
    disk.watch(&data, &root.join("shadow"))
        .expect("the simulated disk watches the data directory");
    let control = Rc::new(ControlState::new());
    let configs: Vec<Rc<BrokerConfig>> = (1..=options.brokers)
        .map(|id| Rc::new(broker_config(seed, id, &data)))
        .collect();
    model.borrow_mut().journal.note(format!(
        "seed {seed}: flush policy {}",
        if flush_always(seed) { "always" } else { "none" }
    ));
    // The first run: startup, the faults, then the settling period.
    let run_ms = options.run_ms();
    for life in 0..2u64 {
        let life_seed = seed.wrapping_mul(1_000_003).wrapping_add(life);
        let sim_config = sim::SimConfig {
            label: format!("replicated seed {seed}, life {life}"),
            start_wall_ms: 1_700_000_000_000 + life as i64 * 100_000,
            ..sim::SimConfig::new(life_seed)
        };
        let cluster = Rc::new(Cluster {
            brokers: RefCell::new(
                configs
                    .iter()
                    .enumerate()
                    .map(|(i, config)| BrokerSlot {
                        id: i as u32 + 1,
                        config: config.clone(),
                        clock_offset_ms: 0,
                        running: None,
                    })
                    .collect(),
            ),
            next_process: Cell::new(CONTROLLER_PROCESS + 1),
            control: control.clone(),
            partitions: options.partitions,
            disk: disk.clone(),
            model: model.clone(),
        });
        let (until, body): (
            Option<Duration>,
            std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>,
        ) = if life == 0 {
            (
                Some(Duration::from_millis(run_ms)),
                Box::pin(chaos_life(
                    cluster.clone(),
                    model.clone(),
                    options.clone(),
                    flush_always(seed).then(|| disk.clone()),
                )),
            )
        } else {
            (
                None,
                Box::pin(read_back_life(cluster.clone(), model.clone())),
            )
        };
        let outcome = sim::run(&sim_config, &disk, until, body);
        match outcome {
            Ok(()) => {}
            Err(sim::SimStop::TimeUp { now_ms, .. }) => {
                model.borrow_mut().journal.note(format!(
                    "life {life}: the whole cluster killed at {now_ms} ms"
                ));
            }
            Err(stop @ sim::SimStop::Stalled { .. }) => {
                return Err(fail(&model, format!("life {life}: {stop}")));
            }
        }
        if let Some(violation) = model.borrow().journal.violations.first() {
            return Err(fail(&model, violation.clone()));
        }
        control
            .base_ms
            .set(control.base_ms.get() + until.map_or(0, |u| u.as_millis() as u64) + 2_000);
        if life == 0 && flush_always(seed) && life_seed.is_multiple_of(2) {
            let loss = disk.power_loss(life_seed).expect("power loss applies");
            let mut m = model.borrow_mut();
            m.report.power_losses += 1;
            m.report.writes_torn += loss.writes_torn as u64;
            m.journal.note(format!("power loss {loss:?}"));
        }
    }
    for config in &configs {
        for partition in 0..options.partitions {
            let dir = partition_dir(&config.data_dir, TOPIC, partition as i32);
            // RF 3 on three brokers: every broker holds every partition.
            let problem = if dir.exists() {
                crate::verify_log(&dir)
            } else {
                Some("the replica directory is missing".to_string())
            };
            if let Some(problem) = problem {
                return Err(fail(
                    &model,
                    format!(
                        "verify-log on broker {} partition {partition}: {problem}",
                        config.node_id
                    ),
                ));
            }
        }
    }
    let report = model.borrow().report.clone();
    if report.acked_all == 0 {
        return Err(fail(&model, "no acks=all batch was acknowledged".into()));
    }
    Ok(report)
}

/// The first run: start the controller and every broker, make the topic,
/// then produce while brokers are killed and restarted one at a time, then
/// with all of them up, until the run's end kills them all.
/// `power_loss_disk`: the disk, when a killed broker may also lose power
/// (under `flush.policy=always`, where that loses nothing acknowledged).
async fn chaos_life(
    cluster: Rc<Cluster>,
    model: Rc<RefCell<Model>>,
    options: ReplicatedOptions,
    power_loss_disk: Option<sim::SimDisk>,
) {
    let brokers = cluster.start_all();
    let deadline = sim::now() + Duration::from_millis(STARTUP_MS_MAX);
    loop {
        let unfenced = cluster.unfenced();
        if unfenced == brokers {
            break;
        }
        if sim::now() > deadline {
            model.borrow_mut().journal.violation(format!(
                "only {unfenced} of {brokers} brokers unfenced at start"
            ));
            return;
        }
        runtime::sleep(Duration::from_millis(20)).await;
    }
    let created = cluster
        .control
        .controller
        .borrow_mut()
        .apply(Command::CreateTopic {
            name: TOPIC.to_string(),
            partition_count: cluster.partitions,
            replication_factor: brokers as u16,
            config: BTreeMap::from([("min.insync.replicas".to_string(), "2".to_string())]),
        });
    if let Err(e) = created {
        model
            .borrow_mut()
            .journal
            .violation(format!("topic refused: {e}"));
        return;
    }
    model
        .borrow_mut()
        .journal
        .note(format!("{:?}: topic made", sim::now()));
    model.borrow_mut().quiet_from = Some(options.quiet_from());
    for producer in 0..options.producers {
        runtime::spawn(produce(
            producer,
            cluster.clone(),
            model.clone(),
            options.acks_all_sent_as_acks_one,
        ))
        .detach();
    }
    for partition in 0..cluster.partitions as i32 {
        runtime::spawn(consume(partition, cluster.clone(), model.clone())).detach();
    }
    runtime::spawn(observe(cluster.clone(), model.clone())).detach();
    // One fault at a time, each undone before the next, all over by
    // `chaos_end` less 1.5 s.
    let chaos_end = options.chaos_end();
    let faults = Rc::new(Faults {
        cluster: cluster.clone(),
        model: model.clone(),
        power_loss_disk,
    });
    if options.wall_clock_jumps_during_cuts {
        clock_jumps_during_cuts(faults, brokers).await;
    } else if options.fenced_follower_during_cut {
        fenced_follower_during_cut(&faults).await;
    } else {
        drawn_faults(&faults, brokers, chaos_end).await;
    }
    let quiet_from = options.quiet_from();
    model.borrow_mut().journal.note(format!(
        "{:?}: faults over; settling, quiet from {quiet_from:?}",
        sim::now()
    ));
    if options.leave_a_broker_down {
        model
            .borrow_mut()
            .journal
            .note(format!("{:?}: kill -9 of broker 1, left down", sim::now()));
        cluster.kill(0);
    }
    // The quiet period's checks, just before the run's end kills the cluster.
    let check_at = Duration::from_millis(options.run_ms() - QUIET_ANSWER_MS_MAX / 2);
    runtime::sleep(check_at.saturating_sub(sim::now())).await;
    check_quiet(&cluster, &mut model.borrow_mut(), chaos_end, quiet_from);
    std::future::pending::<()>().await;
}

/// The scripted faults of `wall_clock_jumps_during_cuts`.
async fn clock_jumps_during_cuts(faults: Rc<Faults>, brokers: usize) {
    // Broker 1 cut off from the others, and 200 ms into the cut (its
    // followers' lag still under the bound) every wall clock five
    // minutes back; then broker 2 likewise with every clock five
    // minutes forward, while acks=all writes wait for it.
    for (index, jump_ms) in [(0, -300_000), (1, 300_000)] {
        runtime::sleep(Duration::from_millis(1_000)).await;
        let jumper = faults.clone();
        let jumps = runtime::spawn(async move {
            runtime::sleep(Duration::from_millis(200)).await;
            for index in 0..brokers {
                jumper.apply(Fault::ClockJump { jump_ms }, index, 0).await;
            }
        });
        let cut = Fault::Cut {
            controller_too: false,
        };
        faults.apply(cut, index, CUT_ISR_MS_MAX + 1_000).await;
        jumps.await;
    }
}

/// The scripted faults of `fenced_follower_during_cut`: broker 2 cut off
/// from the controller alone (so fenced and out of every ISR, yet still
/// fetching and caught up), then broker 1 cut off from the other brokers.
/// Where broker 3 leads, dropping broker 1 must not wait for broker 2.
async fn fenced_follower_during_cut(faults: &Faults) {
    runtime::sleep(Duration::from_millis(1_000)).await;
    let fenced = faults
        .cluster
        .process_of(1)
        .expect("every broker is up between faults");
    faults.note("broker 2 cut off from the controller alone until the next cut heals".to_string());
    set_link(
        fenced,
        CONTROLLER_PROCESS,
        Link {
            extra_delay_us: 0,
            cut: true,
        },
    );
    // Past its session, and the ISRs without it.
    runtime::sleep(Duration::from_millis(
        control_server::SESSION_TIMEOUT_MS + 1_000,
    ))
    .await;
    let cut = Fault::Cut {
        controller_too: false,
    };
    faults.apply(cut, 0, CUT_ISR_MS_MAX + 1_000).await;
}

/// Drawn faults, one at a time, each undone 1.5 s before `chaos_end` at the
/// latest.
async fn drawn_faults(faults: &Faults, brokers: usize, chaos_end: Duration) {
    loop {
        runtime::sleep(Duration::from_millis(200 + sim::random_below(1_300))).await;
        let index = sim::random_below(brokers as u64) as usize;
        let base_ms = 300 + sim::random_below(1_700);
        let fault = match sim::random_below(18) {
            0..=2 => Fault::Kill,
            3..=5 => Fault::SlowLinks,
            choice @ 6..=9 => Fault::Cut {
                controller_too: choice >= 8,
            },
            10..=11 => Fault::Pause,
            12..=13 => Fault::SlowDisk,
            14..=15 => {
                let jump_ms = 1_000 + sim::random_below(599_001) as i64;
                Fault::ClockJump {
                    jump_ms: if sim::random_below(2) == 0 {
                        jump_ms
                    } else {
                        -jump_ms
                    },
                }
            }
            _ => Fault::Reset,
        };
        let for_ms = base_ms + fault.extra_ms();
        if sim::now() + Duration::from_millis(for_ms + 1_500) >= chaos_end {
            break;
        }
        faults.apply(fault, index, for_ms).await;
    }
}

/// One fault of the first run, on one broker.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// kill -9, restarted after the fault's time (under `always`, half of
    /// them with a power loss of that broker alone).
    Kill,
    /// Its links to the other brokers slowed by 20–300 ms.
    SlowLinks,
    /// Cut off from the other brokers, and with `controller_too` from the
    /// controller as well, for longer than its session.
    Cut { controller_too: bool },
    /// Stopped, as by SIGSTOP, often past its session.
    Pause,
    /// Every direct-I/O file operation 5–200 ms slower.
    SlowDisk,
    /// Its wall clock moved by `jump_ms` (1 s to 10 min either way), for
    /// good.
    ClockJump { jump_ms: i64 },
    /// Every connection it has reset at once.
    Reset,
}

impl Fault {
    /// Added to the drawn 0.3–2 s: a cut from the controller and a pause
    /// last past the 1.5 s session, so the controller fences the broker and
    /// elects others while it still holds writes.
    fn extra_ms(self) -> u64 {
        match self {
            Fault::Cut {
                controller_too: true,
            } => 1_500,
            Fault::Pause => 1_000,
            _ => 0,
        }
    }
}

/// What the faults act on.
struct Faults {
    cluster: Rc<Cluster>,
    model: Rc<RefCell<Model>>,
    /// The disk, when a killed broker may also lose power (under
    /// `flush.policy=always`, where that loses nothing acknowledged).
    power_loss_disk: Option<sim::SimDisk>,
}

impl Faults {
    fn note(&self, line: String) {
        self.model
            .borrow_mut()
            .journal
            .note(format!("{:?}: {line}", sim::now()));
    }

    /// Applies `fault` to broker `index` for `for_ms`, and undoes it.
    async fn apply(&self, fault: Fault, index: usize, for_ms: u64) {
        let broker = index + 1;
        let process = self
            .cluster
            .process_of(index)
            .expect("every broker is up between faults");
        match fault {
            Fault::Kill => {
                self.note(format!("kill -9 of broker {broker}, back in {for_ms} ms"));
                self.cluster.kill(index);
                self.model.borrow_mut().report.kills += 1;
                if let Some(disk) = self.power_loss_disk.as_ref() {
                    if sim::random_below(2) == 0 {
                        let data_dir = self.cluster.brokers.borrow()[index].config.data_dir.clone();
                        let loss = disk
                            .power_loss_under(sim::random_below(u64::MAX), &data_dir)
                            .expect("a power loss applies");
                        self.note(format!("broker {broker} loses power: {loss:?}"));
                        let mut m = self.model.borrow_mut();
                        m.report.power_losses += 1;
                        m.report.writes_torn += loss.writes_torn as u64;
                    }
                }
                runtime::sleep(Duration::from_millis(for_ms)).await;
                self.cluster.start(index);
            }
            Fault::SlowLinks => {
                let extra_delay_us = 20_000 + sim::random_below(280_000);
                self.note(format!(
                    "broker {broker}'s links to the other brokers slowed by {} ms for {for_ms} ms",
                    extra_delay_us / 1_000
                ));
                for peer in self.cluster.peers_of(index, false) {
                    set_link(
                        process,
                        peer,
                        Link {
                            extra_delay_us,
                            cut: false,
                        },
                    );
                }
                runtime::sleep(Duration::from_millis(for_ms)).await;
                heal_all();
            }
            Fault::Cut { controller_too } => {
                self.note(format!(
                    "broker {broker} cut off from the other brokers{} for {for_ms} ms",
                    if controller_too {
                        " and the controller"
                    } else {
                        ""
                    }
                ));
                for peer in self.cluster.peers_of(index, controller_too) {
                    set_link(
                        process,
                        peer,
                        Link {
                            extra_delay_us: 0,
                            cut: true,
                        },
                    );
                }
                self.model.borrow_mut().report.link_faults += 1;
                let epochs_before = self.cluster.leader_epochs();
                runtime::sleep(Duration::from_millis(for_ms)).await;
                if !controller_too && for_ms > CUT_ISR_MS_MAX {
                    self.check_cut_isr(broker, for_ms, &epochs_before);
                }
                heal_all();
            }
            Fault::Pause => {
                self.note(format!("broker {broker} paused for {for_ms} ms"));
                sim::pause_process(process);
                self.model.borrow_mut().report.pauses += 1;
                runtime::sleep(Duration::from_millis(for_ms)).await;
                sim::resume_process(process);
            }
            Fault::SlowDisk => {
                // A follower's sync before it fetches again, a leader's
                // group commit: every one of them this much slower.
                let extra_us = 5_000 + sim::random_below(195_000);
                self.note(format!(
                    "broker {broker}'s disk slowed by {} ms per operation for {for_ms} ms",
                    extra_us / 1_000
                ));
                sim::set_disk_latency(process, extra_us);
                self.model.borrow_mut().report.slow_disks += 1;
                runtime::sleep(Duration::from_millis(for_ms)).await;
                sim::set_disk_latency(process, 0);
            }
            Fault::ClockJump { jump_ms } => {
                // Wall time feeds timestamps, retention, expiry; replica lag,
                // sessions and acks=all deadlines must not notice.
                self.note(format!(
                    "broker {broker}'s wall clock jumps by {jump_ms} ms"
                ));
                self.cluster.jump_clock(index, jump_ms);
                self.model.borrow_mut().report.clock_jumps += 1;
                runtime::sleep(Duration::from_millis(for_ms)).await;
            }
            Fault::Reset => {
                // To the other brokers, the controller and the clients
                // (process 0): a request may be applied with its answer lost.
                let mut others = self.cluster.peers_of(index, true);
                others.push(0);
                let reset: usize = others
                    .into_iter()
                    .map(|other| reset_connections(process, other))
                    .sum();
                self.note(format!("broker {broker}'s {reset} connections reset"));
                self.model.borrow_mut().report.connections_reset += reset as u64;
                runtime::sleep(Duration::from_millis(for_ms)).await;
            }
        }
    }

    /// At the end of a cut from the other brokers only (the controller still
    /// reachable) that outlasted `CUT_ISR_MS_MAX`: no ISR holds the cut
    /// broker together with another, since no one can be in sync across the
    /// cut. A leader that cannot tell a follower stopped fetching (its lag
    /// measured on a wall clock that jumped back) fails here.
    /// Partitions whose leader changed during the cut are skipped: a new
    /// leader counts every follower caught up when it starts.
    fn check_cut_isr(&self, broker: usize, for_ms: u64, epochs_before: &[LeaderEpoch]) {
        let cut = BrokerId(broker as u32);
        let controller = self.cluster.control.controller.borrow();
        let Some(topic) = controller.state.topic_by_name(TOPIC) else {
            return;
        };
        let mut m = self.model.borrow_mut();
        for (partition, state) in topic.partitions.iter().enumerate() {
            if epochs_before.get(partition) != Some(&state.leader_epoch) {
                continue;
            }
            if state.isr.contains(&cut) && state.isr.len() > 1 {
                m.journal.violation(format!(
                    "{:?}: partition {partition}'s ISR is {:?} (leader {:?}) after broker {broker} was cut off from the others for {for_ms} ms",
                    sim::now(),
                    state.isr,
                    state.leader
                ));
            }
        }
    }
}

/// At the end of the quiet period, with every broker up and no fault for a
/// while: every produce request sent in it has been answered within
/// `QUIET_ANSWER_MS_MAX` (answers are checked as they come), every partition
/// took acks=all writes, and the controller counts every broker in every
/// partition's ISR (a follower that cannot get back in is a stall waiting
/// for the next fault).
fn check_quiet(cluster: &Cluster, m: &mut Model, chaos_end: Duration, quiet_from: Duration) {
    let now = sim::now();
    let late: Vec<(u64, i32, Duration)> = m
        .in_flight
        .iter()
        .filter(|(_, &(_, sent))| {
            sent >= quiet_from && now - sent > Duration::from_millis(QUIET_ANSWER_MS_MAX)
        })
        .map(|(&tag, &(partition, sent))| (tag, partition, sent))
        .collect();
    for (tag, partition, sent) in late {
        m.journal.violation(format!(
            "quiet period: tag {tag} to partition {partition}, sent at {sent:?}, still unanswered at {now:?}"
        ));
    }
    let brokers = cluster.brokers.borrow().len();
    let controller = cluster.control.controller.borrow();
    let topic = controller
        .state
        .topic_by_name(TOPIC)
        .expect("the topic was made");
    for partition in 0..cluster.partitions as i32 {
        if m.quiet_acked_all.get(&partition).copied().unwrap_or(0) == 0 {
            m.journal.violation(format!(
                "quiet period: partition {partition} acknowledged no acks=all batch"
            ));
        }
        let state = &topic.partitions[partition as usize];
        if state.isr.len() != brokers {
            m.journal.violation(format!(
                "quiet period: partition {partition}'s ISR is {:?} (leader {:?}) at {now:?}, though all {brokers} brokers have been up, with every link, disk and connection healthy, since {chaos_end:?} at the latest",
                state.isr,
                state.leader
            ));
        }
    }
}

/// Every `OBSERVE_EVERY_MS`, the state of every live broker's replicas:
/// at most one broker leads a partition at any one leader epoch, and a
/// leader's high watermark never goes backwards while it leads at that
/// epoch.
async fn observe(cluster: Rc<Cluster>, model: Rc<RefCell<Model>>) {
    model.borrow_mut().leader_watermarks.clear();
    loop {
        {
            let brokers = cluster.brokers.borrow();
            let mut m = model.borrow_mut();
            for slot in brokers.iter() {
                let Some(running) = &slot.running else {
                    continue;
                };
                let Some(shard) = running.shard.borrow().clone() else {
                    continue;
                };
                for partition in 0..cluster.partitions as i32 {
                    let key = PartitionKey {
                        topic: TOPIC.to_string(),
                        partition,
                    };
                    let Some(replica) = shard.replica_of(&key) else {
                        continue;
                    };
                    let role = replica.role();
                    let at = (running.process, partition);
                    if !role.leader {
                        m.leader_watermarks.remove(&at);
                        continue;
                    }
                    let epoch = role.leader_epoch;
                    let hw = Offset(replica.high_watermark.get());
                    let me = BrokerId(slot.id);
                    let leader = *m.epoch_leaders.entry((partition, epoch)).or_insert(me);
                    if leader != me {
                        m.journal.violation(format!(
                            "{:?}: brokers {leader} and {me} both led partition {partition} at leader epoch {epoch}",
                            sim::now()
                        ));
                    }
                    if let Some((before_epoch, before_hw)) =
                        m.leader_watermarks.insert(at, (epoch, hw))
                    {
                        if before_epoch == epoch && hw < before_hw {
                            m.journal.violation(format!(
                                "{:?}: broker {}'s high watermark of partition {partition} went from {before_hw} back to {hw} at leader epoch {epoch}",
                                sim::now(),
                                slot.id
                            ));
                        }
                    }
                }
            }
        }
        runtime::sleep(Duration::from_millis(OBSERVE_EVERY_MS)).await;
    }
}

/// A producer: one batch at a time, acks=all (two in three) or acks=1, to
/// the partition's current leader; a batch whose answer does not come is
/// neither counted nor checked.
async fn produce(
    producer: u32,
    cluster: Rc<Cluster>,
    model: Rc<RefCell<Model>>,
    acks_all_sent_as_acks_one: bool,
) {
    let mut connections: BTreeMap<u32, PeerConnection> = BTreeMap::new();
    loop {
        runtime::sleep(Duration::from_micros(2_000 + sim::random_below(8_000))).await;
        let partition = sim::random_below(cluster.partitions as u64) as i32;
        let Some((leader, addr)) = cluster.leader_of(partition) else {
            runtime::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let connection = match connections.entry(leader) {
            std::collections::btree_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::btree_map::Entry::Vacant(entry) => {
                match PeerConnection::open(&addr.to_string(), RESPONSE_BYTES_MAX, REQUEST_MS_MAX)
                    .await
                {
                    Ok(c) => entry.insert(c),
                    Err(_) => {
                        runtime::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                }
            }
        };
        let count = 1 + sim::random_below(6) as u32;
        let acks: i16 = if sim::random_below(3) == 0 { 1 } else { -1 };
        let sent_at = sim::now();
        let tag = {
            let mut m = model.borrow_mut();
            m.next_tag += 1;
            m.report.requests += 1;
            let tag = m.next_tag;
            m.in_flight.insert(tag, (partition, sent_at));
            tag
        };
        let records = batch(tag, count);
        let wire_acks = if acks_all_sent_as_acks_one { 1 } else { acks };
        let body = produce_request(
            wire_acks,
            PRODUCE_TIMEOUT_MS as i32,
            &[ProduceEntry {
                topic: TOPIC,
                partition,
                batch: &records,
            }],
        );
        let answer = connection
            .call(
                ApiKey::Produce as u16,
                &body,
                &[&records],
                PRODUCE_TIMEOUT_MS,
            )
            .await;
        let answered_ms = (sim::now() - sent_at).as_millis();
        let quiet = {
            let mut m = model.borrow_mut();
            m.in_flight.remove(&tag);
            let quiet = m.quiet_from.is_some_and(|from| sent_at >= from);
            if quiet {
                m.report.quiet_answers += 1;
                if answered_ms > u128::from(QUIET_ANSWER_MS_MAX) {
                    m.journal.violation(format!(
                        "quiet period: tag {tag} (acks {acks}) to partition {partition} on broker {leader} answered after {answered_ms} ms"
                    ));
                }
            }
            quiet
        };
        let outcomes = match answer
            .map_err(|e| e.to_string())
            .and_then(|r| produce_response(r.body()).map_err(|e| e.to_string()))
        {
            Ok(outcomes) => outcomes,
            Err(e) => {
                let mut m = model.borrow_mut();
                let line = format!("producer {producer}: tag {tag} to broker {leader}: {e}");
                if quiet {
                    m.journal.violation(format!("quiet period: {line}"));
                } else {
                    m.journal.note(line);
                }
                connections.remove(&leader);
                continue;
            }
        };
        let mut m = model.borrow_mut();
        let [outcome] = &outcomes[..] else {
            m.journal.violation(format!(
                "producer {producer}: tag {tag} to partition {partition} answered with {} outcomes",
                outcomes.len()
            ));
            return;
        };
        {
            if outcome.error == ErrorCode::RequestTimedOut
                && answered_ms < u128::from(PRODUCE_TIMEOUT_MS)
            {
                // The request's own timeout, measured on simulated
                // (monotonic) time: earlier means a clock that jumped.
                m.journal.violation(format!(
                    "producer {producer}: tag {tag} (acks {acks}) to partition {partition} on broker {leader} timed out after {answered_ms} ms of its {PRODUCE_TIMEOUT_MS} ms"
                ));
            }
            if outcome.error != ErrorCode::None {
                let line = format!(
                    "{:?}: producer {producer}: tag {tag} (acks {acks}) to partition {partition} on broker {leader}: {:?}",
                    sim::now(),
                    outcome.error
                );
                if quiet {
                    m.journal.violation(format!("quiet period: {line}"));
                } else {
                    m.journal.note(line);
                }
                m.report.refused += 1;
                continue;
            }
            if outcome.partition != partition || outcome.base_offset < 0 {
                m.journal.violation(format!(
                    "producer {producer}: tag {tag} to partition {partition} acknowledged for partition {} at offset {}",
                    outcome.partition, outcome.base_offset
                ));
                return;
            }
            let sent = Sent { tag, count };
            if acks == 1 {
                m.report.acked_one += 1;
                continue;
            }
            m.report.acked_all += 1;
            if quiet {
                *m.quiet_acked_all.entry(partition).or_default() += 1;
            }
            let key = (partition, outcome.base_offset);
            m.journal.note(format!(
                "{:?}: acks=all {sent:?} at {key:?} from broker {leader}",
                sim::now()
            ));
            if let Some(before) = m.acked_all.insert(key, sent) {
                m.journal.violation(format!(
                    "partition {} offset {} acknowledged (acks=all) as {before:?} and as {sent:?}",
                    key.0, key.1
                ));
            }
            if let Some(served) = m.served.get(&key).copied() {
                if served != sent {
                    m.journal.violation(format!(
                        "partition {} offset {} acknowledged (acks=all) as {sent:?}, served as {served:?}",
                        key.0, key.1
                    ));
                }
            }
        }
    }
}

fn batch(tag: u64, count: u32) -> Vec<u8> {
    let compression = if tag.is_multiple_of(2) {
        Compression::None
    } else {
        Compression::Zstd
    };
    let timestamp_ms = 1_700_000_000_000 + sim::now().as_millis() as i64;
    crate::tagged::build(
        BatchBuilder::new(compression),
        tag,
        count as usize,
        80 + (tag % 5) as usize * 40,
        timestamp_ms,
    )
}

/// The second run: every broker restarts; once each partition has a live
/// leader, every partition is read back from it and every acks=all batch
/// must be there; then the brokers close cleanly.
async fn read_back_life(cluster: Rc<Cluster>, model: Rc<RefCell<Model>>) {
    let brokers = cluster.start_all();
    runtime::spawn(observe(cluster.clone(), model.clone())).detach();
    // Every broker back and unfenced, so each partition's leader is the one
    // the cluster settles on rather than the first to come back.
    let deadline = sim::now() + Duration::from_millis(READ_BACK_MS_MAX);
    loop {
        let unfenced = cluster.unfenced();
        let led = (0..cluster.partitions as i32).all(|p| cluster.leader_of(p).is_some());
        if unfenced == brokers && led {
            break;
        }
        if sim::now() >= deadline {
            // A broker that cannot come back would leave its replica
            // directories as the crash left them, unjudged by the read-back.
            let fenced: Vec<String> = cluster
                .control
                .controller
                .borrow()
                .state
                .brokers()
                .filter(|b| b.fenced)
                .map(|b| format!("{:?}", b.id))
                .collect();
            model.borrow_mut().journal.violation(format!(
                "read-back: {unfenced} of {brokers} brokers unfenced (fenced: {}) and every partition led: {led}, {READ_BACK_MS_MAX} ms after the restart",
                fenced.join(", ")
            ));
            return;
        }
        runtime::sleep(Duration::from_millis(20)).await;
    }
    for partition in 0..cluster.partitions as i32 {
        let wanted = {
            let m = model.borrow();
            let range = (partition, 0)..(partition + 1, 0);
            m.acked_all
                .range(range.clone())
                .chain(m.served.range(range))
                .map(|(&(_, base), sent)| sent.end(base))
                .max()
                .unwrap_or(0)
        };
        let deadline = sim::now() + Duration::from_millis(READ_BACK_MS_MAX);
        let mut found: BTreeMap<i64, Sent> = BTreeMap::new();
        let mut next = 0i64;
        let mut connection: Option<(u32, PeerConnection)> = None;
        while next < wanted && sim::now() < deadline {
            let Some(new_leader) = cluster.follow_leader(partition, &mut connection).await else {
                continue;
            };
            if new_leader {
                // The whole partition from one leader: a new one is read
                // from the start.
                found.clear();
                next = 0;
            }
            let (_, conn) = connection.as_mut().expect("connected to the leader");
            match fetch_from(conn, partition, next).await {
                Ok(Some(batches)) => {
                    for (base, sent) in batches {
                        found.insert(base, sent);
                        next = sent.end(base);
                    }
                }
                Ok(None) => runtime::sleep(Duration::from_millis(20)).await,
                Err(FetchFailure::AboveWatermark(e)) => {
                    model
                        .borrow_mut()
                        .journal
                        .violation(format!("read-back {partition}: {e}"));
                    return;
                }
                Err(FetchFailure::Transient(e)) => {
                    model
                        .borrow_mut()
                        .journal
                        .note(format!("read-back {partition}: {e}"));
                    connection = None;
                    runtime::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        let mut m = model.borrow_mut();
        m.report.records_read_back += found.values().map(|s| s.count as u64).sum::<u64>();
        let acked: Vec<((i32, i64), Sent)> = m
            .acked_all
            .range((partition, 0)..(partition + 1, 0))
            .map(|(&k, &s)| (k, s))
            .collect();
        for ((_, base), sent) in acked {
            match found.get(&base) {
                Some(got) if *got == sent => {}
                Some(got) => m.journal.violation(format!(
                    "read-back: partition {partition} offset {base} holds {got:?}, acknowledged (acks=all) {sent:?}"
                )),
                None => m.journal.violation(format!(
                    "read-back: acks=all batch {sent:?} at partition {partition} offset {base} is gone (read up to {next})"
                )),
            }
        }
        let served: Vec<(i64, Sent)> = m
            .served
            .range((partition, 0)..(partition + 1, 0))
            .map(|(&(_, base), &sent)| (base, sent))
            .collect();
        for (base, sent) in served {
            if found.get(&base) != Some(&sent) {
                m.journal.violation(format!(
                    "read-back: batch {sent:?} served at partition {partition} offset {base} below a high watermark is not there (found {:?}, read up to {next})",
                    found.get(&base)
                ));
            }
        }
    }
    // Every broker has opened (so recovered) every replica before the
    // close, so verify-log judges what recovery and the brokers left rather
    // than a directory as the crash left it.
    let deadline = sim::now() + Duration::from_millis(READ_BACK_MS_MAX);
    while cluster.brokers_with_every_replica() < brokers {
        if sim::now() >= deadline {
            model.borrow_mut().journal.violation(format!(
                "read-back: only {} of {brokers} brokers opened every replica within {READ_BACK_MS_MAX} ms",
                cluster.brokers_with_every_replica()
            ));
            return;
        }
        runtime::sleep(Duration::from_millis(20)).await;
    }
    // A clean close of every broker, so verify-log can judge the files.
    if !cluster.close_all().await {
        model.borrow_mut().journal.violation(format!(
            "a broker did not close within {CLOSE_MS_MAX} ms of its stop"
        ));
    }
}

/// A consumer of one partition: reads from whoever leads it, from offset 0
/// on, and records every batch it is served. A batch served at an offset
/// where another was served before is a committed offset that changed.
async fn consume(partition: i32, cluster: Rc<Cluster>, model: Rc<RefCell<Model>>) {
    let mut next = 0i64;
    let mut connection: Option<(u32, PeerConnection)> = None;
    loop {
        if cluster
            .follow_leader(partition, &mut connection)
            .await
            .is_none()
        {
            continue;
        }
        let (leader, conn) = connection.as_mut().expect("connected to the leader");
        let leader = *leader;
        match fetch_from(conn, partition, next).await {
            Ok(Some(batches)) => {
                let mut m = model.borrow_mut();
                for (base, sent) in batches {
                    if let Some(before) = m.served.insert((partition, base), sent) {
                        if before != sent {
                            m.journal.violation(format!(
                                "partition {partition} offset {base} served as {before:?}, later as {sent:?} by broker {leader}"
                            ));
                        }
                    }
                    if let Some(acked) = m.acked_all.get(&(partition, base)).copied() {
                        if acked != sent {
                            m.journal.violation(format!(
                                "partition {partition} offset {base} served as {sent:?} by broker {leader}, acknowledged (acks=all) as {acked:?}"
                            ));
                        }
                    }
                    m.report.records_consumed += sent.count as u64;
                    next = sent.end(base);
                }
            }
            Ok(None) => {}
            Err(FetchFailure::AboveWatermark(e)) => {
                model
                    .borrow_mut()
                    .journal
                    .violation(format!("consumer of {partition} from broker {leader}: {e}"));
                return;
            }
            Err(FetchFailure::Transient(e)) => {
                model.borrow_mut().journal.note(format!(
                    "{:?}: consumer of {partition} at {next} from broker {leader}: {e}",
                    sim::now()
                ));
                connection = None;
                runtime::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Why a fetch gave no batches.
enum FetchFailure {
    /// The connection, the leader or the answer's decoding: try again.
    Transient(String),
    /// A batch served above the high watermark the same answer gives: a
    /// consumer read what is not committed.
    AboveWatermark(String),
}

impl From<String> for FetchFailure {
    fn from(e: String) -> FetchFailure {
        FetchFailure::Transient(e)
    }
}

/// The batches a fetch of `partition` from `offset` returns (below the high
/// watermark), or `None` when there are none yet.
async fn fetch_from(
    connection: &mut PeerConnection,
    partition: i32,
    offset: i64,
) -> Result<Option<Vec<(i64, Sent)>>, FetchFailure> {
    let body = fetch_request(
        50,
        1,
        FETCH_BYTES_MAX,
        IsolationLevel::ReadUncommitted,
        &[FetchEntry {
            topic: TOPIC.to_string(),
            partition,
            fetch_offset: offset,
            max_bytes: FETCH_BYTES_MAX,
        }],
    );
    let response = connection
        .call(ApiKey::Fetch as u16, &body, &[], 50)
        .await
        .map_err(|e| e.to_string())?;
    let fetched =
        fetch_response(response.body(), &response.payload()).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for p in fetched {
        if p.error != ErrorCode::None {
            return Err(FetchFailure::Transient(format!("{:?}", p.error)));
        }
        let mut rest = &p.records[..];
        while !rest.is_empty() {
            let (batch, used) =
                RecordBatch::parse_prefix(rest, 1 << 24).map_err(|e| format!("batch: {e}"))?;
            rest = &rest[used..];
            let base = batch.header().base_offset.0;
            let sent = Sent::of(&batch)?;
            if sent.end(base) > p.high_watermark {
                return Err(FetchFailure::AboveWatermark(format!(
                    "served {sent:?} at offset {base} above the high watermark {} of the same answer",
                    p.high_watermark
                )));
            }
            out.push((base, sent));
        }
    }
    Ok((!out.is_empty()).then_some(out))
}
