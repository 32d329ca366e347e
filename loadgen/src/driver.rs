//! The network side of `ringlog-loadgen run`: open-loop producer workers and
//! consumers over the `client` crate's connections, the once-per-second
//! progress loop, the drain at the end, and the report.
//!
//! Producer workers batch per partition themselves (the same rules as the
//! client's `Producer`: a batch is sent when it reaches `batch_bytes` or is
//! `linger_ms` old; an idempotent worker keeps up to five batches in flight
//! per partition, as the client's `Accumulator` does, and retries them in
//! their send order) and send produce requests straight to each partition's
//! shard connection. This
//! keeps per-record work to building the record, so one worker can offer the
//! headline rate; every record's send time and ack time are still measured.
//! Consumers fetch from each partition's shard, decode every record and read
//! the send time from the payload header for end-to-end latency.
//!
//! Both ride through leader changes as a Kafka client does: a retriable
//! failure (leader moved, broker unreachable or silent, not enough replicas)
//! refreshes the metadata in the background and sends the same batch again,
//! to the new leader, until `delivery_timeout_ms`; consumers re-route each
//! partition to its current leader. The longest time any partition went
//! without an acknowledgement is reported as its unavailability.
//!
//! With `--transaction-ms` each worker writes in transactions
//! (`transactions.rs`) and consumers read committed records only.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use bytes::{Bytes, BytesMut};
use client::messages::{self, FetchEntry, ProduceEntry};
use client::{Admin, ClientConfig, Cluster, Connection, IsolationLevel};
use protocol::record_batch::{seal_crc, stamp_producer};
use protocol::{ApiKey, BatchBuilder, ErrorCode, ProducerEpoch, ProducerId, RecordBatch, Sequence};
use tokio::sync::mpsc;

use crate::consume::{
    record_consumed, wall_us, History, RideThroughCounters, FETCH_BYTES_MAX,
    FETCH_PARTITION_BYTES_MAX, FETCH_WAIT_MS, RETRY_BACKOFF_MS,
};
use crate::cpu::CpuSample;
use crate::group_consumers::{
    describe_committed_lags, FinishedGroup, GroupConsumers, GroupSummary,
};
use crate::histograms::{IntervalSummary, Phase, RunRecorder, WorkerStats};
use crate::keys::{derive_seed, KeyGenerator};
use crate::payload::{PayloadGenerator, PayloadHeader};
use crate::progress::format_progress_line;
use crate::run_config::{Acks, Compression, RunConfig};
use crate::schedule::{Clock, MonotonicClock, WorkerSchedule};
use crate::transactions::TxnCycle;
use crate::value_id::ValueId;
use crate::verify::{verify, HistoryRecord, VerifyReport};

/// Unsent bytes a producer worker holds before it stops generating; beyond
/// this the schedule falls behind and publish delay shows it.
pub const WORKER_BUFFER_BYTES_MAX: usize = 64 << 20;
/// Batches an idempotent worker keeps in flight per partition, as Kafka's
/// `max.in.flight.requests.per.connection` (5): the broker appends a
/// partition's batches in sequence order and answers a repeat of any of its
/// last five with the original offsets, so order holds across retries. One
/// batch per partition in flight caps a partition at a batch per round trip,
/// and a round trip includes the group commit's `fdatasync`. Without an
/// identity, one batch per partition keeps the order alone.
pub const IN_FLIGHT_BATCHES_PER_PARTITION_MAX: usize = 5;
/// A record's encoding beyond its key and value: length, attributes,
/// timestamp and offset deltas, key and value lengths and header count, as
/// varints.
const RECORD_OVERHEAD_BYTES_MAX: usize = 5 + 1 + 10 + 5 + 5 + 5 + 5;
/// Records built between two clock reads.
const CLOCK_READ_RECORDS: u64 = 64;
/// Records generated per loop turn when the rate is unlimited.
const UNPACED_CHUNK_RECORDS: u64 = 1_000;
/// How long the end of a run waits for acks and for consumers to catch up.
pub const DRAIN_MS_MAX: u64 = 30_000;
/// Produce request timeout handed to the broker: how long acks=all waits for
/// the ISR. Below the client's request timeout, so the broker answers first.
const PRODUCE_TIMEOUT_MS: i32 = 8_000;
/// The client's bound on any request: a silent (paused, partitioned) broker
/// costs at most this before the request is retried elsewhere.
pub(crate) const REQUEST_TIMEOUT_MS: u64 = 10_000;
/// Time the topic creation may take: above the broker's own bound on
/// waiting for every shard to serve a new topic (20 s).
const CREATE_TOPIC_TIMEOUT_MS: u64 = 30_000;
/// Bound on one broker's metadata answer before the next is asked.
const METADATA_TIMEOUT_MS: u64 = 1_000;
/// How long consumers keep asking for a partition's start position while its
/// leader answers with a retriable error (a new topic not yet opened there).
const START_POSITION_MS_MAX: u64 = 15_000;
/// Pause between those tries.
const START_RETRY_BACKOFF_MS: u64 = 50;
/// Bound on one consumer fetch round trip (the fetch itself waits 100 ms).
const FETCH_ROUND_TRIP_MS_MAX: u64 = 3_000;

/// What a run produced, for the report and the exit code.
#[derive(Debug)]
pub struct RunOutcome {
    pub recorder: RunRecorder,
    /// With consumer groups: each group checked against every ack on its
    /// own, the counts added up (clean only if every group is).
    pub verify: Option<VerifyReport>,
    /// With `verify`: every acknowledged and every consumed record (with
    /// consumer groups, each group's reads one after the other).
    pub acked: Vec<HistoryRecord>,
    pub consumed: Vec<HistoryRecord>,
    /// With `--consumer-group`: one summary per group, in order.
    pub groups: Vec<GroupSummary>,
    /// The longest any partition went without an acknowledgement while
    /// producers were sending (its unavailability as a producer sees it).
    pub longest_ack_gap_ms: u64,
    /// Batches sent again after a retriable failure.
    pub retried_batches: u64,
    /// Partition-level fetch errors consumers rode through.
    pub fetch_errors: u64,
}

/// Per partition: when it was last acknowledged, and the longest gap seen.
#[derive(Debug, Default)]
struct AckGaps {
    partitions: Mutex<Vec<(u64, u64)>>,
}

impl AckGaps {
    fn new(partitions: usize, start_ns: u64) -> AckGaps {
        AckGaps {
            partitions: Mutex::new(vec![(start_ns, 0); partitions]),
        }
    }

    fn on_ack(&self, partition: usize, now_ns: u64) {
        let mut partitions = self.partitions.lock().expect("gaps lock");
        let (last, longest) = &mut partitions[partition];
        *longest = (*longest).max(now_ns.saturating_sub(*last));
        *last = (*last).max(now_ns);
    }

    /// The longest gap, counting each partition's silence up to `end_ns`.
    fn longest_ms(&self, end_ns: u64) -> u64 {
        let partitions = self.partitions.lock().expect("gaps lock");
        let longest = partitions
            .iter()
            .map(|(last, longest)| (*longest).max(end_ns.saturating_sub(*last)))
            .max()
            .unwrap_or(0);
        longest / 1_000_000
    }
}

/// Refreshes cluster metadata in the background, one refresh at a time, so
/// a worker that saw a leader move never waits on it.
#[derive(Clone)]
struct MetadataRefresher {
    cluster: Cluster,
    running: Arc<AtomicBool>,
}

impl MetadataRefresher {
    fn new(cluster: Cluster) -> MetadataRefresher {
        MetadataRefresher {
            cluster,
            running: Arc::new(AtomicBool::new(false)),
        }
    }

    fn request(&self) {
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let (cluster, running) = (self.cluster.clone(), self.running.clone());
        tokio::spawn(async move {
            let _ = cluster.refresh_metadata().await;
            running.store(false, Ordering::Release);
        });
    }
}

/// Runs the whole workload on a tokio runtime with `threads` worker threads,
/// pinned to `config.cpus` in turn when it names any.
pub fn run_blocking(config: RunConfig, threads: usize) -> anyhow::Result<RunOutcome> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .on_thread_start(crate::pinning::pin_workers(config.cpus.clone(), threads))
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(run(Arc::new(config)))
}

