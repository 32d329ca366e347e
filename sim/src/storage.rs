//! The storage simulation: the broker's own `PartitionLog`, unchanged, on the
//! runtime's deterministic executor and simulated disk (`runtime::sim`).
//! Appenders (idempotent producers that resend what got no answer, some of
//! whose clients go away mid-wait), the maintenance loop, readers and a
//! demoting replication layer (truncations) run as concurrent tasks whose
//! order a seed decides, through
//! several lives of one partition directory: each life ends in a kill -9 at a
//! drawn moment (every task dropped mid-flight) and, under
//! `flush.policy=always`, often in a power loss that drops or tears every
//! write not covered by a sync. The checker looks after every life: each
//! acknowledged record is back with its own bytes, nothing served differs
//! from what was written at that offset, no batch is in the log twice, a
//! duplicate is answered with its first copy's offsets, every acknowledgement wait ended
//! (answered or refused) within its deadline, and at the very end `verify-log`
//! finds the directory clean.
//!
//! Three seeds in four attach a small shard journal (`journal_used`), as a
//! broker does, so commits under `always` go through its ring (which wraps
//! and checkpoints every few hundred kilobytes); between lives the journal
//! is replayed into the segment files as a broker's start does, before the
//! log opens.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use broker::clock::Clock;
use broker::log::journal_replay::JOURNAL_DIR;
use broker::log::shard_journal::ShardJournal;
use broker::log::{FlushPolicy, LogConfig, LogError, PartitionLog};
use broker::runtime::{self, sim};
use protocol::{
    BatchBuilder, Compression, LeaderEpoch, Offset, ProducerEpoch, ProducerId, RecordBatch,
    Sequence,
};

/// How long an acknowledgement wait may take in simulated time before the
/// checker calls it hung (the log answers or refuses far sooner).
pub const ACK_WAIT_MS_MAX: u64 = 5_000;

#[derive(Clone, Debug)]
pub struct StorageOptions {
    pub lives: u32,
    pub appenders: u32,
    /// Each life is killed at a drawn moment up to this long.
    pub life_ms_max: u64,
    pub trace: bool,
    /// Cut the power under every flush policy, not only `always`: acks that
    /// wait only for the write must then be lost, which shows the checker
    /// sees losses (a self-test, never a product setting).
    pub power_loss_under_any_policy: bool,
    /// Delete the journal between lives instead of replaying it: acks that
    /// only the journal held must then be lost, which shows replay is what
    /// keeps them (a self-test).
    pub drop_journal: bool,
}

impl Default for StorageOptions {
    fn default() -> StorageOptions {
        StorageOptions {
            lives: 6,
            appenders: 3,
            life_ms_max: 400,
            trace: false,
            power_loss_under_any_policy: false,
            drop_journal: false,
        }
    }
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StorageReport {
    pub appended_batches: u64,
    pub acked_batches: u64,
    pub truncations: u64,
    pub power_losses: u64,
    pub writes_torn: u64,
    pub changes_lost: u64,
    /// Names a power loss removed or brought back because their directory
    /// had not been synced since they changed.
    pub names_reverted: u64,
    pub records_checked: u64,
    /// Resent batches the log answered as duplicates of their first copy.
    pub duplicates: u64,
    /// Commits made durable through the journal, and chunk images its
    /// replay wrote back between lives.
    pub journal_commits: u64,
    pub journal_writes_replayed: u64,
}

pub type StorageFailure = crate::tagged::SeedFailure;

/// One appended batch: which writer's which batch, and how many records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Written {
    tag: u64,
    count: usize,
}

/// An appender's idempotent producer: its epoch, its next sequence, and the
/// batch it sent without an answer, which it sends again, unchanged, until
/// the log acknowledges it (or refuses its sequence, when the producer moves
/// to a new epoch, as Kafka's does).
#[derive(Clone, Debug, Default)]
struct Producer {
    epoch: i16,
    next_sequence: i32,
    next_index: u64,
    unanswered: Option<Unanswered>,
}

#[derive(Clone, Copy, Debug)]
struct Unanswered {
    tag: u64,
    count: usize,
    value_bytes: usize,
    timestamp_ms: i64,
    epoch: i16,
    sequence: i32,
}

