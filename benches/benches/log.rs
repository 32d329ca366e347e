//! Log throughput: appends of 64 KiB batches of 500 B records under flush
//! `none` and `always` (sequential, with concurrent appenders sharing syncs,
//! and shaped like one shard of the 1M msgs/s scenario: eight logs with five
//! batches in flight each), reads by offset, and the raw `DmaStreamWriter`
//! rate in the same run. After the criterion groups it prints each rate as a
//! fraction of the device's, the shard-shaped run's acknowledgement
//! latencies, and writes them to `target/bench-results/log.json`.
//!
//! Run: `cargo bench -p benches --bench log`; with `RINGLOG_BENCH_SUMMARY_ONLY=1`
//! only the summary table is measured (about a minute); with
//! `RINGLOG_BENCH_SHARD_ONLY=1` only three shard-shaped runs.

use std::rc::Rc;
use std::time::{Duration, Instant};

use benches::{raw_stream_write, reference_batch};
use broker::clock::SystemClock;
use broker::log::{FlushPolicy, LogConfig, PartitionLog};
use criterion::{criterion_group, Criterion, Throughput};
use protocol::{LeaderEpoch, Offset};

const VOLUME_BYTES: usize = 256 << 20;
const SYNC_VOLUME_BYTES: usize = 32 << 20;
const CONCURRENT_APPENDERS: usize = 8;
/// Partitions per shard and batches in flight per partition in the 1M msgs/s
/// scenario (16 partitions over two shards, five batches per producer).
const SHARD_LOGS: usize = 8;
const SHARD_IN_FLIGHT: usize = 5;
const SHARD_VOLUME_BYTES: usize = 256 << 20;

fn config(flush_policy: FlushPolicy) -> LogConfig {
    LogConfig {
        flush_policy,
        retention_ms: None,
        ..LogConfig::default()
    }
}

/// Appends `volume` bytes of reference batches; with `always`, each appender
/// waits for its batch to be durable before sending the next.
async fn append_run(flush_policy: FlushPolicy, volume: usize, appenders: usize) -> Duration {
    let dir = tempfile::tempdir_in(bench_dir()).expect("tempdir");
    let log = PartitionLog::open(dir.path(), config(flush_policy), Rc::new(SystemClock))
        .await
        .expect("open");
    let batch = Rc::new(reference_batch(7));
    let per_appender = volume / batch.len() / appenders;
    let started = Instant::now();
    let tasks: Vec<_> = (0..appenders)
        .map(|_| {
            let (log, batch) = (log.clone(), batch.clone());
            glommio::spawn_local(async move {
                for _ in 0..per_appender {
                    let info = log.append(&batch, LeaderEpoch(0)).await.expect("append");
                    log.wait_for_ack(info.log_end_offset).await.expect("ack");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await;
    }
    log.flush().await.expect("flush");
    let elapsed = started.elapsed();
    log.close().await.expect("close");
    elapsed
}

/// A shard's share of the 1M msgs/s scenario under `always`: `logs` logs on
/// one executor, each with `in_flight` appenders (the producer's batches in
/// flight per partition) that append and wait for the acknowledgement. Returns
/// the elapsed time and the acknowledgement latencies, sorted.
async fn shard_run(logs: usize, in_flight: usize, volume: usize) -> (Duration, Vec<Duration>) {
    let dirs: Vec<_> = (0..logs)
        .map(|_| tempfile::tempdir_in(bench_dir()).expect("tempdir"))
        .collect();
    let mut opened = Vec::new();
    for dir in &dirs {
        let log = PartitionLog::open(
            dir.path(),
            config(FlushPolicy::Always),
            Rc::new(SystemClock),
        )
        .await
        .expect("open");
        opened.push(log);
    }
    let batch = Rc::new(reference_batch(11));
    let per_appender = volume / batch.len() / logs / in_flight;
    let started = Instant::now();
    let tasks: Vec<_> = opened
        .iter()
        .flat_map(|log| (0..in_flight).map(move |_| log.clone()))
        .map(|log| {
            let batch = batch.clone();
            glommio::spawn_local(async move {
                let mut latencies = Vec::with_capacity(per_appender);
                for _ in 0..per_appender {
                    let sent = Instant::now();
                    let info = log.append(&batch, LeaderEpoch(0)).await.expect("append");
                    log.wait_for_ack(info.log_end_offset).await.expect("ack");
                    latencies.push(sent.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await);
    }
    let elapsed = started.elapsed();
    for log in opened {
        log.close().await.expect("close");
    }
    latencies.sort();
    (elapsed, latencies)
}

/// Reads the whole log back in 1 MiB fetches from a reopened log (so from disk).
async fn read_run(volume: usize) -> Duration {
    let dir = tempfile::tempdir_in(bench_dir()).expect("tempdir");
    {
        let log = PartitionLog::open(dir.path(), config(FlushPolicy::None), Rc::new(SystemClock))
            .await
            .expect("open");
        let batch = reference_batch(9);
        for _ in 0..volume / batch.len() {
            log.append(&batch, LeaderEpoch(0)).await.expect("append");
        }
        log.close().await.expect("close");
    }
    let log = PartitionLog::open(dir.path(), config(FlushPolicy::None), Rc::new(SystemClock))
        .await
        .expect("reopen");
    let started = Instant::now();
    let mut next = Offset(0);
    let end = log.log_end_offset();
    while next < end {
        next = log
            .read(next, 1 << 20, end)
            .await
            .expect("read")
            .next_offset;
    }
    started.elapsed()
}

fn bench_dir() -> std::path::PathBuf {
    // Direct I/O needs a real file system, not tmpfs; the target directory is one.
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench-data");
    std::fs::create_dir_all(&dir).expect("bench dir");
    dir
}

fn run<T>(f: impl std::future::Future<Output = T>) -> T {
    broker::runtime::run_local(f)
}

fn mb_per_s(bytes: usize, elapsed: Duration) -> f64 {
    bytes as f64 / elapsed.as_secs_f64() / 1e6
}

fn benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("log");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(8))
        .warm_up_time(Duration::from_secs(1));
    group.throughput(Throughput::Bytes(VOLUME_BYTES as u64));
    group.bench_function("raw_dma_stream_writer", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| run(raw_stream_write(&bench_dir().join("raw"), VOLUME_BYTES)))
                .sum()
        })
    });
    group.bench_function("append_flush_none", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| run(append_run(FlushPolicy::None, VOLUME_BYTES, 1)))
                .sum()
        })
    });
    group.bench_function("read_by_offset", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| run(read_run(VOLUME_BYTES))).sum())
    });
    group.throughput(Throughput::Bytes(SYNC_VOLUME_BYTES as u64));
    group.bench_function("append_flush_always_sequential", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| run(append_run(FlushPolicy::Always, SYNC_VOLUME_BYTES, 1)))
                .sum()
        })
    });
    group.bench_function("append_flush_always_8_appenders", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| {
                    run(append_run(
                        FlushPolicy::Always,
                        SYNC_VOLUME_BYTES,
                        CONCURRENT_APPENDERS,
                    ))
                })
                .sum()
        })
    });
    group.finish();
}