async fn ensure_topic(config: &RunConfig, cluster: &Cluster) -> anyhow::Result<()> {
    // A broker answers a creation once every shard serves it, which for
    // thousands of partitions takes longer than a produce may.
    let admin_cluster = Cluster::connect(
        &config.bootstrap.join(","),
        ClientConfig {
            request_timeout_ms: CREATE_TOPIC_TIMEOUT_MS,
            metadata_timeout_ms: METADATA_TIMEOUT_MS,
            ..ClientConfig::default()
        },
    )
    .await
    .context("connecting to the cluster")?;
    let admin = Admin::from_cluster(admin_cluster);
    let exists = admin
        .list_topics()
        .await?
        .iter()
        .any(|t| t.name == config.topic);
    if !exists {
        let rf = i16::try_from(config.replication_factor).context("replication factor")?;
        match admin
            .create_topic(
                &config.topic,
                config.partitions as i32,
                rf,
                &config.topic_configs,
            )
            .await
        {
            Ok(()) => {}
            Err(client::ClientError::Broker {
                code: ErrorCode::TopicAlreadyExists,
                ..
            }) => {}
            // Accepted, still opening on some shard (thousands of
            // partitions): the metadata wait below sees it through.
            Err(client::ClientError::Broker {
                code: ErrorCode::RequestTimedOut,
                ..
            }) => {}
            Err(e) => return Err(e).context("creating the topic"),
        }
    }
    let topic = cluster
        .topic(&config.topic, 20)
        .await
        .context("topic metadata")?;
    if topic.partition_count() != config.partitions as usize {
        bail!(
            "topic {} has {} partitions, the run asks for {}",
            config.topic,
            topic.partition_count(),
            config.partitions
        );
    }
    Ok(())
}

async fn run(config: Arc<RunConfig>) -> anyhow::Result<RunOutcome> {
    let client_config = ClientConfig {
        request_timeout_ms: REQUEST_TIMEOUT_MS,
        metadata_timeout_ms: METADATA_TIMEOUT_MS,
        ..ClientConfig::default()
    };
    let cluster = Cluster::connect(&config.bootstrap.join(","), client_config.clone())
        .await
        .context("connecting to the cluster")?;
    ensure_topic(&config, &cluster).await?;
    let refresher = MetadataRefresher::new(cluster.clone());
    let clock = MonotonicClock::new();
    let acked: Option<History> = config.verify.then(Default::default);
    let counters = Arc::new(RideThroughCounters::default());
    let members = config.consumers as usize * config.consumer_group_count as usize;
    let consumer_stats: Vec<Arc<Mutex<WorkerStats>>> = (0..members)
        .map(|_| Arc::new(Mutex::new(WorkerStats::new())))
        .collect();
    // Consumers have connections of their own, as separate clients do: a
    // read_committed fetch waiting for a commit must not hold up, on a
    // shared connection, the produce answers that commit waits for.
    let consumer_cluster = Cluster::connect(&config.bootstrap.join(","), client_config)
        .await
        .context("connecting the consumers")?;
    // Consumers are at the log end (and groups stable) before any producer
    // sends; with `catch_up` they read from there once the warmup is over.
    let (open_gate, gate) = tokio::sync::watch::channel(!config.catch_up);
    let consumers = Consumers::start(
        &config,
        &consumer_cluster,
        &consumer_stats,
        &counters,
        &gate,
    )
    .await?;

    let start_ns = clock.now_ns();
    let warmup = Duration::from_millis(config.warmup_ms);
    tokio::spawn(async move {
        tokio::time::sleep(warmup).await;
        open_gate.send_replace(true);
    });
    let warmup_end_ns = start_ns + config.warmup_ms * 1_000_000;
    let end_ns = warmup_end_ns + config.duration_ms * 1_000_000;
    let gaps = Arc::new(AckGaps::new(config.partitions as usize, start_ns));
    let producer_stats: Vec<Arc<Mutex<WorkerStats>>> = (0..config.producers)
        .map(|_| Arc::new(Mutex::new(WorkerStats::new())))
        .collect();
    let mut producer_tasks = Vec::new();
    for (index, stats) in producer_stats.iter().enumerate() {
        let worker = ProducerWorker::new(
            WorkerShared {
                config: config.clone(),
                cluster: cluster.clone(),
                refresher: refresher.clone(),
                clock,
                stats: stats.clone(),
                acked: acked.clone(),
                gaps: gaps.clone(),
                counters: counters.clone(),
            },
            index as u32,
            start_ns,
            end_ns,
        )?;
        producer_tasks.push(tokio::spawn(worker.run()));
    }

    let mut recorder = RunRecorder::new(config.consumer_groups());
    let all_stats: Vec<Arc<Mutex<WorkerStats>>> = producer_stats
        .iter()
        .chain(&consumer_stats)
        .cloned()
        .collect();
    let mut last_ns = start_ns;
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.tick().await;
    let mut producers_done = false;
    let mut drain_deadline_ns = u64::MAX;
    // CPU is read at the first measured tick and when the schedule ends.
    let mut cpu_at_measure_start: Option<CpuSample> = None;
    loop {
        ticker.tick().await;
        let now_ns = clock.now_ns();
        let phase = if now_ns <= warmup_end_ns {
            Phase::Warmup
        } else {
            Phase::Measure
        };
        if phase == Phase::Measure && cpu_at_measure_start.is_none() && !producers_done {
            cpu_at_measure_start = CpuSample::read();
        }
        let summary = take_interval(
            &mut recorder,
            &all_stats,
            now_ns - start_ns,
            now_ns - last_ns,
            phase,
        );
        last_ns = now_ns;
        crate::say!("{}", format_progress_line(&summary, phase == Phase::Warmup));
        if !producers_done && producer_tasks.iter().all(|t| t.is_finished()) {
            producers_done = true;
            let cpu_at_end = CpuSample::read();
            recorder.set_cpu(
                cpu_at_measure_start
                    .zip(cpu_at_end)
                    .and_then(|(start, end)| start.until(&end)),
            );
            drain_deadline_ns = now_ns + DRAIN_MS_MAX * 1_000_000;
        }
        if producers_done
            && (consumers.caught_up(&recorder_totals(&recorder)) || now_ns >= drain_deadline_ns)
        {
            break;
        }
    }
    for task in producer_tasks {
        task.await.context("producer task")??;
    }
    let mut finished = consumers.finish().await?;
    let now_ns = clock.now_ns();
    if now_ns > last_ns {
        take_interval(
            &mut recorder,
            &all_stats,
            now_ns - start_ns,
            now_ns - last_ns,
            Phase::Measure,
        );
    }
    if let FinishedConsumers::Groups(groups) = &mut finished {
        describe_committed_lags(&cluster, &config.topic, groups).await;
    }
    let acked = acked.map_or_else(Vec::new, |h| {
        std::mem::take(&mut *h.lock().expect("history"))
    });
    let checked = check_consumed(&config, &acked, finished)?;
    Ok(RunOutcome {
        recorder,
        verify: checked.verify,
        acked,
        consumed: checked.consumed,
        groups: checked.groups,
        longest_ack_gap_ms: gaps.longest_ms(end_ns.min(now_ns)),
        retried_batches: counters.retried_batches.load(Ordering::Relaxed),
        fetch_errors: counters.fetch_errors.load(Ordering::Relaxed),
    })
}

/// The run's consumers: the load generator's own tasks, each with a fixed
/// share of the partitions (one logical group), or members of consumer
/// groups (`--consumer-group`).
enum Consumers {
    Assigned {
        tasks: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
        stop: Arc<AtomicBool>,
        /// One history per logical group, with `verify`.
        consumed: Vec<History>,
        /// Logical groups, each reading the whole topic.
        groups: u64,
    },
    Groups(GroupConsumers),
}

/// What the consumers read, once stopped.
enum FinishedConsumers {
    /// One history per logical group (none without `verify`).
    Assigned(Vec<Vec<HistoryRecord>>),
    Groups(Vec<FinishedGroup>),
}