/// Producer ids of the appenders: writer `w` is `PRODUCER_ID_BASE + w`.
const PRODUCER_ID_BASE: i64 = 1_000;

/// What the checker knows across lives.
#[derive(Debug, Default)]
struct Model {
    /// Every batch the log took, by its unique tag: where it went.
    appended: std::collections::HashMap<u64, (i64, usize)>,
    /// Batches acknowledged and never cut by a truncation since, by base.
    acked: BTreeMap<i64, Written>,
    /// Truncation points in the order they were asked for; an append
    /// remembers how many it saw.
    cuts: Vec<i64>,
    /// A truncation is under way: an append that starts now cannot know
    /// whether the cut lands below it.
    truncating: bool,
    violations: Vec<String>,
    trace: Vec<String>,
    /// Print each trace line as it happens (`--trace`).
    print: bool,
    /// Each appender is an idempotent producer whose state outlives lives.
    producers: BTreeMap<u32, Producer>,
    report: StorageReport,
}

impl Model {
    fn note(&mut self, line: String) {
        if self.print {
            let at_ms = if sim::is_active() {
                sim::now().as_secs_f64() * 1e3
            } else {
                0.0
            };
            println!("{at_ms:>9.3} ms  {line}");
        }
        self.trace.push(line);
    }

    /// The lowest cut asked for after the first `seen` cuts.
    fn lowest_cut_since(&self, seen: usize) -> Option<i64> {
        self.cuts[seen..].iter().copied().min()
    }

    /// Whether `found` at `base` is a batch that was appended there.
    fn check_written(&self, base: i64, found: Written) -> Result<(), String> {
        match self.appended.get(&found.tag) {
            Some(&(at, count)) if at == base && count == found.count => Ok(()),
            other => Err(format!(
                "batch {found:?} found at {base}, but it was written as {other:?} (base, records)"
            )),
        }
    }
}

/// Whether seed `seed` runs its log with a shard journal attached.
pub fn journal_used(seed: u64) -> bool {
    (seed / 3) % 4 != 3
}

/// A ring of 64 blocks: every few dozen commits wrap it and checkpoint.
const JOURNAL_RING_BYTES: u64 = 64 * 4096;

fn config(seed: u64) -> LogConfig {
    let flush_policy = match seed % 3 {
        0 => FlushPolicy::IntervalMs(20),
        1 => FlushPolicy::None,
        _ => FlushPolicy::Always,
    };
    LogConfig {
        segment_size_bytes: 16 * 1024,
        index_interval_bytes: 512,
        write_chunk_bytes: 4096,
        unwritten_bytes_max: (1 << 20) + 4096,
        batch_bytes_max: 1 << 20,
        retention_ms: None,
        flush_policy,
        ..LogConfig::default()
    }
}

fn batch(writer: u32, sent: &Unanswered) -> Vec<u8> {
    let Unanswered {
        tag,
        count,
        value_bytes,
        timestamp_ms,
        epoch,
        sequence,
    } = *sent;
    let builder = BatchBuilder::new(if tag.is_multiple_of(2) {
        Compression::None
    } else {
        Compression::Zstd
    })
    .producer(
        ProducerId(PRODUCER_ID_BASE + writer as i64),
        ProducerEpoch(epoch),
        Sequence(sequence),
    );
    crate::tagged::build(builder, tag, count, value_bytes, timestamp_ms)
}

/// Base offset and tag of every batch in `bytes`, checking that each record
/// names its batch's tag and index.
fn decode(bytes: &[u8]) -> Result<Vec<(i64, Written)>, String> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let (batch, used) =
            RecordBatch::parse_prefix(rest, 1 << 24).map_err(|e| format!("served batch: {e}"))?;
        let (tag, count) = crate::tagged::read(&batch)?;
        out.push((batch.header().base_offset.0, Written { tag, count }));
        rest = &rest[used..];
    }
    Ok(out)
}

/// Runs one seed of the storage simulation.
pub fn run(seed: u64, options: &StorageOptions) -> Result<StorageReport, StorageFailure> {
    crate::in_scratch_dir("storage", seed, |root| run_in(seed, options, root))
}

