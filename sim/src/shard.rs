//! The shard simulation: the broker's own `Shard` end to end (its listener and
//! connections, request decoding, the produce and fetch handlers, replicas,
//! maintenance and the partition log under them) on the runtime's
//! deterministic executor, simulated disk and simulated network, while
//! clients speak the wire protocol to it through the runtime's own peer
//! connections. Nothing of the shard is mirrored: what runs is what the
//! broker binary runs, minus the controller links (the metadata is the real
//! controller state machine's image, encoded and decoded by the real codec,
//! handed to the shard as its metadata link would).
//!
//! Each seed runs several lives of one data directory. A life starts the
//! shard (recovering its logs), reads every partition back through Fetch
//! and checks it against every acknowledgement so far, then runs producers
//! (acks=1 and acks=all) and a tailing consumer until a kill -9 at a drawn
//! moment, often followed by a power loss under `flush.policy=always`. The
//! last life closes cleanly; one more start reads everything back, and
//! `verify-log` must find each partition directory clean.
//!
//! Checked: every acknowledged batch comes back at its offset with its
//! records; no offset is acknowledged or read with two different values;
//! consumers never get records at or above the high watermark the same
//! answer gives. The executor fails the run on a stall, a waker pile-up
//! (what overflowed glommio's task reference count in the connection's
//! reader once) or a poll that never returns.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use broker::cluster_view::partition_dir;
use broker::config::{BrokerConfig, FileConfig, FileLogConfig};
use broker::net::serve_listener;
use broker::runtime::net::Listener;
use broker::runtime::peer::PeerConnection;
use broker::runtime::shards::Mesh;
use broker::runtime::{self, sim};
use broker::shard::Shard;
use client::messages::{
    fetch_request, fetch_response, produce_request, produce_response, FetchEntry, ProduceEntry,
    ProduceOutcome,
};
use client::IsolationLevel;
use controller::command::{Command, Outcome};
use controller::state::ClusterState;
use protocol::control::codec::{decode_fetch_metadata_response, encode_fetch_metadata_response};
use protocol::control::messages::{MetadataAnswer, MetadataUpdate};
use protocol::control::records::BrokerEndpoints;
use protocol::{ApiKey, BatchBuilder, BrokerId, Compression, ErrorCode, RecordBatch};

use crate::tagged::{Journal, Sent};

const TOPIC: &str = "sim";
const BROKER_ID: u32 = 1;
const LISTEN: &str = "127.0.0.1:9092";
const SHARD_LISTEN: &str = "127.0.0.1:9093";
/// Each request's bound beyond its own wait, as the clients set it.
const REQUEST_MS_MAX: u64 = 5_000;
const RESPONSE_BYTES_MAX: u32 = 16 << 20;
const FETCH_BYTES_MAX: i32 = 1 << 20;
/// How long a read-back may take before the check calls records missing.
const READ_BACK_MS_MAX: u64 = 10_000;
/// What a life that ends by itself may take beyond its workload: a start
/// with recovery, the read-back, draining connections, a clean close.
const CLOSING_LIFE_MS_MAX: u64 = 30_000;
/// Wall-clock milliseconds between the starts of two lives, so the broker's
/// wall clock moves forward across restarts as a real one does.
const LIFE_WALL_STEP_MS: i64 = 100_000;

#[derive(Clone, Debug)]
pub struct ShardOptions {
    pub lives: u32,
    /// Each life but the last is killed at a drawn moment up to this long.
    pub life_ms_max: u64,
    /// How long the last life runs its workload before closing cleanly.
    pub last_life_ms: u64,
    pub producers: u32,
    pub partitions: u32,
    pub trace: bool,
    /// Cut the power after kills under `flush.policy=none` too, where acks
    /// do not wait for a sync: the checker's self-test.
    pub power_loss_under_any_policy: bool,
}

impl ShardOptions {
    /// The `ringlog-sim` flags for what differs from the defaults.
    pub fn flags(&self) -> String {
        let default = ShardOptions::default();
        let mut flags = String::new();
        if self.partitions != default.partitions {
            flags += &format!(" --partitions {}", self.partitions);
        }
        if self.last_life_ms != default.last_life_ms {
            flags += &format!(" --last-life-ms {}", self.last_life_ms);
        }
        if self.power_loss_under_any_policy {
            flags += " --power-loss-under-any-policy";
        }
        flags
    }
}