impl Consumers {
    /// Starts the consumers; returns once each reads from the log end (for
    /// groups: once every group is stable). The load generator's own
    /// consumers fetch once `gate` holds true.
    async fn start(
        config: &Arc<RunConfig>,
        cluster: &Cluster,
        stats: &[Arc<Mutex<WorkerStats>>],
        counters: &Arc<RideThroughCounters>,
        gate: &tokio::sync::watch::Receiver<bool>,
    ) -> anyhow::Result<Consumers> {
        // Every consumer has connections of its own, as separate clients
        // do: a broker answers a connection's requests in order, so on a
        // shared connection one consumer's empty long poll would hold back
        // another's full answer (seen as 100 ms, one fetch wait, of
        // end-to-end latency on the last records of a run).
        let mut clusters = Vec::with_capacity(stats.len());
        for _ in stats {
            let own = Cluster::connect(&config.bootstrap.join(","), cluster.config().clone())
                .await
                .context("connecting a consumer")?;
            clusters.push(own);
        }
        if config.consumer_group.is_some() {
            let mut groups = GroupConsumers::start(config, cluster, &clusters, stats, counters)?;
            groups.wait_stable().await?;
            return Ok(Consumers::Groups(groups));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let groups = config.consumer_groups() as usize;
        let consumed: Vec<History> = if config.verify {
            (0..groups).map(|_| History::default()).collect()
        } else {
            Vec::new()
        };
        let per_group = config.consumers as usize;
        let mut positions = Vec::with_capacity(per_group);
        for index in 0..per_group {
            let partitions: Vec<i32> = (0..config.partitions as i32)
                .filter(|p| *p as usize % per_group == index)
                .collect();
            positions.push(start_positions(cluster, &config.topic, &partitions).await?);
        }
        let mut tasks = Vec::new();
        // Consumer `index` of logical group `g` has stats `g * per_group + index`.
        for (slot, stats) in stats.iter().enumerate() {
            let (group, index) = (slot / per_group, slot % per_group);
            let task = ConsumerTask {
                config: config.clone(),
                cluster: clusters[slot].clone(),
                refresher: MetadataRefresher::new(clusters[slot].clone()),
                slots: positions[index]
                    .iter()
                    .enumerate()
                    .map(|(slot, &(partition, _))| (partition, slot))
                    .collect(),
                partitions: positions[index].clone(),
                stats: stats.clone(),
                stop: stop.clone(),
                consumed: consumed.get(group).cloned(),
                counters: counters.clone(),
                gate: gate.clone(),
                rounds: 0,
            };
            tasks.push(tokio::spawn(task.run()));
        }
        Ok(Consumers::Assigned {
            tasks,
            stop,
            consumed,
            groups: groups as u64,
        })
    }

    /// The drain's test: every logical group has read as many records as
    /// were acked (expected reads = acked × groups).
    fn caught_up(&self, totals: &crate::histograms::Counters) -> bool {
        match self {
            Consumers::Assigned { tasks, groups, .. } => {
                tasks.is_empty() || totals.consumed_messages >= totals.acked_messages * groups
            }
            Consumers::Groups(groups) => groups.caught_up(totals.acked_messages),
        }
    }

    async fn finish(self) -> anyhow::Result<FinishedConsumers> {
        match self {
            Consumers::Assigned {
                tasks,
                stop,
                consumed,
                ..
            } => {
                stop.store(true, Ordering::Relaxed);
                for task in tasks {
                    task.await.context("consumer task")??;
                }
                let consumed = consumed
                    .iter()
                    .map(|h| std::mem::take(&mut *h.lock().expect("history")))
                    .collect();
                Ok(FinishedConsumers::Assigned(consumed))
            }
            Consumers::Groups(groups) => Ok(FinishedConsumers::Groups(groups.finish().await?)),
        }
    }
}

/// The consumed side of a run's outcome.
struct CheckedConsumers {
    verify: Option<VerifyReport>,
    consumed: Vec<HistoryRecord>,
    groups: Vec<GroupSummary>,
}

/// With `verify`, checks each logical group's reads against every ack on
/// its own: a record every group read once is read once per group, not
/// duplicated, and a record one group missed is lost even if another read
/// it. With `history_dir`, writes `acked.txt` and the reads
/// (`consumed.txt`, or `consumed-<group>.txt` per consumer group).
fn check_consumed(
    config: &RunConfig,
    acked: &[HistoryRecord],
    finished: FinishedConsumers,
) -> anyhow::Result<CheckedConsumers> {
    if let Some(dir) = &config.history_dir {
        write_history(dir, "acked.txt", acked)?;
    }
    let groups = match finished {
        FinishedConsumers::Assigned(mut per_group) => {
            if per_group.len() <= 1 {
                let consumed = per_group.pop().unwrap_or_default();
                if let Some(dir) = &config.history_dir {
                    write_history(dir, "consumed.txt", &consumed)?;
                }
                return Ok(CheckedConsumers {
                    verify: config.verify.then(|| verify(acked, &consumed)),
                    consumed,
                    groups: Vec::new(),
                });
            }
            let mut checked = CheckedConsumers {
                verify: Some(VerifyReport::default()),
                consumed: Vec::new(),
                groups: Vec::new(),
            };
            for (index, consumed) in per_group.into_iter().enumerate() {
                if let Some(total) = &mut checked.verify {
                    total.add(&verify(acked, &consumed));
                }
                if let Some(dir) = &config.history_dir {
                    write_history(dir, &format!("consumed-{index}.txt"), &consumed)?;
                }
                checked.consumed.extend(consumed);
            }
            return Ok(checked);
        }
        FinishedConsumers::Groups(groups) => groups,
    };
    let mut checked = CheckedConsumers {
        verify: config.verify.then(VerifyReport::default),
        consumed: Vec::new(),
        groups: Vec::with_capacity(groups.len()),
    };
    for FinishedGroup {
        mut summary,
        consumed,
    } in groups
    {
        if let Some(total) = &mut checked.verify {
            let report = verify(acked, &consumed);
            total.add(&report);
            summary.verify = Some(report);
        }
        if let Some(dir) = &config.history_dir {
            let name = format!("consumed-{}.txt", summary.group_id);
            write_history(dir, &name, &consumed)?;
        }
        checked.consumed.extend(consumed);
        checked.groups.push(summary);
    }
    Ok(checked)
}

/// Writes a history as `partition offset value_id` lines, the format
/// `ringlog-loadgen verify` reads.
pub fn write_history(
    dir: &std::path::Path,
    name: &str,
    history: &[HistoryRecord],
) -> anyhow::Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(name);
    let file =
        std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    for record in history {
        writeln!(
            out,
            "{} {} {}",
            record.position.partition, record.position.offset, record.value_id
        )?;
    }
    out.flush()?;
    Ok(())
}

/// Totals over the whole run so far (warmup included).
fn recorder_totals(recorder: &RunRecorder) -> crate::histograms::Counters {
    *recorder.all_counters()
}

fn take_interval(
    recorder: &mut RunRecorder,
    stats: &[Arc<Mutex<WorkerStats>>],
    elapsed_ns: u64,
    duration_ns: u64,
    phase: Phase,
) -> IntervalSummary {
    let mut taken: Vec<WorkerStats> = stats
        .iter()
        .map(|s| std::mem::take(&mut *s.lock().expect("stats lock")))
        .collect();
    recorder.record_interval(elapsed_ns, duration_ns.max(1), &mut taken, phase)
}

/// Each partition's latest offset, asked of its leader. A retriable answer
/// (a leader that does not host the new topic's partition yet, a leader
/// that moved) or a connection that fails (a leader listed in the metadata
/// before it listens, or one that just went away) is asked again with fresh
/// metadata, as a Kafka client does, for up to `START_POSITION_MS_MAX`.
async fn start_positions(
    cluster: &Cluster,
    topic: &str,
    partitions: &[i32],
) -> anyhow::Result<Vec<(i32, i64)>> {
    let mut out = Vec::new();
    for &partition in partitions {
        let deadline = Instant::now() + Duration::from_millis(START_POSITION_MS_MAX);
        loop {
            let why = match latest_offset(cluster, topic, partition).await {
                Ok(Ok(offset)) => {
                    out.push((partition, offset));
                    break;
                }
                Ok(Err(code)) if code.is_retriable() => code.to_string(),
                Ok(Err(code)) => bail!("list offsets for {topic}-{partition}: {code}"),
                Err(error) if error.is_retriable() => error.to_string(),
                Err(error) => {
                    return Err(error)
                        .with_context(|| format!("list offsets for {topic}-{partition}"))
                }
            };
            if Instant::now() >= deadline {
                bail!("list offsets for {topic}-{partition}: {why}");
            }
            tokio::time::sleep(Duration::from_millis(START_RETRY_BACKOFF_MS)).await;
            // A failed refresh is one more attempt used, not the end: the
            // next round asks again until the deadline.
            let _ = cluster.refresh_metadata().await;
        }
    }
    Ok(out)
}

/// One ListOffsets(latest) to `partition`'s leader: the offset, or the
/// partition's error code.
async fn latest_offset(
    cluster: &Cluster,
    topic: &str,
    partition: i32,
) -> Result<Result<i64, ErrorCode>, client::ClientError> {
    let connection = cluster.leader_connection(topic, partition).await?;
    let body = messages::list_offsets_request(
        topic,
        &[(partition, messages::TIMESTAMP_LATEST)],
        IsolationLevel::ReadUncommitted,
    );
    let response = connection.request(ApiKey::ListOffsets, &body, &[]).await?;
    let answer = messages::list_offsets_response(response.body(), topic)?
        .into_iter()
        .next();
    Ok(match answer {
        Some((_, ErrorCode::None, offset)) => Ok(offset),
        Some((_, code, _)) => Err(code),
        // The leader answered without the partition: it does not host it
        // (yet), which is what this code says.
        None => Err(ErrorCode::UnknownTopicOrPartition),
    })
}