fn run_in(
    seed: u64,
    options: &StorageOptions,
    root: &Path,
) -> Result<StorageReport, StorageFailure> {
    let model = Rc::new(RefCell::new(Model {
        print: options.trace,
        ..Model::default()
    }));
    let disk = sim::SimDisk::new();
    let data = root.join("data");
    // Directory entries are durable only once their directory is synced.
    disk.watch(&data, &root.join("shadow"))
        .expect("the simulated disk watches the data directory");
    // Where a broker keeps its logs, so the journal's replay finds it.
    let dir = data.join("topics").join("sim-0");
    let journaled = journal_used(seed);
    let policy = config(seed).flush_policy;
    let fail = |model: &Rc<RefCell<Model>>, violation: String| {
        let model = model.borrow();
        StorageFailure {
            mode: "storage",
            seed,
            options: String::new(),
            violation,
            trace: model.trace.clone(),
        }
    };
    let trace = |model: &Rc<RefCell<Model>>, line: String| model.borrow_mut().note(line);
    trace(
        &model,
        format!("seed {seed}: flush policy {policy:?}, journal {journaled}"),
    );
    for life in 0..options.lives {
        let life_seed = seed.wrapping_mul(1_000_003).wrapping_add(life as u64);
        let sim_config = sim::SimConfig {
            label: format!("storage seed {seed}, life {life}"),
            ..sim::SimConfig::new(life_seed)
        };
        let last = life + 1 == options.lives;
        let length_ms = 50 + life_seed % options.life_ms_max.max(1);
        // The last life, and one in four of the others, stops its workload
        // and closes cleanly (the next open then finds the clean-shutdown
        // marker, which a later power loss must not bring back); the others
        // run until the kill. Drawn from other bits than the power loss, so
        // a clean close is followed by one as often as a kill is.
        let close_after_ms = if last {
            Some(300)
        } else {
            (life_seed >> 1).is_multiple_of(4).then_some(length_ms / 2)
        };
        if journaled {
            if let Err(violation) = replay_between_lives(&data, &disk, &model, options) {
                return Err(fail(&model, format!("life {life}: {violation}")));
            }
        }
        let (m, d, o) = (model.clone(), dir.clone(), options.clone());
        let outcome = sim::run(
            &sim_config,
            &disk,
            Some(Duration::from_millis(if last { 60_000 } else { length_ms })),
            async move { one_life(seed, d, m, o, close_after_ms, journaled).await },
        );
        match outcome {
            Ok(()) => trace(&model, format!("life {life}: closed cleanly")),
            Err(sim::SimStop::TimeUp { now_ms, tasks }) if !last => {
                trace(
                    &model,
                    format!("life {life}: killed at {now_ms} ms with {tasks} tasks running"),
                );
                // A truncation the kill interrupted may have cut its files
                // already: what it was asked to remove may be gone.
                let mut m = model.borrow_mut();
                if m.truncating {
                    m.truncating = false;
                    let target = *m.cuts.last().expect("a truncation under way was asked for");
                    m.acked
                        .retain(|base, written| base + written.count as i64 <= target);
                    m.note(format!("a truncation to {target} was under way"));
                }
            }
            Err(stop) => {
                return Err(fail(&model, format!("life {life}: {stop}")));
            }
        }
        if let Some(violation) = model.borrow().violations.first() {
            return Err(fail(&model, violation.clone()));
        }
        let power_may_fail =
            matches!(policy, FlushPolicy::Always) || options.power_loss_under_any_policy;
        if !last && power_may_fail && life_seed.is_multiple_of(2) {
            let loss = disk.power_loss(life_seed).expect("power loss applies");
            let mut m = model.borrow_mut();
            m.report.power_losses += 1;
            m.report.writes_torn += loss.writes_torn as u64;
            m.report.changes_lost += loss.changes_lost as u64;
            m.report.names_reverted += loss.names_reverted as u64;
            drop(m);
            trace(&model, format!("life {life}: power loss {loss:?}"));
        }
    }
    // The files themselves, after the last clean close.
    if let Some(problem) = crate::verify_log(&dir) {
        return Err(fail(&model, format!("verify-log: {problem}")));
    }
    let report = model.borrow().report.clone();
    Ok(report)
}

