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

/// A log that rolls every 4 KiB (so a test spans many segments), indexes
/// every 256 B, takes batches up to 1 MiB and keeps everything, flushing
/// under `flush_policy`.
pub fn small_segments(flush_policy: broker::log::FlushPolicy) -> LogConfig {
    LogConfig {
        segment_size_bytes: 4096,
        index_interval_bytes: 256,
        write_chunk_bytes: 4096,
        unwritten_bytes_max: (1 << 20) + 4096,
        batch_bytes_max: 1 << 20,
        retention_ms: None,
        flush_policy,
        ..LogConfig::default()
    }
}

/// One stored record, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredRecord {
    pub offset: i64,
    pub timestamp_ms: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
}

/// Every batch from the log start to the log end, as stored (read back from
/// the files, `read_bytes` at a time), with its records.
pub async fn read_stored(
    log: &PartitionLog,
    read_bytes: usize,
) -> Vec<(protocol::BatchHeader, Vec<StoredRecord>)> {
    let mut out = Vec::new();
    let mut next = log.log_start_offset();
    while next < log.log_end_offset() {
        let fetched = log
            .read(next, read_bytes, log.log_end_offset())
            .await
            .unwrap();
        assert!(fetched.batch_count > 0, "progress at {next}");
        let mut rest = &fetched.bytes[..];
        while !rest.is_empty() {
            let (batch, used) = RecordBatch::parse_prefix(rest, 1 << 24).unwrap();
            let records = batch
                .records_section(1 << 26)
                .unwrap()
                .iter()
                .map(|r| {
                    let r = r.unwrap();
                    StoredRecord {
                        offset: r.offset.0,
                        timestamp_ms: r.timestamp_ms,
                        key: r.key.map(<[u8]>::to_vec),
                        value: r.value.map(<[u8]>::to_vec),
                    }
                })
                .collect();
            out.push((*batch.header(), records));
            rest = &rest[used..];
        }
        next = fetched.next_offset;
    }
    out
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

/// Makes a file or directory immutable for as long as it lives (`chattr
/// +i`, root on a file system with attributes): writes to a file then fail
/// with EPERM, even through descriptors opened before, and a directory
/// takes no new entries.
pub struct Immutable(Option<std::path::PathBuf>);

fn chattr(flag: &str, path: &std::path::Path) -> bool {
    std::process::Command::new("chattr")
        .arg(flag)
        .arg(path)
        .status()
        .is_ok_and(|s| s.success())
}

impl Immutable {
    pub fn new(path: &std::path::Path) -> Immutable {
        assert!(
            chattr("+i", path),
            "chattr +i needs root and a file system with attributes"
        );
        Immutable(Some(path.to_path_buf()))
    }

    /// Makes it writable again, and says whether that worked.
    pub fn release(mut self) -> bool {
        let path = self.0.take().expect("released once");
        chattr("-i", &path)
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            chattr("-i", &path);
        }
    }
}