/// A batch being filled or waiting to be sent, with each record's send time.
struct PendingBatch {
    builder: BatchBuilder,
    opened_ns: u64,
    sends: Vec<(u64, ValueId)>,
    /// Bytes this batch added to the worker's buffer count.
    buffered_bytes: usize,
}

struct SealedBatch {
    /// Shared with the requests that carry it, which write it to the socket
    /// from here; stamped in place at its first send, before any request
    /// holds it.
    bytes: Bytes,
    sends: Vec<(u64, ValueId)>,
    buffered_bytes: usize,
    /// When it was first sent; retries stop `delivery_timeout_ms` after.
    first_sent_ns: Option<u64>,
    /// Carries a producer id and sequence (stamped at its first send; a
    /// retry sends the same bytes).
    stamped: bool,
    /// Its CRC is computed: at its first send, once it is stamped or known
    /// not to be (sealed batches leave the builder without one).
    checksummed: bool,
    /// The worker's transaction it belongs to (0 without transactions).
    txn: u64,
    /// Its place among its partition's batches, given at its first send:
    /// a retried batch goes back into the queue in this order.
    send_index: Option<u64>,
    /// The worker's identity generation it was first sent under.
    generation: u64,
    /// Its last send went out while an earlier batch of its partition was
    /// unanswered, so an out-of-order refusal may be that batch's doing.
    sent_behind: bool,
}

struct PartitionQueue {
    open: Option<PendingBatch>,
    /// Batches back for a retry (in send order), then batches never sent.
    sealed: VecDeque<SealedBatch>,
    in_flight: usize,
    /// A batch came back for a retry: nothing is sent until every batch in
    /// flight is back, so the retries go out first and in order.
    resending: bool,
    /// The next first-sent batch's `send_index`.
    next_send_index: u64,
    /// (generation, send_index) of every batch sent and awaiting an answer
    /// or a retry: a new batch goes out only while the oldest of them is
    /// fewer than the in-flight bound behind it (the broker remembers a
    /// producer's last five batches, so a retry further back would be
    /// refused) and of the current identity (a batch under a new producer
    /// id would not wait for one under the old).
    unresolved: BTreeSet<(u64, u64)>,
    connection: Option<Connection>,
    /// Not sent to before this (after a failure).
    retry_at_ns: u64,
    /// The sequence the next first-sent batch gets under the worker's
    /// producer id.
    next_sequence: Sequence,
    /// Bytes of the partition's last sealed batch: a new batch reserves
    /// about that much. Reserving a full batch each time cost one 64 KiB
    /// allocation per batch, a million a second when 10 000 partitions each
    /// seal a one-record batch per linger.
    last_batch_bytes: usize,
}

impl PartitionQueue {
    fn new() -> PartitionQueue {
        PartitionQueue {
            open: None,
            sealed: VecDeque::new(),
            in_flight: 0,
            resending: false,
            next_send_index: 0,
            unresolved: BTreeSet::new(),
            connection: None,
            retry_at_ns: 0,
            next_sequence: Sequence(0),
            last_batch_bytes: 0,
        }
    }
}

/// What every producer worker shares.
struct WorkerShared {
    config: Arc<RunConfig>,
    cluster: Cluster,
    refresher: MetadataRefresher,
    clock: MonotonicClock,
    stats: Arc<Mutex<WorkerStats>>,
    acked: Option<History>,
    gaps: Arc<AckGaps>,
    counters: Arc<RideThroughCounters>,
}

struct ProducerWorker {
    shared: WorkerShared,
    index: u32,
    end_ns: u64,
    schedule: WorkerSchedule,
    payload: PayloadGenerator,
    keys: KeyGenerator,
    queues: Vec<PartitionQueue>,
    buffered_bytes: usize,
    sticky_partition: u32,
    key: Vec<u8>,
    /// Wall-clock microseconds at the monotonic clock's origin.
    wall_origin_us: u64,
    /// The producer id and epoch batches are stamped with (idempotent runs).
    identity: Option<(ProducerId, ProducerEpoch)>,
    /// A stamped batch failed for good: the broker may or may not hold it,
    /// so the next first send needs a new producer id.
    identity_stale: bool,
    /// Counts the identities taken, so batches of an earlier one are known.
    generation: u64,
    /// `--transaction-ms`: the worker's transactions.
    txn: Option<TxnCycle>,
}

/// A produce response, reported back to its worker.
struct Completion {
    partition: usize,
    bytes: usize,
    /// A batch that failed with a retriable error, to send again.
    retry: Option<SealedBatch>,
    /// A stamped batch failed for good.
    failed_stamped: bool,
    /// The batch's (generation, send_index), once sent awaiting an answer.
    sent_as: Option<(u64, u64)>,
    /// A retry because an earlier batch of the partition was unanswered
    /// when this one went out: nothing is wrong with the connection.
    refused_behind: bool,
}

impl ProducerWorker {
    fn new(
        shared: WorkerShared,
        index: u32,
        start_ns: u64,
        end_ns: u64,
    ) -> anyhow::Result<ProducerWorker> {
        let config = &shared.config;
        let schedule =
            WorkerSchedule::new(start_ns, config.rate_msgs_per_s, index, config.producers)?;
        let payload = PayloadGenerator::new(
            config.payload,
            config.message_size_bytes,
            derive_seed(config.seed, u64::from(index) * 2),
        )?;
        let keys = KeyGenerator::new(
            config.keys,
            derive_seed(config.seed, u64::from(index) * 2 + 1),
        );
        let partitions = config.partitions as usize;
        let wall_origin_us = wall_us().saturating_sub(shared.clock.now_ns() / 1_000);
        Ok(ProducerWorker {
            sticky_partition: index % config.partitions,
            index,
            end_ns,
            schedule,
            payload,
            keys,
            queues: (0..partitions).map(|_| PartitionQueue::new()).collect(),
            buffered_bytes: 0,
            key: Vec::new(),
            wall_origin_us,
            identity: None,
            identity_stale: false,
            generation: 0,
            txn: None,
            shared,
        })
    }