/// What a broker's start does before any log opens: the journal's records
/// go back into their segment files (synced), and the ring is emptied.
fn replay_between_lives(
    data: &Path,
    disk: &sim::SimDisk,
    model: &Rc<RefCell<Model>>,
    options: &StorageOptions,
) -> Result<(), String> {
    let journal_dir = data.join(JOURNAL_DIR);
    if options.drop_journal {
        if journal_dir.exists() {
            std::fs::remove_dir_all(&journal_dir)
                .map_err(|e| format!("dropping the journal: {e}"))?;
        }
        return Ok(());
    }
    let report =
        crate::replay_journals_at_start(data, disk).map_err(|e| format!("journal replay: {e}"))?;
    let mut m = model.borrow_mut();
    m.report.journal_writes_replayed += report.writes as u64;
    m.note(format!(
        "journal replay: {} records, {} writes into {} files",
        report.records,
        report.writes,
        report.files.len()
    ));
    Ok(())
}

/// The shard journal of a life, attached to `log`; `None` once anything is
/// wrong (the violation is in the model).
async fn open_journal(data: &Path, model: &Rc<RefCell<Model>>) -> Option<Rc<ShardJournal>> {
    match ShardJournal::open(&data.join(JOURNAL_DIR), "shard-0", JOURNAL_RING_BYTES).await {
        Ok(journal) => Some(journal),
        Err(e) => {
            model
                .borrow_mut()
                .violations
                .push(format!("opening the journal: {e}"));
            None
        }
    }
}

/// One life: open (recovering), check what came back, then run the workload
/// until killed, or with `close_after_ms` stop it then, close, reopen and
/// check again (a kill may still come in the middle of that).
async fn one_life(
    seed: u64,
    dir: PathBuf,
    model: Rc<RefCell<Model>>,
    options: StorageOptions,
    close_after_ms: Option<u64>,
    journaled: bool,
) {
    let clock = Rc::new(sim::SimClock::new());
    let data = dir
        .parent()
        .and_then(Path::parent)
        .expect("the log lives under DATA/topics")
        .to_path_buf();
    let journal = if journaled {
        let Some(journal) = open_journal(&data, &model).await else {
            return;
        };
        Some(journal)
    } else {
        None
    };
    let Some(log) = open_and_check(&dir, seed, &clock, &model, "recovery").await else {
        return;
    };
    if let Some(journal) = &journal {
        if let Err(e) = log.attach_journal(journal.clone()).await {
            model
                .borrow_mut()
                .violations
                .push(format!("attaching the journal: {e}"));
            return;
        }
    }
    // Set to end the workload before a clean close: each loop stops between
    // two operations; a kill instead drops them all.
    let stop = Rc::new(std::cell::Cell::new(false));
    let mut tasks = Vec::new();
    for writer in 0..options.appenders {
        tasks.push(runtime::spawn(appender(
            writer,
            log.clone(),
            model.clone(),
            clock.clone(),
            stop.clone(),
        )));
    }
    {
        let (log, stop) = (log.clone(), stop.clone());
        tasks.push(runtime::spawn(async move {
            while !stop.get() {
                let _ = log.maintain().await;
                runtime::sleep(Duration::from_millis(1 + sim::random_below(8))).await;
            }
        }));
    }
    tasks.push(runtime::spawn(reader(
        log.clone(),
        model.clone(),
        stop.clone(),
    )));
    tasks.push(runtime::spawn(demoter(
        log.clone(),
        model.clone(),
        stop.clone(),
    )));
    if let Some(close_after_ms) = close_after_ms {
        // A workload, then a clean close and one more recovery.
        runtime::sleep(Duration::from_millis(close_after_ms)).await;
        stop.set(true);
        for task in tasks {
            task.await;
        }
        if let Err(e) = log.close().await {
            model.borrow_mut().violations.push(format!("close: {e}"));
            return;
        }
        model.borrow_mut().report.journal_commits += log.stats().journal_commits;
        drop(log);
        if let Some(log) = open_and_check(&dir, seed, &clock, &model, "reopen after close").await {
            if let Some(journal) = &journal {
                if let Err(e) = log.attach_journal(journal.clone()).await {
                    model
                        .borrow_mut()
                        .violations
                        .push(format!("attaching the journal again: {e}"));
                }
            }
            let _ = log.close().await;
        }
        // As a broker's clean shutdown: the closed log needs nothing the
        // ring holds (a kill from here on leaves it to the next replay).
        if let Some(journal) = &journal {
            if let Err(e) = journal.release_all().await {
                model
                    .borrow_mut()
                    .violations
                    .push(format!("emptying the journal: {e}"));
            }
        }
    } else {
        // Runs until the simulation kills it.
        std::future::pending::<()>().await;
        drop(tasks);
    }
}