/// The shard-shaped run alone, with its acknowledgement latencies.
fn shard_summary() {
    for _ in 0..3 {
        print_shard_run(run(shard_run(
            SHARD_LOGS,
            SHARD_IN_FLIGHT,
            SHARD_VOLUME_BYTES,
        )));
    }
}

/// Prints a shard-shaped run's rate and acknowledgement latencies; returns
/// the rate in MB/s.
fn print_shard_run((elapsed, latencies): (Duration, Vec<Duration>)) -> f64 {
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3;
    let rate = mb_per_s(SHARD_VOLUME_BYTES, elapsed);
    println!(
        "append_flush_always_{SHARD_LOGS}_logs_x{SHARD_IN_FLIGHT}: {rate:.0} MB/s, ack p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        at(0.5),
        at(0.99),
        at(1.0)
    );
    rate
}

/// One more pass of each workload, measured back to back so the ratios to the
/// device rate come from the same conditions.
fn summary() {
    let rounds = 3;
    let best = |f: &dyn Fn() -> Duration| (0..rounds).map(|_| f()).min().expect("rounds");
    let raw = mb_per_s(
        VOLUME_BYTES,
        best(&|| run(raw_stream_write(&bench_dir().join("raw"), VOLUME_BYTES))),
    );
    let none = mb_per_s(
        VOLUME_BYTES,
        best(&|| run(append_run(FlushPolicy::None, VOLUME_BYTES, 1))),
    );
    let always_seq = mb_per_s(
        SYNC_VOLUME_BYTES,
        best(&|| run(append_run(FlushPolicy::Always, SYNC_VOLUME_BYTES, 1))),
    );
    let always_conc = mb_per_s(
        SYNC_VOLUME_BYTES,
        best(&|| {
            run(append_run(
                FlushPolicy::Always,
                SYNC_VOLUME_BYTES,
                CONCURRENT_APPENDERS,
            ))
        }),
    );
    let read = mb_per_s(VOLUME_BYTES, best(&|| run(read_run(VOLUME_BYTES))));
    let shard = (0..rounds)
        .map(|_| {
            print_shard_run(run(shard_run(
                SHARD_LOGS,
                SHARD_IN_FLIGHT,
                SHARD_VOLUME_BYTES,
            )))
        })
        .fold(0.0, f64::max);
    let rows = [
        ("raw_dma_stream_writer", raw),
        ("append_flush_none", none),
        ("append_flush_always_sequential", always_seq),
        ("append_flush_always_8_appenders", always_conc),
        ("append_flush_always_8_logs_x5", shard),
        ("read_by_offset", read),
    ];
    println!("\nlog throughput (best of {rounds}), 500 B records in 64 KiB batches:");
    println!("{:<34} {:>10} {:>16}", "workload", "MB/s", "of device rate");
    for (name, rate) in rows {
        println!("{name:<34} {rate:>10.0} {:>15.0}%", 100.0 * rate / raw);
    }
    let json = format!(
        "{{\n{}\n}}\n",
        rows.iter()
            .map(|(n, r)| format!(
                "  \"{n}_mb_per_s\": {r:.1},\n  \"{n}_fraction_of_device\": {:.3}",
                r / raw
            ))
            .collect::<Vec<_>>()
            .join(",\n")
    );
    let out = bench_dir().join("../bench-results");
    std::fs::create_dir_all(&out).expect("results dir");
    std::fs::write(out.join("log.json"), json).expect("write results");
}

criterion_group!(log_benches, benches);

fn main() {
    // RINGLOG_BENCH_SUMMARY_ONLY=1 skips the criterion groups: the quick report.
    if std::env::var_os("RINGLOG_BENCH_SHARD_ONLY").is_some() {
        shard_summary();
        return;
    }
    if std::env::var_os("RINGLOG_BENCH_SUMMARY_ONLY").is_none() {
        log_benches();
        Criterion::default().configure_from_args().final_summary();
    }
    summary();
}
