//! Cleaner throughput: one compaction pass over a log of 500 B keyed records
//! in 64 KiB batches (uncompressed and zstd), with 100 000 distinct keys
//! updated uniformly, so most records are superseded. Reports how fast the
//! pass went through the log (log bytes per second; it reads the log twice,
//! once for the key map and once to rewrite it), what it wrote, and what
//! share of the log it kept; writes them to
//! `target/bench-results/compaction.json`.
//!
//! Run: `cargo bench -p benches --bench compaction` (about a minute).

use std::rc::Rc;
use std::time::Instant;

use broker::clock::SystemClock;
use broker::log::{CleanRequest, CleanupPolicy, FlushPolicy, LogConfig, PartitionLog};
use protocol::{BatchBuilder, Compression, LeaderEpoch, Record};

const VOLUME_BYTES: usize = 256 << 20;
const KEYS: u64 = 100_000;
const RECORD_VALUE_BYTES: usize = 500;
const BATCH_BYTES: usize = 64 * 1024;

fn config() -> LogConfig {
    LogConfig {
        flush_policy: FlushPolicy::None,
        retention_ms: None,
        segment_size_bytes: 64 << 20,
        cleanup_policy: CleanupPolicy::COMPACT,
        min_cleanable_dirty_ratio_permille: 0,
        ..LogConfig::default()
    }
}

fn keyed_batch(rng: &mut fastrand::Rng, compression: Compression) -> Vec<u8> {
    let mut builder = BatchBuilder::new(compression);
    let mut value = vec![0u8; RECORD_VALUE_BYTES];
    loop {
        // Half random, half repeated bytes: about 2:1 under zstd, like JSON events.
        rng.fill(&mut value[..RECORD_VALUE_BYTES / 2]);
        let key = format!("key-{:06}", rng.u64(..KEYS));
        let record = Record {
            timestamp_ms: 1_700_000_000_000,
            key: Some(key.as_bytes()),
            value: Some(&value),
            headers: &[],
        };
        if builder.size_bytes_uncompressed() + builder.record_size_bytes(&record) > BATCH_BYTES {
            break;
        }
        builder.push(&record);
    }
    builder.build().expect("non-empty batch")
}

struct Outcome {
    log_bytes: u64,
    cleaned_mb_per_s: f64,
    written_bytes: u64,
    kept_fraction: f64,
}

async fn clean_run(compression: Compression) -> Outcome {
    let dir_root =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench-data");
    std::fs::create_dir_all(&dir_root).expect("bench dir");
    let dir = tempfile::tempdir_in(dir_root).expect("tempdir");
    let log = PartitionLog::open(dir.path(), config(), Rc::new(SystemClock))
        .await
        .expect("open");
    let mut rng = fastrand::Rng::with_seed(11);
    let mut written = 0;
    while written < VOLUME_BYTES {
        let batch = keyed_batch(&mut rng, compression);
        written += batch.len();
        log.append(&batch, LeaderEpoch(0)).await.expect("append");
    }
    log.flush().await.expect("flush");
    let log_bytes = log.size_bytes();
    let started = Instant::now();
    let report = log
        .clean(&CleanRequest {
            end_limit: log.log_end_offset(),
            map_memory_bytes: 32 << 20,
            io_bytes_per_sec_max: 0,
            zstd_level: 1,
            stop_swap_after: None,
        })
        .await
        .expect("clean");
    let elapsed = started.elapsed();
    log.close().await.expect("close");
    Outcome {
        log_bytes,
        cleaned_mb_per_s: log_bytes as f64 / elapsed.as_secs_f64() / 1e6,
        written_bytes: report.bytes_written,
        kept_fraction: log.size_bytes() as f64 / log_bytes as f64,
    }
}

fn main() {
    let mut rows = Vec::new();
    for (name, compression) in [("none", Compression::None), ("zstd", Compression::Zstd)] {
        let outcome = broker::runtime::run_local(clean_run(compression));
        rows.push((name, outcome));
    }
    println!("\ncleaner, one pass over 256 MiB of 500 B records, {KEYS} keys:");
    println!(
        "{:<6} {:>12} {:>14} {:>14} {:>8}",
        "codec", "log MiB", "cleaned MB/s", "written MiB", "kept"
    );
    for (name, o) in &rows {
        println!(
            "{name:<6} {:>12.0} {:>14.0} {:>14.1} {:>7.1}%",
            o.log_bytes as f64 / (1 << 20) as f64,
            o.cleaned_mb_per_s,
            o.written_bytes as f64 / (1 << 20) as f64,
            100.0 * o.kept_fraction
        );
    }
    let json = format!(
        "{{\n{}\n}}\n",
        rows.iter()
            .map(|(n, o)| format!(
                "  \"{n}_cleaned_mb_per_s\": {:.1},\n  \"{n}_kept_fraction\": {:.3}",
                o.cleaned_mb_per_s, o.kept_fraction
            ))
            .collect::<Vec<_>>()
            .join(",\n")
    );
    let out = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench-results");
    std::fs::create_dir_all(&out).expect("results dir");
    std::fs::write(out.join("compaction.json"), json).expect("write results");
}