/// Opens the log (recovering it) and checks what came back; `None` once
/// anything is wrong (the violation is in the model).
async fn open_and_check(
    dir: &Path,
    seed: u64,
    clock: &Rc<sim::SimClock>,
    model: &Rc<RefCell<Model>>,
    what: &str,
) -> Option<Rc<PartitionLog>> {
    let log = match PartitionLog::open(dir, config(seed), clock.clone()).await {
        Ok(log) => log,
        Err(e) => {
            model
                .borrow_mut()
                .violations
                .push(format!("{what} failed: {e}"));
            return None;
        }
    };
    check_recovered(&log, model).await;
    model.borrow().violations.is_empty().then_some(log)
}

/// Reads the recovered log from its start: every acknowledged batch must be
/// there with its own records; anything else must be a batch written at
/// that offset.
async fn check_recovered(log: &PartitionLog, model: &Rc<RefCell<Model>>) {
    let end = log.log_end_offset();
    let mut seen = BTreeMap::new();
    let mut next = log.log_start_offset();
    while next < end {
        match log.read(next, 64 * 1024, end).await {
            Ok(fetched) if fetched.batch_count > 0 => match decode(&fetched.bytes) {
                Ok(batches) => {
                    seen.extend(batches);
                    next = fetched.next_offset;
                }
                Err(e) => {
                    model
                        .borrow_mut()
                        .violations
                        .push(format!("recovered log at {next}: {e}"));
                    return;
                }
            },
            Ok(_) => {
                model.borrow_mut().violations.push(format!(
                    "recovered log makes no progress at {next} (end {end})"
                ));
                return;
            }
            Err(e) => {
                model
                    .borrow_mut()
                    .violations
                    .push(format!("read at {next}: {e}"));
                return;
            }
        }
    }
    let mut m = model.borrow_mut();
    m.report.records_checked += seen.values().map(|w| w.count as u64).sum::<u64>();
    let mut violations = Vec::new();
    for (base, written) in &m.acked {
        match seen.get(base) {
            Some(found) if found == written => {}
            other => violations.push(format!(
                "acknowledged batch {written:?} at {base} lost after recovery (found {other:?}, log end {end})"
            )),
        }
    }
    let mut tags = std::collections::HashMap::new();
    for (base, found) in &seen {
        if let Err(e) = m.check_written(*base, *found) {
            violations.push(format!("after recovery: {e}"));
        }
        if let Some(first) = tags.insert(found.tag, *base) {
            violations.push(format!(
                "batch {} is in the log twice, at {first} and {base}",
                found.tag
            ));
        }
    }
    let line = format!(
        "recovered: log end {end}, {} batches, {} acknowledged, {} segments, last at {:?}",
        seen.len(),
        m.acked.len(),
        log.segment_count(),
        log.segment_bases().last()
    );
    m.note(line);
    m.violations.extend(violations);
}