    /// Takes a (new) producer id, retrying retriable failures for up to the
    /// delivery timeout. Every partition's sequences start again at 0.
    async fn take_identity(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_millis(self.config().delivery_timeout_ms);
        loop {
            match self.shared.cluster.init_producer_id().await {
                Ok(identity) => {
                    self.identity = Some(identity);
                    self.identity_stale = false;
                    self.generation += 1;
                    for queue in &mut self.queues {
                        queue.next_sequence = Sequence(0);
                    }
                    return Ok(());
                }
                Err(e) if e.is_retriable() && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(RETRY_BACKOFF_MS)).await;
                }
                Err(e) => return Err(e).context("taking a producer id"),
            }
        }
    }

    fn config(&self) -> &RunConfig {
        &self.shared.config
    }

    async fn run(mut self) -> anyhow::Result<()> {
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Completion>();
        let mut in_flight = 0usize;
        let transaction_ms = self.config().transaction_ms;
        if transaction_ms > 0 {
            let config = self.shared.config.clone();
            let id = format!("ringlog-loadgen-{}-{}", config.seed, self.index);
            let txn = TxnCycle::start(
                &self.shared.cluster,
                &id,
                &config.topic,
                config.partitions,
                transaction_ms,
            )
            .await?;
            let identity = txn.identity();
            self.identity = Some((identity.id, identity.epoch));
            self.txn = Some(txn);
        } else if self.config().idempotent {
            self.take_identity().await?;
        }
        loop {
            let now_ns = self.shared.clock.now_ns();
            let sending = now_ns < self.end_ns;
            if sending {
                self.generate(now_ns);
            } else {
                self.account_unsent();
            }
            self.seal_due(now_ns, !sending);
            self.expire_unsendable(now_ns);
            // Nothing left to stamp: the run can end (and report its
            // failures) without a new producer id.
            if self.identity_stale && (sending || self.holds_batches()) {
                if self.txn.is_some() {
                    bail!("a batch of a transaction failed for good; the run stops");
                }
                self.take_identity().await?;
            }
            self.advance_transaction(now_ns, sending, in_flight).await?;
            in_flight += self.send_ready(&done_tx).await;
            while let Ok(done) = done_rx.try_recv() {
                self.complete(done);
                in_flight -= 1;
            }
            if !sending
                && in_flight == 0
                && !self.holds_batches()
                && self.txn.as_ref().is_none_or(TxnCycle::is_done)
            {
                if let Some(txn) = &self.txn {
                    crate::say!(
                        "producer {}: {} transactions committed",
                        self.index,
                        txn.committed()
                    );
                }
                break;
            }
            let wake_ns = self.next_wake_ns(now_ns, sending);
            let sleep = Duration::from_nanos(wake_ns.saturating_sub(self.shared.clock.now_ns()));
            tokio::select! {
                done = done_rx.recv() => {
                    if let Some(done) = done {
                        self.complete(done);
                        in_flight -= 1;
                    }
                }
                _ = tokio::time::sleep(sleep), if !sleep.is_zero() => {}
                _ = tokio::task::yield_now(), if sleep.is_zero() => {}
            }
        }
        Ok(())
    }

    /// Ends the open transaction when it is due (sealing what the worker
    /// holds into it first) and lets the cycle move on.
    async fn advance_transaction(
        &mut self,
        now_ns: u64,
        sending: bool,
        in_flight: usize,
    ) -> anyhow::Result<()> {
        let Some(txn) = &self.txn else {
            return Ok(());
        };
        if txn.due(now_ns, sending) {
            for partition in 0..self.queues.len() {
                self.seal(partition);
            }
            self.txn.as_mut().expect("checked").drain();
        }
        let txn = self.txn.as_ref().expect("checked");
        let current = txn.sending();
        let outstanding = in_flight > 0
            || self
                .queues
                .iter()
                .any(|q| q.sealed.iter().any(|b| Some(b.txn) == current));
        let more = sending
            || self
                .queues
                .iter()
                .any(|q| q.open.is_some() || !q.sealed.is_empty());
        self.txn
            .as_mut()
            .expect("checked")
            .advance(now_ns, outstanding, more)
            .await
    }

    /// Whether any partition still has a batch open or waiting to be sent.
    fn holds_batches(&self) -> bool {
        self.queues
            .iter()
            .any(|q| q.open.is_some() || !q.sealed.is_empty())
    }

    /// Fails, as errors, the front batches of each partition with nothing
    /// in flight that have waited past the delivery timeout (counted from
    /// their first send, or their first record's if never sent) because no
    /// leader could be reached: a retry's timeout is otherwise judged only
    /// when an answer comes, and a run whose broker died never ended.
    fn expire_unsendable(&mut self, now_ns: u64) {
        let timeout_ns = self.config().delivery_timeout_ms * 1_000_000;
        let mut expired: Vec<SealedBatch> = Vec::new();
        for queue in &mut self.queues {
            if queue.in_flight > 0 {
                continue;
            }
            while let Some(front) = queue.sealed.front() {
                let since_ns = front
                    .first_sent_ns
                    .or_else(|| front.sends.first().map(|(send_ns, _)| *send_ns))
                    .unwrap_or(now_ns);
                if now_ns.saturating_sub(since_ns) < timeout_ns {
                    break;
                }
                let batch = queue.sealed.pop_front().expect("checked");
                if let Some(index) = batch.send_index {
                    queue.unresolved.remove(&(batch.generation, index));
                }
                expired.push(batch);
            }
        }
        if expired.is_empty() {
            return;
        }
        let mut stats = self.shared.stats.lock().expect("stats lock");
        for batch in expired {
            for _ in &batch.sends {
                stats.record_error();
            }
            self.buffered_bytes -= batch.buffered_bytes;
            self.identity_stale |= batch.stamped;
        }
    }

    fn complete(&mut self, done: Completion) {
        self.identity_stale |= done.failed_stamped;
        let queue = &mut self.queues[done.partition];
        assert!(
            queue.in_flight > 0,
            "a completion without a batch in flight"
        );
        queue.in_flight -= 1;
        match done.retry {
            Some(batch) => {
                // Among the other returned batches by first send, ahead of
                // those never sent: the partition's order holds.
                let index = batch.send_index.expect("a retried batch was sent");
                let at = queue
                    .sealed
                    .iter()
                    .position(|b| b.send_index.is_none_or(|i| i > index))
                    .unwrap_or(queue.sealed.len());
                queue.sealed.insert(at, batch);
                queue.resending = true;
                if !done.refused_behind {
                    queue.connection = None;
                    queue.retry_at_ns = self.shared.clock.now_ns() + RETRY_BACKOFF_MS * 1_000_000;
                    self.shared.refresher.request();
                }
                self.shared
                    .counters
                    .retried_batches
                    .fetch_add(1, Ordering::Relaxed);
            }
            None => {
                if let Some(sent_as) = done.sent_as {
                    let removed = queue.unresolved.remove(&sent_as);
                    assert!(removed, "a batch resolved twice");
                }
                self.buffered_bytes -= done.bytes;
            }
        }
    }

    /// Builds every record whose intended send time has come. Histograms are
    /// large; they are recorded into in place under one short lock per call,
    /// never copied per record or per batch.
    fn generate(&mut self, now_ns: u64) {
        let stats = self.shared.stats.clone();
        let mut stats = stats.lock().expect("stats lock");
        let mut generated = 0u64;
        let mut send_ns = now_ns;
        while self.buffered_bytes < WORKER_BUFFER_BYTES_MAX {
            let paced = self.schedule.is_paced();
            if paced {
                let due = self
                    .schedule
                    .intended_send_ns(self.schedule.messages_scheduled())
                    .is_some_and(|t| t <= now_ns);
                if !due {
                    break;
                }
            } else if generated == UNPACED_CHUNK_RECORDS {
                break;
            }
            let slot = self.schedule.next_slot();
            // The clock is read once per `CLOCK_READ_RECORDS` records, not
            // per record: that many take tens of microseconds to build, while
            // a turn that catches up after a stall may build megabytes.
            if generated > 0 && generated.is_multiple_of(CLOCK_READ_RECORDS) {
                send_ns = self.shared.clock.now_ns();
            }
            generated += 1;
            self.append_record(
                &mut stats,
                slot.message_index,
                send_ns,
                slot.publish_delay_ns(send_ns),
            );
        }
    }

    /// Once sending is over: the slots due before the end that were never
    /// sent count as unsent, each with its delay up to the end.
    fn account_unsent(&mut self) {
        let left = self.schedule.take_slots_before(self.end_ns);
        if left.is_empty() {
            return;
        }
        let mut stats = self.shared.stats.lock().expect("stats lock");
        for intended_ns in left {
            stats.record_unsent(self.end_ns - intended_ns);
        }
    }

    fn append_record(
        &mut self,
        stats: &mut WorkerStats,
        message_index: u64,
        send_ns: u64,
        publish_delay_ns: u64,
    ) {
        let value_id = ValueId::new(self.index, message_index);
        // Wall time derived from the monotonic reading: one clock read per record.
        let send_wall_us = self.wall_origin_us + send_ns / 1_000;
        let value_bytes = self.payload.size_bytes();
        let key_index = self.keys.next_key_index();
        let partitions = self.config().partitions;
        let partition = match key_index {
            Some(index) => {
                self.key.clear();
                KeyGenerator::write_key(index, &mut self.key);
                client::partitioner::partition_for_key(&self.key, partitions as usize) as usize
            }
            None => self.sticky_partition as usize,
        };
        let compression = match self.config().compression {
            Compression::None => protocol::Compression::None,
            Compression::Zstd => protocol::Compression::Zstd,
        };
        let batch_bytes = self.config().batch_bytes as usize;
        // A batch is sealed once it reaches `batch_bytes`, so it ends at most
        // one record past it.
        let record_bytes_max = value_bytes + self.key.len() + RECORD_OVERHEAD_BYTES_MAX;
        let transactional = self.txn.is_some();
        let queue = &mut self.queues[partition];
        let reserve_bytes = (queue.last_batch_bytes + queue.last_batch_bytes / 4).min(batch_bytes)
            + record_bytes_max;
        let batch = queue.open.get_or_insert_with(|| PendingBatch {
            builder: BatchBuilder::new(compression)
                .transactional(transactional)
                .with_capacity_bytes(reserve_bytes),
            opened_ns: send_ns,
            sends: Vec::new(),
            buffered_bytes: 0,
        });
        // The value is stamped where it lies in the batch: no copy of it
        // is made anywhere else first.
        let payload = &mut self.payload;
        let size = batch.builder.push_written(
            (send_wall_us / 1000) as i64,
            key_index.map(|_| self.key.as_slice()),
            value_bytes,
            |out| {
                payload.append_payload(
                    PayloadHeader {
                        value_id,
                        send_time_us: send_wall_us,
                    },
                    out,
                )
            },
        );
        batch.sends.push((send_ns, value_id));
        batch.buffered_bytes += size;
        self.buffered_bytes += size;
        stats.record_send(value_bytes as u64, publish_delay_ns);
        if batch.builder.size_bytes_uncompressed() >= batch_bytes {
            self.seal(partition);
            if key_index.is_none() {
                // Unkeyed records stick to a partition per batch, then move on.
                self.sticky_partition = (self.sticky_partition + 1) % partitions;
            }
        }
    }

    fn seal(&mut self, partition: usize) {
        let txn = self.txn.as_ref().map_or(0, TxnCycle::sealing_into);
        let queue = &mut self.queues[partition];
        if let Some(batch) = queue.open.take() {
            queue.last_batch_bytes = batch.builder.size_bytes_uncompressed();
            // Checksummed once, at its first send, after the producer stamp.
            let mut bytes = batch
                .builder
                .build_without_crc()
                .expect("a batch with records builds");
            // The builder reserved as much as the last batch took; one
            // sealed by its linger far emptier would hold that memory until
            // acknowledged, beyond what the worker's buffer bound counts.
            if bytes.capacity() > 2 * bytes.len() {
                bytes.shrink_to_fit();
            }
            queue.sealed.push_back(SealedBatch {
                bytes: Bytes::from(bytes),
                sends: batch.sends,
                buffered_bytes: batch.buffered_bytes,
                first_sent_ns: None,
                stamped: false,
                checksummed: false,
                txn,
                send_index: None,
                generation: 0,
                sent_behind: false,
            });
        }
    }

    /// Seals batches older than the linger (or all of them at the end).
    fn seal_due(&mut self, now_ns: u64, all: bool) {
        let linger_ns = self.config().linger_ms * 1_000_000;
        let partitions = self.config().partitions;
        for partition in 0..self.queues.len() {
            let due = self.queues[partition]
                .open
                .as_ref()
                .is_some_and(|b| all || now_ns.saturating_sub(b.opened_ns) >= linger_ns);
            if due {
                self.seal(partition);
                if self.keys.spec() == crate::keys::KeySpec::None
                    && partition == self.sticky_partition as usize
                {
                    self.sticky_partition = (self.sticky_partition + 1) % partitions;
                }
            }
        }
    }

    /// The connection to `partition`'s leader from cached metadata; `None`
    /// (and a refresh asked for) when there is no leader or it cannot be
    /// reached now.
    async fn leader_connection(&mut self, partition: usize) -> Option<Connection> {
        if let Some(connection) = self.queues[partition]
            .connection
            .as_ref()
            .filter(|c| !c.is_closed())
        {
            return Some(connection.clone());
        }
        let address = self
            .shared
            .cluster
            .metadata()
            .leader_address(&self.shared.config.topic, partition as i32);
        let connection = match address {
            Ok(address) => self.shared.cluster.connection(&address).await.ok(),
            Err(_) => None,
        };
        if connection.is_none() {
            self.shared.refresher.request();
            self.queues[partition].retry_at_ns =
                self.shared.clock.now_ns() + RETRY_BACKOFF_MS * 1_000_000;
        }
        self.queues[partition].connection = connection.clone();
        connection
    }

    /// How many batches a partition may have in flight.
    fn in_flight_max(&self) -> usize {
        if self.identity.is_some() {
            IN_FLIGHT_BATCHES_PER_PARTITION_MAX
        } else {
            1
        }
    }

    /// Whether `partition`'s front batch may go out now.
    fn may_send(&mut self, partition: usize, now_ns: u64) -> bool {
        let in_flight_max = self.in_flight_max();
        let queue = &mut self.queues[partition];
        if queue.resending && queue.in_flight == 0 {
            queue.resending = false;
        }
        let Some(front) = queue.sealed.front() else {
            return false;
        };
        if queue.resending || queue.in_flight >= in_flight_max || now_ns < queue.retry_at_ns {
            return false;
        }
        if front.send_index.is_none() {
            if let Some(&(generation, oldest)) = queue.unresolved.first() {
                if generation < self.generation
                    || queue.next_send_index - oldest >= in_flight_max as u64
                {
                    return false;
                }
            }
        }
        // A batch of the next transaction waits for its begin.
        self.txn
            .as_ref()
            .is_none_or(|txn| txn.sending() == Some(front.txn))
    }

    /// Sends the oldest sealed batches of every partition, up to its
    /// in-flight bound, in passes that take at most one batch per partition;
    /// returns how many batches went out.
    async fn send_ready(&mut self, done: &mpsc::UnboundedSender<Completion>) -> usize {
        let mut sent = 0;
        loop {
            let now_ns = self.shared.clock.now_ns();
            let (taken, in_pass) = self.send_pass(now_ns, done).await;
            sent += in_pass;
            if taken == 0 {
                return sent;
            }
        }
    }

    /// One pass over the partitions: each batch that may go out joins the
    /// request to its leader's connection, so a leader gets one request for
    /// all of its ready partitions (as Kafka's producer drains per node)
    /// rather than one per batch, which with thousands of partitions meant
    /// hundreds of thousands of requests a second. Returns the batches taken
    /// and those now awaiting an answer.
    async fn send_pass(
        &mut self,
        now_ns: u64,
        done: &mpsc::UnboundedSender<Completion>,
    ) -> (usize, usize) {
        let mut requests: Vec<ProduceRequest> = Vec::new();
        let (mut taken, mut sent) = (0, 0);
        for partition in 0..self.queues.len() {
            if !self.may_send(partition, now_ns) {
                continue;
            }
            let Some(connection) = self.leader_connection(partition).await else {
                continue;
            };
            let batch = self.take_for_send(partition, now_ns);
            taken += 1;
            let at = match requests
                .iter()
                .position(|r| r.connection.address() == connection.address())
            {
                Some(at) => at,
                None => {
                    requests.push(ProduceRequest {
                        connection,
                        batches: Vec::new(),
                        bytes: 0,
                    });
                    requests.len() - 1
                }
            };
            let request = &mut requests[at];
            if request.bytes + batch.bytes.len() > PRODUCE_REQUEST_BYTES_MAX
                && !request.batches.is_empty()
            {
                let full = ProduceRequest {
                    connection: request.connection.clone(),
                    batches: std::mem::take(&mut request.batches),
                    bytes: std::mem::take(&mut request.bytes),
                };
                sent += self.send_request(full, done).await;
            }
            let request = &mut requests[at];
            request.bytes += batch.bytes.len();
            request.batches.push((partition, batch));
        }
        for request in requests {
            if !request.batches.is_empty() {
                sent += self.send_request(request, done).await;
            }
        }
        (taken, sent)
    }

    /// Takes `partition`'s front batch to send: numbered at its first send,
    /// stamped with the producer id and sequence or checksummed.
    fn take_for_send(&mut self, partition: usize, now_ns: u64) -> SealedBatch {
        let queue = &mut self.queues[partition];
        let mut batch = queue.sealed.pop_front().expect("checked non-empty");
        batch.first_sent_ns.get_or_insert(now_ns);
        batch.sent_behind = queue.in_flight > 0;
        if batch.send_index.is_none() {
            batch.send_index = Some(queue.next_send_index);
            batch.generation = self.generation;
            queue.next_send_index += 1;
            if self.shared.config.acks != Acks::None {
                queue
                    .unresolved
                    .insert((batch.generation, queue.next_send_index - 1));
            }
        }
        if !batch.checksummed {
            // Not copied: no request holds the bytes before their first send.
            let mut bytes = BytesMut::from(std::mem::take(&mut batch.bytes));
            match self.identity {
                Some((id, epoch)) => {
                    stamp_producer(&mut bytes, id, epoch, queue.next_sequence);
                    queue.next_sequence = queue.next_sequence.advanced_by(batch.sends.len() as i64);
                    batch.stamped = true;
                }
                None => seal_crc(&mut bytes),
            }
            batch.bytes = bytes.freeze();
            batch.checksummed = true;
        }
        batch
    }

    /// Writes one produce request; with acks, a task awaits its answer and
    /// completes each batch with its partition's result. Returns the
    /// batches now awaiting an answer.
    async fn send_request(
        &mut self,
        request: ProduceRequest,
        done: &mpsc::UnboundedSender<Completion>,
    ) -> usize {
        let ProduceRequest {
            connection,
            batches,
            ..
        } = request;
        let acks = match self.shared.config.acks {
            Acks::None => 0,
            Acks::Leader => 1,
            Acks::All => -1,
        };
        let topic = &self.shared.config.topic;
        let parts: Vec<Bytes> = batches.iter().map(|(_, b)| b.bytes.clone()).collect();
        let entries: Vec<ProduceEntry<'_>> = batches
            .iter()
            .zip(&parts)
            .map(|((partition, _), bytes)| ProduceEntry {
                topic,
                partition: *partition as i32,
                batch: bytes,
            })
            .collect();
        let body = messages::produce_request(acks, PRODUCE_TIMEOUT_MS, &entries);
        drop(entries);
        if acks == 0 {
            let result = connection
                .send_parts_without_response(ApiKey::Produce, &body, parts)
                .await;
            self.account_unacknowledged(batches, result.is_ok());
            return 0;
        }
        let response = connection.send_parts(ApiKey::Produce, &body, parts).await;
        for (partition, _) in &batches {
            self.queues[*partition].in_flight += 1;
        }
        let count = batches.len();
        let completer = Completer {
            stats: self.shared.stats.clone(),
            clock: self.shared.clock,
            acked: self.shared.acked.clone(),
            gaps: self.shared.gaps.clone(),
            delivery_timeout_ns: self.shared.config.delivery_timeout_ms * 1_000_000,
            done: done.clone(),
        };
        tokio::spawn(async move {
            let outcome = match response {
                Ok(future) => future
                    .await
                    .and_then(|r| messages::produce_response(r.body())),
                Err(e) => Err(e),
            };
            for (index, (partition, batch)) in batches.into_iter().enumerate() {
                let result = match &outcome {
                    Ok(outcomes) => Ok(partition_outcome(outcomes, index, partition)),
                    Err(e) => Err(e.is_retriable()),
                };
                completer.complete(partition, batch, result);
            }
        });
        count
    }

    /// acks=0: nothing is awaited; the batches' bytes are accounted as sent.
    fn account_unacknowledged(&mut self, batches: Vec<(usize, SealedBatch)>, written: bool) {
        let now = self.shared.clock.now_ns();
        let mut stats = self.shared.stats.lock().expect("stats lock");
        for (_, batch) in &batches {
            for (send_ns, _) in &batch.sends {
                match written {
                    true => stats.record_ack(now - send_ns),
                    false => stats.record_error(),
                }
            }
            self.buffered_bytes -= batch.buffered_bytes;
        }
    }

    fn next_wake_ns(&self, now_ns: u64, sending: bool) -> u64 {
        let mut wake = now_ns + 1_000_000;
        // With its buffer full the worker cannot generate whatever the
        // schedule owes: only an answer (which wakes it through its
        // channel) frees room. Waking for an overdue schedule then spun a
        // whole core on clock reads and yields whenever the broker was
        // overloaded, taking that core from the broker being measured.
        if sending && self.buffered_bytes < WORKER_BUFFER_BYTES_MAX {
            if let Some(next) = self
                .schedule
                .intended_send_ns(self.schedule.messages_scheduled())
            {
                wake = wake.min(next);
            } else {
                return now_ns;
            }
        }
        if let Some(end) = self.txn.as_ref().and_then(TxnCycle::ends_at_ns) {
            wake = wake.min(end.max(now_ns + 1));
        }
        let linger_ns = self.config().linger_ms * 1_000_000;
        let in_flight_max = self.in_flight_max();
        for queue in &self.queues {
            if let Some(batch) = &queue.open {
                wake = wake.min(batch.opened_ns + linger_ns);
            }
            let waits_for_returns = queue.resending && queue.in_flight > 0;
            if !queue.sealed.is_empty() && queue.in_flight < in_flight_max && !waits_for_returns {
                wake = wake.min(queue.retry_at_ns.max(now_ns + 1));
            }
        }
        wake
    }
}