impl Default for ShardOptions {
    fn default() -> ShardOptions {
        ShardOptions {
            lives: 4,
            life_ms_max: 2_000,
            last_life_ms: 1_500,
            producers: 3,
            partitions: 3,
            trace: false,
            power_loss_under_any_policy: false,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardReport {
    pub requests: u64,
    pub acked_batches: u64,
    pub kills: u64,
    pub power_losses: u64,
    pub writes_torn: u64,
    pub names_reverted: u64,
    /// Records read back from the restarted shard and checked.
    pub records_read_back: u64,
    /// Records the tailing consumer read and checked.
    pub records_consumed: u64,
    /// The most produce requests one connection carried.
    pub longest_connection_requests: u64,
    /// Rounds the shard journal wrote, over every life.
    pub journal_rounds: u64,
    /// Chunk images written back from the journal at the lives' starts.
    pub journal_writes_replayed: u64,
}

pub type ShardFailure = crate::tagged::SeedFailure;

#[derive(Default)]
struct Model {
    /// Every acknowledged batch, by partition and base offset.
    acked: BTreeMap<(i32, i64), Sent>,
    /// Every batch read below the high watermark, by partition and base offset.
    read: BTreeMap<(i32, i64), Sent>,
    next_tag: u64,
    journal: Journal,
    report: ShardReport,
}

impl Model {
    /// A produce answer for the batch `sent` to `partition`.
    fn answered(
        &mut self,
        producer: u32,
        partition: i32,
        sent: Sent,
        outcomes: Vec<ProduceOutcome>,
    ) {
        let [outcome] = &outcomes[..] else {
            self.journal.violation(format!(
                "producer {producer}: tag {} to partition {partition} answered with {} outcomes",
                sent.tag,
                outcomes.len()
            ));
            return;
        };
        // One replica, always its leader, and nothing else going wrong: no
        // produce may fail.
        if outcome.error != ErrorCode::None
            || outcome.partition != partition
            || outcome.base_offset < 0
        {
            self.journal.violation(format!(
                "producer {producer}: tag {} to partition {partition} answered {:?} for partition {} at offset {}",
                sent.tag, outcome.error, outcome.partition, outcome.base_offset
            ));
            return;
        }
        let key = (outcome.partition, outcome.base_offset);
        if let Some(before) = self.acked.insert(key, sent) {
            self.journal.violation(format!(
                "partition {} offset {} acknowledged twice: {before:?}, then {sent:?}",
                key.0, key.1
            ));
        }
        if let Some(read) = self.read.get(&key).copied() {
            if read != sent {
                self.journal.violation(format!(
                    "partition {} offset {} acknowledged as {sent:?}, read as {read:?}",
                    key.0, key.1
                ));
            }
        }
        self.report.acked_batches += 1;
    }

    /// A batch the shard served at `base` below its high watermark.
    fn served(&mut self, partition: i32, base: i64, sent: Sent, what: &str) {
        if let Some(acked) = self.acked.get(&(partition, base)) {
            if *acked != sent {
                self.journal.violation(format!(
                    "{what}: partition {partition} offset {base} holds {sent:?}, but {acked:?} was acknowledged there"
                ));
            }
        }
        match self.read.insert((partition, base), sent) {
            Some(before) if before != sent => self.journal.violation(format!(
                "{what}: partition {partition} offset {base} read as {sent:?}, earlier as {before:?}"
            )),
            _ => {}
        }
    }
}

/// Everything a life needs that does not change between lives.
struct Setup {
    config: Rc<BrokerConfig>,
    broker_epoch: u64,
    metadata: MetadataUpdate,
    partitions: u32,
    producers: u32,
    /// Power losses also hit a policy that does not sync: what was served
    /// may then be gone (the checker's self-test).
    served_may_vanish: bool,
}

/// Runs one seed of the shard simulation.
pub fn run(seed: u64, options: &ShardOptions) -> Result<ShardReport, ShardFailure> {
    crate::in_scratch_dir("shard", seed, |root| run_in(seed, options, root))
}

/// The flush policy a seed runs with: two seeds in three sync every
/// acknowledged write (and may lose power), the third leaves it to the
/// page cache (kills only).
fn flush_always(seed: u64) -> bool {
    seed % 3 != 2
}

/// Whether the shard of seed `seed` commits through a shard journal, as a
/// broker does by default: half of the seeds under `always` (the others
/// sync their own files, as with `journal_ring_bytes_per_shard = 0`).
pub fn journal_used(seed: u64) -> bool {
    flush_always(seed) && crate::draw(seed, 3).is_multiple_of(2)
}

/// A ring of 64 blocks: a few dozen commits wrap it and checkpoint.
const JOURNAL_RING_BYTES: u64 = 64 * 4096;

fn broker_config(seed: u64, data: &Path) -> BrokerConfig {
    let log = FileLogConfig {
        // Small segments, so lives roll, recover and read across several.
        segment_size_bytes: Some(64 << 10 << (crate::draw(seed, 1) % 3)),
        flush_policy: Some(if flush_always(seed) { "always" } else { "none" }.to_string()),
        ..FileLogConfig::default()
    };
    let file = FileConfig {
        node_id: Some(BROKER_ID as i32),
        data_dir: Some(data.to_path_buf()),
        listen: Some(LISTEN.to_string()),
        cores: Some(1),
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

/// The metadata the controller would publish once this broker registered
/// and the topic was made: from the real state machine and codec.
fn metadata(partitions: u32) -> (u64, MetadataUpdate) {
    let mut state = ClusterState::default();
    let mut apply = |command: Command| {
        let reply = state.apply(&command);
        reply
            .result
            .expect("the controller accepts the simulation's setup")
    };
    let broker_epoch = match apply(Command::RegisterBroker {
        broker_id: BrokerId(BROKER_ID),
        endpoints: BrokerEndpoints {
            client: LISTEN.to_string(),
            shards: vec![SHARD_LISTEN.to_string()],
        },
        now_ms: 0,
        // No session is kept in this simulation: the broker stays unfenced.
        session_timeout_ms: 600_000,
        incarnation_id: 1,
    }) {
        Outcome::BrokerRegistered { broker_epoch } => broker_epoch,
        other => panic!("RegisterBroker gave {other:?}"),
    };
    apply(Command::UnfenceBroker {
        broker_id: BrokerId(BROKER_ID),
        broker_epoch,
    });
    apply(Command::CreateTopic {
        name: TOPIC.to_string(),
        partition_count: partitions,
        replication_factor: 1,
        config: BTreeMap::from([("min.insync.replicas".to_string(), "1".to_string())]),
    });
    state.check_invariants();
    let encoded = encode_fetch_metadata_response(&Ok(MetadataAnswer::Image(state.image())));
    let update = decode_fetch_metadata_response(&encoded)
        .expect("the controller's own encoding decodes")
        .expect("an image, not a failure");
    (broker_epoch.0, update)
}

fn run_in(seed: u64, options: &ShardOptions, root: &Path) -> Result<ShardReport, ShardFailure> {
    let model = Rc::new(RefCell::new(Model {
        journal: Journal {
            print: options.trace,
            ..Journal::default()
        },
        ..Model::default()
    }));
    let fail = |model: &Rc<RefCell<Model>>, violation: String| {
        let model = model.borrow();
        ShardFailure {
            mode: "shard",
            seed,
            options: options.flags(),
            violation,
            trace: model.journal.trace.clone(),
        }
    };
    let disk = sim::SimDisk::new();
    let data = root.join("data");
    std::fs::create_dir_all(&data).expect("data dir");
    disk.watch(&data, &root.join("shadow"))
        .expect("the simulated disk watches the data directory");
    let (broker_epoch, metadata) = metadata(options.partitions);
    let setup = Rc::new(Setup {
        config: Rc::new(broker_config(seed, &data)),
        broker_epoch,
        metadata,
        partitions: options.partitions,
        producers: options.producers,
        served_may_vanish: options.power_loss_under_any_policy,
    });
    model.borrow_mut().journal.note(format!(
        "seed {seed}: flush policy {}{}",
        if flush_always(seed) { "always" } else { "none" },
        if journal_used(seed) {
            ", shard journal"
        } else {
            ""
        }
    ));
    // The lives with a workload, then one that only reads back.
    for life in 0..=options.lives {
        match crate::replay_journals_at_start(&data, &disk) {
            Ok(replayed) => {
                if replayed.records > 0 {
                    let mut m = model.borrow_mut();
                    m.report.journal_writes_replayed += replayed.writes as u64;
                    m.journal.note(format!(
                        "life {life}: replayed {} journal records, {} writes into {} files",
                        replayed.records,
                        replayed.writes,
                        replayed.files.len()
                    ));
                }
            }
            Err(e) => return Err(fail(&model, format!("life {life}: journal replay: {e}"))),
        }
        let life_seed = crate::draw(seed, 100 + life as u64);
        let sim_config = sim::SimConfig {
            label: format!("shard seed {seed}, life {life}"),
            start_wall_ms: 1_700_000_000_000 + life as i64 * LIFE_WALL_STEP_MS,
            ..sim::SimConfig::new(life_seed)
        };
        let check_only = life == options.lives;
        let last_workload = life + 1 == options.lives;
        // The lives that end by themselves get a bound too: running past it
        // (a hang behind timers that keep firing) is a failure, not a kill.
        let (until, close_after_ms) = if check_only {
            (Some(Duration::from_millis(CLOSING_LIFE_MS_MAX)), None)
        } else if last_workload {
            (
                Some(Duration::from_millis(
                    options.last_life_ms + CLOSING_LIFE_MS_MAX,
                )),
                Some(options.last_life_ms),
            )
        } else {
            (
                Some(Duration::from_millis(
                    100 + crate::draw(life_seed, 1) % options.life_ms_max.max(1),
                )),
                None,
            )
        };
        model.borrow_mut().journal.note(format!(
            "life {life}: until {until:?}, close after {close_after_ms:?}"
        ));
        let outcome = sim::run(
            &sim_config,
            &disk,
            until,
            one_life(setup.clone(), model.clone(), close_after_ms, check_only),
        );
        match outcome {
            Ok(()) => {}
            Err(sim::SimStop::TimeUp { now_ms, .. }) if close_after_ms.is_some() || check_only => {
                return Err(fail(
                    &model,
                    format!("life {life}: still running at {now_ms} ms, past its bound"),
                ));
            }
            Err(sim::SimStop::TimeUp { now_ms, .. }) => {
                let mut m = model.borrow_mut();
                m.report.kills += 1;
                m.journal
                    .note(format!("life {life}: killed at {now_ms} ms"));
            }
            Err(stop @ sim::SimStop::Stalled { .. }) => {
                return Err(fail(&model, format!("life {life}: {stop}")));
            }
        }
        if let Some(violation) = model.borrow().journal.violations.first() {
            return Err(fail(&model, violation.clone()));
        }
        let workload_killed = !check_only && !last_workload;
        let power_may_fail = flush_always(seed) || options.power_loss_under_any_policy;
        if workload_killed && power_may_fail && crate::draw(life_seed, 2).is_multiple_of(2) {
            let loss = disk.power_loss(life_seed).expect("power loss applies");
            let mut m = model.borrow_mut();
            m.report.power_losses += 1;
            m.report.writes_torn += loss.writes_torn as u64;
            m.report.names_reverted += loss.names_reverted as u64;
            m.journal.note(format!("life {life}: power loss {loss:?}"));
        }
    }
    for partition in 0..options.partitions {
        let dir = partition_dir(&data, TOPIC, partition as i32);
        if let Some(problem) = crate::verify_log(&dir) {
            return Err(fail(
                &model,
                format!("verify-log on partition {partition}: {problem}"),
            ));
        }
    }
    let report = model.borrow().report.clone();
    Ok(report)
}

/// One process life: start the shard as the broker does, read everything
/// back, then run the workload until killed (or, with `close_after_ms`,
/// stop it then and close cleanly).
async fn one_life(
    setup: Rc<Setup>,
    model: Rc<RefCell<Model>>,
    close_after_ms: Option<u64>,
    check_only: bool,
) {
    let clock = Rc::new(sim::SimClock::new());
    let mut shard = Shard::new(0, 1, setup.config.clone(), clock, Mesh::solo());
    let add_model = model.clone();
    let add_rounds = Box::new(move |rounds| add_model.borrow_mut().report.journal_rounds += rounds);
    let (journal, _counted) =
        match crate::attach_shard_journal(&setup.config, &mut shard, add_rounds).await {
            Ok(attached) => attached.unzip(),
            Err(e) => {
                model.borrow_mut().journal.violation(e);
                return;
            }
        };
    let shard = Rc::new(shard);
    shard.set_broker_epoch(setup.broker_epoch);
    if let Err(e) = shard.clone().publish_metadata(setup.metadata.clone()).await {
        model
            .borrow_mut()
            .journal
            .violation(format!("the shard refused its metadata: {e}"));
        return;
    }
    let listener = match Listener::bind(setup.config.listen) {
        Ok(listener) => listener,
        Err(e) => {
            model.borrow_mut().journal.violation(format!("bind: {e}"));
            return;
        }
    };
    let serving = runtime::spawn(serve_listener(shard.clone(), listener, "main"));
    let maintenance = runtime::spawn(shard.clone().run_maintenance());
    read_back(&setup, &model).await;
    let stop = Rc::new(Cell::new(false));
    let mut clients = Vec::new();
    if !check_only {
        for producer in 0..setup.producers {
            clients.push(runtime::spawn(produce(
                producer,
                setup.clone(),
                model.clone(),
                stop.clone(),
            )));
        }
        clients.push(runtime::spawn(consume(
            setup.clone(),
            model.clone(),
            stop.clone(),
        )));
    }
    if close_after_ms.is_none() && !check_only {
        // Runs until the simulation kills it.
        std::future::pending::<()>().await;
    }
    runtime::sleep(Duration::from_millis(close_after_ms.unwrap_or(0))).await;
    stop.set(true);
    for client in clients {
        client.await;
    }
    shard.stop();
    serving.await;
    maintenance.await;
    shard.close_all().await;
    if let Some(journal) = journal {
        // Every log closed synced: the next start finds nothing to replay.
        if let Err(e) = journal.release_all().await {
            model
                .borrow_mut()
                .journal
                .violation(format!("emptying the journal after a clean close: {e}"));
        }
    }
}

async fn connect() -> Option<PeerConnection> {
    PeerConnection::open(LISTEN, RESPONSE_BYTES_MAX, REQUEST_MS_MAX)
        .await
        .ok()
}

/// Reads every partition from offset 0 up to its high watermark through
/// Fetch, and checks every acknowledged batch is there.
async fn read_back(setup: &Setup, model: &Rc<RefCell<Model>>) {
    let Some(mut connection) = connect().await else {
        model
            .borrow_mut()
            .journal
            .violation("read-back: cannot connect to the restarted shard".into());
        return;
    };
    let deadline = sim::now() + Duration::from_millis(READ_BACK_MS_MAX);
    for partition in 0..setup.partitions as i32 {
        let mut found: BTreeMap<i64, Sent> = BTreeMap::new();
        let mut next = 0i64;
        // Wanted: the end of every batch acknowledged or served before.
        let wanted = {
            let m = model.borrow();
            let range = (partition, 0)..(partition + 1, 0);
            m.acked
                .range(range.clone())
                .chain(m.read.range(range))
                .map(|(&(_, base), sent)| sent.end(base))
                .max()
                .unwrap_or(0)
        };
        while next < wanted && sim::now() < deadline {
            match fetch_once(&mut connection, &[(partition, next)], 50).await {
                Err(e) => {
                    model
                        .borrow_mut()
                        .journal
                        .violation(format!("read-back fetch of partition {partition}: {e}"));
                    return;
                }
                Ok(answers) => {
                    for answer in answers {
                        if let Some(end) = check_answer(model, &answer, "read-back", &mut found) {
                            next = end;
                        }
                    }
                }
            }
        }
        let mut m = model.borrow_mut();
        m.report.records_read_back += found.values().map(|s| s.count as u64).sum::<u64>();
        let range = (partition, 0)..(partition + 1, 0);
        let acked: Vec<(i64, Sent)> = m
            .acked
            .range(range.clone())
            .map(|(&(_, base), &sent)| (base, sent))
            .collect();
        for (base, sent) in acked {
            match found.get(&base) {
                Some(got) if *got == sent => {}
                Some(got) => m.journal.violation(format!(
                    "read-back: partition {partition} offset {base} holds {got:?}, acknowledged {sent:?}"
                )),
                None => m.journal.violation(format!(
                    "read-back: acknowledged batch {sent:?} at partition {partition} offset {base} is gone after the restart (read up to {next})"
                )),
            }
        }
        // What consumers were served lay below the high watermark: as
        // durable as an acknowledgement, unless the power went under a
        // policy that does not sync (the self-test).
        let served: Vec<(i64, Sent)> = m
            .read
            .range(range)
            .map(|(&(_, base), &sent)| (base, sent))
            .collect();
        for (base, sent) in served {
            if found.get(&base) != Some(&sent) && !setup.served_may_vanish {
                m.journal.violation(format!(
                    "read-back: batch {sent:?} served at partition {partition} offset {base} below the high watermark is gone after the restart (read up to {next})"
                ));
            }
        }
        if setup.served_may_vanish {
            // Forget what is gone, so a later life judges the new log.
            let gone: Vec<(i32, i64)> = m
                .read
                .range((partition, 0)..(partition + 1, 0))
                .filter(|(&(_, base), sent)| found.get(&base) != Some(sent))
                .map(|(&k, _)| k)
                .collect();
            for key in gone {
                m.read.remove(&key);
            }
        }
    }
}

/// One partition's answer to a fetch, as the checks see it.
struct Answer {
    partition: i32,
    error: ErrorCode,
    high_watermark: i64,
    records: bytes::Bytes,
}

async fn fetch_once(
    connection: &mut PeerConnection,
    partitions: &[(i32, i64)],
    wait_ms: u64,
) -> Result<Vec<Answer>, String> {
    let entries: Vec<FetchEntry> = partitions
        .iter()
        .map(|&(partition, offset)| FetchEntry {
            topic: TOPIC.to_string(),
            partition,
            fetch_offset: offset,
            max_bytes: FETCH_BYTES_MAX,
        })
        .collect();
    let body = fetch_request(
        wait_ms as i32,
        1,
        FETCH_BYTES_MAX,
        IsolationLevel::ReadUncommitted,
        &entries,
    );
    let response = connection
        .call(ApiKey::Fetch as u16, &body, &[], wait_ms)
        .await
        .map_err(|e| e.to_string())?;
    let fetched =
        fetch_response(response.body(), &response.payload()).map_err(|e| e.to_string())?;
    Ok(fetched
        .into_iter()
        .map(|p| Answer {
            partition: p.partition,
            error: p.error,
            high_watermark: p.high_watermark,
            records: p.records,
        })
        .collect())
}

/// Checks one answer's batches (each below the answer's high watermark,
/// records in order of their tag) into `found` and the model; the offset
/// after the last batch, if any came.
fn check_answer(
    model: &Rc<RefCell<Model>>,
    answer: &Answer,
    what: &str,
    found: &mut BTreeMap<i64, Sent>,
) -> Option<i64> {
    if answer.error != ErrorCode::None {
        // One replica, always its leader: no fetch of it may fail.
        model.borrow_mut().journal.violation(format!(
            "{what}: partition {} answered {:?}",
            answer.partition, answer.error
        ));
        return None;
    }
    let mut rest = &answer.records[..];
    let mut end = None;
    while !rest.is_empty() {
        let (batch, used) = match RecordBatch::parse_prefix(rest, 1 << 24) {
            Ok(parsed) => parsed,
            Err(e) => {
                model
                    .borrow_mut()
                    .journal
                    .violation(format!("{what}: served batch does not parse: {e}"));
                return None;
            }
        };
        rest = &rest[used..];
        let base = batch.header().base_offset.0;
        let sent = match Sent::of(&batch) {
            Ok(sent) => sent,
            Err(e) => {
                model.borrow_mut().journal.violation(format!(
                    "{what}: partition {} offset {base}: {e}",
                    answer.partition
                ));
                return None;
            }
        };
        let batch_end = sent.end(base);
        if batch_end > answer.high_watermark {
            model.borrow_mut().journal.violation(format!(
                "{what}: partition {} served offsets {base}..{batch_end} with its high watermark at {}",
                answer.partition, answer.high_watermark
            ));
        }
        model
            .borrow_mut()
            .served(answer.partition, base, sent, what);
        found.insert(base, sent);
        end = Some(batch_end);
    }
    end
}

fn batch(tag: u64, count: u32, timestamp_ms: i64) -> Vec<u8> {
    let compression = if tag.is_multiple_of(2) {
        Compression::None
    } else {
        Compression::Zstd
    };
    let value_bytes = 100 + (tag % 7) as usize * 60;
    crate::tagged::build(
        BatchBuilder::new(compression),
        tag,
        count as usize,
        value_bytes,
        timestamp_ms,
    )
}

/// A producer on its own connection: one batch at a time to a drawn
/// partition, acks=1 or acks=all, each batch sent once (a batch whose answer
/// never comes is neither acknowledged nor checked for).
async fn produce(producer: u32, setup: Rc<Setup>, model: Rc<RefCell<Model>>, stop: Rc<Cell<bool>>) {
    let mut connection: Option<PeerConnection> = None;
    let mut carried = 0u64;
    while !stop.get() {
        let Some(conn) = connection.as_mut() else {
            connection = connect().await;
            carried = 0;
            if connection.is_none() {
                model
                    .borrow_mut()
                    .journal
                    .violation(format!("producer {producer}: cannot connect"));
                return;
            }
            continue;
        };
        let partition = sim::random_below(setup.partitions as u64) as i32;
        let count = 1 + sim::random_below(8) as u32;
        let acks: i16 = if sim::random_below(2) == 0 { 1 } else { -1 };
        let tag = {
            let mut m = model.borrow_mut();
            m.next_tag += 1;
            m.next_tag
        };
        let timestamp_ms = 1_700_000_000_000 + sim::now().as_millis() as i64;
        let records = batch(tag, count, timestamp_ms);
        let body = produce_request(
            acks,
            3_000,
            &[ProduceEntry {
                topic: TOPIC,
                partition,
                batch: &records,
            }],
        );
        carried += 1;
        {
            let mut m = model.borrow_mut();
            m.report.requests += 1;
            m.report.longest_connection_requests =
                m.report.longest_connection_requests.max(carried);
        }
        let answer = conn
            .call(ApiKey::Produce as u16, &body, &[&records], 3_000)
            .await;
        let outcomes = match answer {
            Err(e) => {
                // Only a kill ends a connection here, and a kill ends this
                // task with it: an error or a timeout is the shard's.
                model
                    .borrow_mut()
                    .journal
                    .violation(format!("producer {producer}: tag {tag}: {e}"));
                return;
            }
            Ok(response) => match produce_response(response.body()) {
                Ok(outcomes) => outcomes,
                Err(e) => {
                    model.borrow_mut().journal.violation(format!(
                        "producer {producer}: malformed produce answer: {e}"
                    ));
                    return;
                }
            },
        };
        model
            .borrow_mut()
            .answered(producer, partition, Sent { tag, count }, outcomes);
        runtime::sleep(Duration::from_micros(sim::random_below(2_000))).await;
    }
}

/// A consumer tailing every partition with long polls on one connection.
async fn consume(setup: Rc<Setup>, model: Rc<RefCell<Model>>, stop: Rc<Cell<bool>>) {
    let mut next: Vec<i64> = vec![0; setup.partitions as usize];
    // Starts at the end of what the read-back saw, so it tails.
    for (partition, slot) in next.iter_mut().enumerate() {
        *slot = model
            .borrow()
            .read
            .range((partition as i32, 0)..(partition as i32 + 1, 0))
            .map(|(&(_, base), sent)| sent.end(base))
            .max()
            .unwrap_or(0);
    }
    let mut connection: Option<PeerConnection> = None;
    while !stop.get() {
        let Some(conn) = connection.as_mut() else {
            connection = connect().await;
            if connection.is_none() {
                model
                    .borrow_mut()
                    .journal
                    .violation("consumer: cannot connect".into());
                return;
            }
            continue;
        };
        let wanted: Vec<(i32, i64)> = next
            .iter()
            .enumerate()
            .map(|(p, &offset)| (p as i32, offset))
            .collect();
        match fetch_once(conn, &wanted, 20).await {
            Err(e) => {
                model
                    .borrow_mut()
                    .journal
                    .violation(format!("consumer: {e}"));
                return;
            }
            Ok(answers) => {
                for answer in answers {
                    let mut found = BTreeMap::new();
                    if let Some(end) = check_answer(&model, &answer, "consumer", &mut found) {
                        next[answer.partition as usize] = end;
                    }
                    model.borrow_mut().report.records_consumed +=
                        found.values().map(|s| s.count as u64).sum::<u64>();
                }
            }
        }
    }
}