async fn appender(
    writer: u32,
    log: Rc<PartitionLog>,
    model: Rc<RefCell<Model>>,
    clock: Rc<sim::SimClock>,
    stop: Rc<std::cell::Cell<bool>>,
) {
    loop {
        if stop.get() {
            return;
        }
        runtime::sleep(Duration::from_micros(sim::random_below(3_000))).await;
        // The unanswered batch again, or a new one.
        let (sent, resent) = {
            let mut m = model.borrow_mut();
            let producer = m.producers.entry(writer).or_default();
            match producer.unanswered {
                Some(sent) => (sent, true),
                None => {
                    let count = 1 + sim::random_below(20) as usize;
                    let sent = Unanswered {
                        tag: (writer as u64) << 40 | producer.next_index,
                        count,
                        value_bytes: 1 + sim::random_below(600) as usize,
                        timestamp_ms: clock.now_ms(),
                        epoch: producer.epoch,
                        sequence: producer.next_sequence,
                    };
                    producer.next_index += 1;
                    producer.next_sequence += count as i32;
                    producer.unanswered = Some(sent);
                    (sent, false)
                }
            }
        };
        let (tag, count) = (sent.tag, sent.count);
        let bytes = batch(writer, &sent);
        let (cuts_before, truncating) = {
            let m = model.borrow();
            (m.cuts.len(), m.truncating)
        };
        let info = match log.append(&bytes, LeaderEpoch(1)).await {
            Ok(info) => info,
            Err(LogError::Sequence(e)) => {
                // Its earlier batches were cut (a truncation or a power loss
                // took unsynced ones): a new epoch starts again at 0.
                let mut m = model.borrow_mut();
                let producer = m.producers.entry(writer).or_default();
                producer.epoch += 1;
                producer.next_sequence = 0;
                producer.unanswered = None;
                m.note(format!(
                    "append {tag} refused ({e}); producer {writer} moves to a new epoch"
                ));
                continue;
            }
            Err(e) => {
                model
                    .borrow_mut()
                    .note(format!("append {tag} refused: {e}"));
                continue;
            }
        };
        let (base, end) = (info.base_offset.0, info.log_end_offset.0);
        let written = Written { tag, count };
        {
            let mut m = model.borrow_mut();
            m.report.appended_batches += 1;
            if info.duplicate {
                m.report.duplicates += 1;
                // The log's answer names the first copy; it must be where that
                // copy was written.
                match m.appended.get(&tag) {
                    Some(&(at, _)) if at != base => m.violations.push(format!(
                        "resent batch {tag} answered as a duplicate at {base}, but it was written at {at}"
                    )),
                    _ => {}
                }
            }
            m.appended.insert(tag, (base, count));
            let how = match (resent, info.duplicate) {
                (_, true) => "duplicate of",
                (true, false) => "resent",
                (false, false) => "append",
            };
            m.note(format!("{how} {tag} x{count} at {base}..{end}"));
        }
        // Now and then the client goes away while its request waits: the
        // connection's request tasks are dropped, cancelling the wait and any
        // write-out it was doing (whose submitted writes still land).
        if sim::random_below(8) == 0 {
            let gone_after = Duration::from_micros(sim::random_below(1_500));
            if runtime::timeout(gone_after, log.wait_for_ack(Offset(end)))
                .await
                .is_none()
            {
                model.borrow_mut().note(format!(
                    "client of {tag} at {base}..{end} gone before its ack"
                ));
                continue;
            }
        }
        let waited = runtime::timeout(
            Duration::from_millis(ACK_WAIT_MS_MAX),
            log.wait_for_ack(Offset(end)),
        )
        .await;
        let mut m = model.borrow_mut();
        match waited {
            None => m.violations.push(format!(
                "the acknowledgement wait for {tag} at {base}..{end} did not end within {ACK_WAIT_MS_MAX} ms (log end {})",
                log.log_end_offset()
            )),
            Some(Ok(())) => {
                // Acknowledged only if no cut reached it since it was appended:
                // the shard refuses those by the leader epoch, which the log
                // does not know.
                if !truncating && m.lowest_cut_since(cuts_before).is_none_or(|cut| cut >= end) {
                    m.acked.insert(base, written);
                    m.report.acked_batches += 1;
                    m.note(format!("acked {tag} at {base}..{end}"));
                    let producer = m.producers.entry(writer).or_default();
                    if producer.unanswered.is_some_and(|u| u.tag == tag) {
                        producer.unanswered = None;
                    }
                }
            }
            Some(Err(e)) => m.note(format!("ack of {tag} at {base}..{end} refused: {e}")),
        }
    }
}

