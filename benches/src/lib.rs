//! Shared workloads for the benchmarks: batches shaped like the reference
//! workload (500 B records in 64 KiB batches) and the raw device baseline.

use std::path::Path;
use std::time::{Duration, Instant};

use futures_lite::AsyncWriteExt;
use protocol::{BatchBuilder, Compression, Record};

/// Size of each record's value in the reference workload.
pub const RECORD_VALUE_BYTES: usize = 500;
/// Producer batch bound of the reference workload.
pub const BATCH_BYTES: usize = 64 * 1024;

/// One uncompressed batch of ~64 KiB holding 500 B records of random bytes.
pub fn reference_batch(seed: u64) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut builder = BatchBuilder::new(Compression::None);
    let mut value = vec![0u8; RECORD_VALUE_BYTES];
    loop {
        rng.fill(&mut value);
        let key = rng.u64(..).to_be_bytes();
        let record = Record {
            timestamp_ms: 1_700_000_000_000,
            key: Some(&key),
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

/// Writes `total_bytes` with glommio's `DmaStreamWriter` (1 MiB buffers, 4
/// write-behind) and one final sync: the device's direct-write rate, the
/// ceiling for the log's append throughput.
pub async fn raw_stream_write(path: &Path, total_bytes: usize) -> Duration {
    let file = glommio::io::DmaFile::create(path).await.expect("create");
    let mut writer = glommio::io::DmaStreamWriterBuilder::new(file)
        .with_buffer_size(1 << 20)
        .with_write_behind(4)
        .build();
    let chunk = reference_batch(1);
    let started = Instant::now();
    let mut written = 0;
    while written < total_bytes {
        writer.write_all(&chunk).await.expect("write");
        written += chunk.len();
    }
    writer.sync().await.expect("sync");
    let elapsed = started.elapsed();
    writer.close().await.expect("close");
    let _ = std::fs::remove_file(path);
    elapsed
}