/// Bytes of batches in one produce request: the Kafka producer's default
/// `max.request.size`, far below the broker's frame bound.
const PRODUCE_REQUEST_BYTES_MAX: usize = 1 << 20;

/// A produce request being filled for one leader connection, at most one
/// batch per partition (an answer names partitions, not batches).
struct ProduceRequest {
    connection: Connection,
    batches: Vec<(usize, SealedBatch)>,
    bytes: usize,
}

/// `partition`'s result, the `index`th entry of its request: a broker answers
/// in request order, so that place is looked at first.
fn partition_outcome(
    outcomes: &[messages::ProduceOutcome],
    index: usize,
    partition: usize,
) -> Option<&messages::ProduceOutcome> {
    let matches = |o: &&messages::ProduceOutcome| o.partition == partition as i32;
    outcomes
        .get(index)
        .filter(matches)
        .or_else(|| outcomes.iter().find(matches))
}

/// What a produce response's task needs to account for it.
struct Completer {
    stats: Arc<Mutex<WorkerStats>>,
    clock: MonotonicClock,
    acked: Option<History>,
    gaps: Arc<AckGaps>,
    delivery_timeout_ns: u64,
    done: mpsc::UnboundedSender<Completion>,
}

impl Completer {
    /// Records acks or errors for `batch`, or hands it back for a retry when
    /// the failure is retriable and its delivery timeout has not passed.
    /// `outcome` is the partition's result in the answer (`None` when the
    /// answer left it out), or whether the request's failure is retriable.
    fn complete(
        &self,
        partition: usize,
        batch: SealedBatch,
        outcome: Result<Option<&messages::ProduceOutcome>, bool>,
    ) {
        let now = self.clock.now_ns();
        let sent_as = batch.send_index.map(|index| (batch.generation, index));
        let mut refused_behind = false;
        let result = match outcome {
            Ok(result) => match result {
                Some(r) if r.error == ErrorCode::None => Ok(r.base_offset),
                // Sent while an earlier batch of its partition was
                // unanswered: that one's failure, retried first, comes back.
                Some(r)
                    if batch.sent_behind
                        && matches!(
                            r.error,
                            ErrorCode::OutOfOrderSequenceNumber | ErrorCode::UnknownProducerId
                        ) =>
                {
                    refused_behind = true;
                    Err(true)
                }
                Some(r) => Err(r.error.is_retriable()),
                None => Err(false),
            },
            Err(retriable) => Err(retriable),
        };
        let bytes = batch.buffered_bytes;
        let within_timeout = batch
            .first_sent_ns
            .is_some_and(|first| now.saturating_sub(first) < self.delivery_timeout_ns);
        if result == Err(true) && within_timeout {
            let _ = self.done.send(Completion {
                partition,
                bytes,
                retry: Some(batch),
                failed_stamped: false,
                sent_as,
                refused_behind,
            });
            return;
        }
        let failed_stamped = result.is_err() && batch.stamped;
        let mut local = self.stats.lock().expect("stats lock");
        match result {
            Ok(base) => {
                for (send_ns, _) in &batch.sends {
                    local.record_ack(now.saturating_sub(*send_ns));
                }
                self.gaps.on_ack(partition, now);
                if let Some(acked) = &self.acked {
                    let mut history = acked.lock().expect("history lock");
                    for (i, (_, value_id)) in batch.sends.iter().enumerate() {
                        history.push(HistoryRecord::new(
                            partition as u32,
                            (base + i as i64) as u64,
                            *value_id,
                        ));
                    }
                }
            }
            Err(_) => {
                for _ in &batch.sends {
                    local.record_error();
                }
            }
        }
        drop(local);
        let _ = self.done.send(Completion {
            partition,
            bytes,
            retry: None,
            failed_stamped,
            sent_as,
            refused_behind: false,
        });
    }
}