/// Reads what is written, checking each batch against what was appended at
/// its offset, as a consumer of the written records would.
async fn reader(log: Rc<PartitionLog>, model: Rc<RefCell<Model>>, stop: Rc<std::cell::Cell<bool>>) {
    let mut next = log.log_start_offset();
    while !stop.get() {
        runtime::sleep(Duration::from_micros(200 + sim::random_below(5_000))).await;
        let cuts_before = model.borrow().cuts.len();
        let limit = Offset(log.written_offset().0);
        if next >= limit {
            next = next.min(limit);
            continue;
        }
        let Ok(fetched) = log.read(next, 16 * 1024, limit).await else {
            next = log.log_start_offset();
            continue;
        };
        let mut m = model.borrow_mut();
        if m.cuts.len() != cuts_before {
            // Raced a truncation: start again below the lowest cut.
            next = next.min(Offset(m.lowest_cut_since(cuts_before).unwrap_or(next.0)));
            continue;
        }
        match decode(&fetched.bytes) {
            Ok(batches) => {
                for (base, found) in batches {
                    if let Err(e) = m.check_written(base, found) {
                        m.violations.push(format!("read: {e}"));
                    }
                }
            }
            Err(e) => m.violations.push(format!("read at {next}: {e}")),
        }
        if fetched.batch_count > 0 {
            next = fetched.next_offset;
        }
    }
}

/// Now and then cuts the log's tail, as a leader that becomes a follower cuts
/// what its new leader does not have; acknowledgement waits above the cut
/// must end refused, not wait forever.
async fn demoter(
    log: Rc<PartitionLog>,
    model: Rc<RefCell<Model>>,
    stop: Rc<std::cell::Cell<bool>>,
) {
    loop {
        runtime::sleep(Duration::from_millis(20 + sim::random_below(200))).await;
        if stop.get() {
            return;
        }
        let end = log.log_end_offset().0;
        let start = log.log_start_offset().0;
        if end <= start {
            continue;
        }
        // Mostly a few records (a leader's unreplicated tail); now and then
        // deep enough to remove whole segments, whose unlinks a power loss
        // may undo unless the directory was synced.
        let depth_max = if sim::random_below(8) == 0 { 400 } else { 40 };
        let target = end - 1 - sim::random_below((end - start).min(depth_max) as u64) as i64;
        {
            let mut m = model.borrow_mut();
            m.cuts.push(target);
            m.truncating = true;
        }
        // Now and then the caller stops waiting (its task cancelled): the
        // cut must still run to its end, never stop halfway (the log's own
        // invariants stop the run if its watermarks and files disagree).
        let result = if sim::random_below(4) == 0 {
            let patience = Duration::from_micros(sim::random_below(2_000));
            match runtime::timeout(patience, log.truncate_to(Offset(target))).await {
                Some(result) => result,
                None => {
                    // The cut runs on as a task of its own, which has taken
                    // its place in the log's gate queue before simulated time
                    // moves (every ready task runs first). A cut to the end
                    // queues behind it, so once that one is done, so is the
                    // abandoned cut: all of it, since nothing stops it halfway.
                    runtime::sleep(Duration::from_millis(1)).await;
                    let _ = log.truncate_to(log.log_end_offset()).await;
                    let mut m = model.borrow_mut();
                    m.truncating = false;
                    m.acked
                        .retain(|base, written| base + written.count as i64 <= target);
                    m.report.truncations += 1;
                    m.note(format!(
                        "stopped waiting for the truncation to {target}; it ran on"
                    ));
                    continue;
                }
            }
        } else {
            log.truncate_to(Offset(target)).await
        };
        model.borrow_mut().truncating = false;
        match result {
            Ok(cut) => {
                let mut m = model.borrow_mut();
                // Rounded down to a batch start; everything from there is gone.
                let cut = cut.0.min(target);
                if let Some(last) = m.cuts.last_mut() {
                    *last = cut;
                }
                m.acked.retain(|base, _| *base < cut);
                m.report.truncations += 1;
                m.note(format!(
                    "truncated to {cut} (asked {target}, end was {end})"
                ));
            }
            Err(e) => model
                .borrow_mut()
                .note(format!("truncate to {target}: {e}")),
        }
    }
}
