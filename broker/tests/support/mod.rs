//! Shared helpers for the log tests: batches with known contents and a runner
//! that drives a test future on a fresh executor.

#![allow(dead_code)]

use std::rc::Rc;

use broker::clock::ManualClock;
use broker::log::{LogConfig, PartitionLog};
use protocol::{BatchBuilder, Compression, Record, RecordBatch};

pub fn run<T>(future: impl std::future::Future<Output = T>) -> T {
    broker::runtime::run_local(future)
}

/// A batch of `count` records whose values name `tag` and their index.
pub fn batch(tag: u64, count: usize, timestamp_ms: i64, value_bytes: usize) -> Vec<u8> {
    let mut builder = BatchBuilder::new(if tag.is_multiple_of(2) {
        Compression::None
    } else {
        Compression::Zstd
    });
    for i in 0..count {
        let mut value = format!("{tag}:{i}:").into_bytes();
        value.resize(value_bytes.max(value.len()), b'x');
        builder.push(&Record {
            timestamp_ms: timestamp_ms + i as i64,
            key: Some(b"key"),
            value: Some(&value),
            headers: &[],
        });
    }
    builder.build().expect("batch builds")
}

/// Splits fetched bytes into (base offset, record count, values).
pub fn decode(bytes: &[u8]) -> Vec<(i64, Vec<Vec<u8>>)> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let (batch, used) =
            RecordBatch::parse_prefix(rest, 1 << 24).expect("served batches are valid");
        let section = batch.records_section(1 << 26).expect("records decode");
        let values = section
            .iter()
            .map(|r| r.expect("record").value.expect("value").to_vec())
            .collect();
        out.push((batch.header().base_offset.0, values));
        rest = &rest[used..];
    }
    out
}

pub fn small_config() -> LogConfig {
    LogConfig {
        segment_size_bytes: 64 * 1024,
        index_interval_bytes: 1024,
        write_chunk_bytes: 16 * 1024,
        unwritten_bytes_max: (4 << 20) + 16 * 1024,
        batch_bytes_max: 1 << 20,
        retention_ms: None,
        ..LogConfig::default()
    }
}

pub async fn open(
    dir: &std::path::Path,
    config: LogConfig,
    clock: &Rc<ManualClock>,
) -> Rc<PartitionLog> {
    PartitionLog::open(dir, config, clock.clone())
        .await
        .expect("log opens")
}

pub mod cluster;