struct ConsumerTask {
    config: Arc<RunConfig>,
    cluster: Cluster,
    refresher: MetadataRefresher,
    /// (partition, next offset)
    partitions: Vec<(i32, i64)>,
    /// Each partition's place in `partitions`: a fetch names thousands of
    /// partitions in the many-partitions scenario, and a search per entry
    /// made each round quadratic.
    slots: HashMap<i32, usize>,
    stats: Arc<Mutex<WorkerStats>>,
    stop: Arc<AtomicBool>,
    consumed: Option<History>,
    counters: Arc<RideThroughCounters>,
    /// Fetching starts once this holds true (at once unless `catch_up`).
    gate: tokio::sync::watch::Receiver<bool>,
    /// Fetch requests sent, which rotate the order of their partitions.
    rounds: usize,
}

/// What one fetch round trip brought back, for which partitions.
type FetchRound = (Vec<i32>, client::Result<client::Response>);

impl ConsumerTask {
    /// Fetches this consumer's partitions from their current leaders: one
    /// request per leader in flight, each re-sent as soon as it is answered,
    /// so a silent leader holds up only its own partitions. A failure
    /// re-routes the partitions it concerned after a metadata refresh.
    async fn run(mut self) -> anyhow::Result<()> {
        while !*self.gate.borrow_and_update() {
            if self.stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            // Bounded, so a stop during the wait is seen.
            let _ =
                tokio::time::timeout(Duration::from_millis(RETRY_BACKOFF_MS), self.gate.changed())
                    .await;
        }
        let mut rounds: tokio::task::JoinSet<FetchRound> = tokio::task::JoinSet::new();
        let mut busy: std::collections::HashSet<i32> = std::collections::HashSet::new();
        while !self.stop.load(Ordering::Relaxed) {
            let groups = self.by_leader(&busy);
            let routed: usize = groups.values().map(Vec::len).sum();
            if routed + busy.len() < self.partitions.len() {
                self.refresher.request();
            }
            for (address, mut partitions) in groups {
                // A broker fills a response in request order: rotating the
                // order each round gives every partition its turn first, as
                // Kafka's consumer does.
                if !partitions.is_empty() {
                    let turn = self.rounds % partitions.len();
                    partitions.rotate_left(turn);
                }
                self.rounds = self.rounds.wrapping_add(1);
                let Ok(connection) = self.cluster.connection(&address).await else {
                    self.refresher.request();
                    continue;
                };
                let entries: Vec<FetchEntry> = partitions
                    .iter()
                    .map(|&p| FetchEntry {
                        topic: self.config.topic.clone(),
                        partition: p,
                        fetch_offset: self.position(p),
                        max_bytes: FETCH_PARTITION_BYTES_MAX,
                    })
                    .collect();
                let isolation = if self.config.transaction_ms > 0 {
                    IsolationLevel::ReadCommitted
                } else {
                    IsolationLevel::ReadUncommitted
                };
                let body =
                    messages::fetch_request(FETCH_WAIT_MS, 1, FETCH_BYTES_MAX, isolation, &entries);
                busy.extend(&partitions);
                rounds.spawn(async move {
                    let bound = Duration::from_millis(FETCH_ROUND_TRIP_MS_MAX);
                    let response =
                        tokio::time::timeout(bound, connection.request(ApiKey::Fetch, &body, &[]))
                            .await
                            .unwrap_or_else(|_| {
                                Err(client::ClientError::RequestTimeout {
                                    address,
                                    timeout_ms: FETCH_ROUND_TRIP_MS_MAX,
                                })
                            });
                    (partitions, response)
                });
            }
            let Some(round) = rounds.join_next().await else {
                // Nothing routable: wait for the metadata to name leaders.
                self.refresher.request();
                tokio::time::sleep(Duration::from_millis(RETRY_BACKOFF_MS)).await;
                continue;
            };
            let (partitions, response) = round.context("fetch task")?;
            for p in &partitions {
                busy.remove(p);
            }
            let trouble = match response {
                Ok(response) => self.take(&response)?,
                Err(_) if self.stop.load(Ordering::Relaxed) => return Ok(()),
                Err(_) => true,
            };
            if trouble {
                self.refresher.request();
                tokio::time::sleep(Duration::from_millis(RETRY_BACKOFF_MS)).await;
            }
        }
        rounds.abort_all();
        Ok(())
    }

    fn position(&self, partition: i32) -> i64 {
        self.slots
            .get(&partition)
            .map_or(0, |&slot| self.partitions[slot].1)
    }

    /// This consumer's partitions not in a fetch now, grouped by their
    /// leader's shard address in the cached metadata; leaderless ones wait
    /// for a refresh.
    fn by_leader(&self, busy: &std::collections::HashSet<i32>) -> BTreeMap<String, Vec<i32>> {
        let metadata = self.cluster.metadata();
        let mut by_leader: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        for &(partition, _) in self.partitions.iter().filter(|(p, _)| !busy.contains(p)) {
            if let Ok(address) = metadata.leader_address(&self.config.topic, partition) {
                by_leader.entry(address).or_default().push(partition);
            }
        }
        by_leader
    }

    /// Takes in one fetch response; true when some partition needs its
    /// leader looked up again.
    fn take(&mut self, response: &client::Response) -> anyhow::Result<bool> {
        let decompressed_bytes_max = 64 << 20;
        let payload = response.payload();
        let fetched = messages::fetch_response(response.body(), &payload)?;
        let now_us = wall_us();
        let stats = self.stats.clone();
        let mut local = stats.lock().expect("stats lock");
        let mut history = Vec::new();
        let mut trouble = false;
        for partition in fetched {
            if partition.error != ErrorCode::None {
                // A leader moved, a broker is catching up or stopping: ride
                // through it. Anything else is counted and retried too; the
                // read-back after the run is what judges the log.
                self.counters.fetch_errors.fetch_add(1, Ordering::Relaxed);
                trouble = true;
                continue;
            }
            let Some(&slot) = self.slots.get(&partition.partition) else {
                continue;
            };
            let position = &mut self.partitions[slot];
            let mut rest = &partition.records[..];
            while !rest.is_empty() {
                let (batch, used) =
                    RecordBatch::parse_prefix(rest, 64 << 20).context("fetched batch")?;
                rest = &rest[used..];
                if batch.header().is_control() {
                    // A transaction marker: no record of the workload.
                    position.1 = position.1.max(batch.header().last_offset().0 + 1);
                    continue;
                }
                let section = batch
                    .records_section(decompressed_bytes_max)
                    .context("records")?;
                for record in section.iter() {
                    let record = record.context("record")?;
                    if record.offset.0 < position.1 {
                        continue;
                    }
                    let value = record.value.unwrap_or_default();
                    let header = record_consumed(self.config.payload, &mut local, value, now_us)?;
                    if self.consumed.is_some() {
                        history.push(HistoryRecord::new(
                            partition.partition as u32,
                            record.offset.0 as u64,
                            header.value_id,
                        ));
                    }
                    position.1 = record.offset.0 + 1;
                }
            }
        }
        drop(local);
        if let Some(consumed) = &self.consumed {
            consumed.lock().expect("history lock").extend(history);
        }
        Ok(trouble)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group_consumers::CommittedLag;
    use crate::group_progress::GroupEventCounts;
    use crate::run_config::RunFlags;

    fn group(id: &str, consumed: Vec<HistoryRecord>) -> FinishedGroup {
        FinishedGroup {
            summary: GroupSummary {
                group_id: id.to_string(),
                members: 2,
                records_read: consumed.len() as u64,
                records_new: consumed.len() as u64,
                events: GroupEventCounts::default(),
                close_error: None,
                committed_lag: Some(Ok(CommittedLag {
                    lag_records: 0,
                    partitions_known: 2,
                })),
                verify: None,
            },
            consumed,
        }
    }

    // Each consumer group is checked against every ack on its own: two
    // groups reading the same records are not duplicates, and a record one
    // group missed is lost even though the other group read it.
    #[test]
    fn verify_counts_per_group() {
        let flags = RunFlags {
            consumer_group: Some("g".into()),
            consumer_groups: Some(2),
            verify: true,
            ..RunFlags::default()
        };
        let config = RunConfig::resolve(flags, 0).unwrap();
        let acked: Vec<HistoryRecord> = (0..4)
            .map(|i| HistoryRecord::new(i % 2, u64::from(i / 2), ValueId::new(0, u64::from(i))))
            .collect();
        let everything = FinishedConsumers::Groups(vec![
            group("g-0", acked.clone()),
            group("g-1", acked.clone()),
        ]);
        let checked = check_consumed(&config, &acked, everything).unwrap();
        let total = checked.verify.unwrap();
        assert!(total.is_clean(), "{total:?}");
        assert_eq!(total.acked_records, 8, "acked × groups");
        assert_eq!(total.duplicated, 0);
        assert_eq!(checked.consumed.len(), 8);
        assert_eq!(checked.groups.len(), 2);
        assert!(checked.groups.iter().all(|g| g.verify.unwrap().is_clean()));

        let one_missed = FinishedConsumers::Groups(vec![
            group("g-0", acked.clone()),
            group("g-1", acked[1..].to_vec()),
        ]);
        let checked = check_consumed(&config, &acked, one_missed).unwrap();
        assert_eq!(checked.verify.unwrap().lost, 1);
        assert!(checked.groups[0].verify.unwrap().is_clean());
        assert_eq!(checked.groups[1].verify.unwrap().lost, 1);
    }
}
