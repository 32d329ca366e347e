//! `verify-log`: an offline check of a partition directory. It walks every
//! segment, validates each batch (header, CRC, offset and epoch continuity,
//! every record), checks the index files against the batches, and names the
//! file and byte position of each problem. It never modifies the directory.

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use protocol::{LeaderEpoch, Offset, RecordBatch};

use super::index::{OffsetIndex, TimeIndex};
use super::scan::{ScanDepth, ScanError, SegmentScanner};
use super::segment::{
    parse_segment_name, segment_path, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX,
};
use crate::runtime::DirectFile;

#[derive(Clone, Copy, Debug)]
pub struct VerifyOptions {
    /// Print one line per batch.
    pub print: bool,
    pub batch_bytes_max: usize,
    pub decompressed_bytes_max: usize,
}

impl Default for VerifyOptions {
    fn default() -> VerifyOptions {
        VerifyOptions {
            print: false,
            batch_bytes_max: 64 << 20,
            decompressed_bytes_max: 256 << 20,
        }
    }
}

/// A problem found, located to the byte.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub file: PathBuf,
    pub position: u64,
    pub reason: String,
}

#[derive(Clone, Debug, Default)]
pub struct VerifyReport {
    pub segments: usize,
    pub batches: u64,
    pub records: u64,
    pub bytes: u64,
    pub problems: Vec<Problem>,
    /// Index files that are absent; the broker rebuilds them, so they are notes.
    pub missing_indexes: Vec<PathBuf>,
}

impl VerifyReport {
    pub fn first_problem(&self) -> Option<&Problem> {
        self.problems.first()
    }
}

/// Verifies the partition directory `dir`, writing per-batch lines to `out`
/// when `options.print` is set.
pub async fn verify_partition_dir(
    dir: &Path,
    options: VerifyOptions,
    out: &mut dyn Write,
) -> io::Result<VerifyReport> {
    let mut bases: Vec<Offset> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            parse_segment_name(&name)
                .filter(|(_, s)| *s == LOG_SUFFIX)
                .map(|(b, _)| b)
        })
        .collect();
    bases.sort();
    let mut report = VerifyReport::default();
    let mut expected: Option<Offset> = None;
    let mut epoch = LeaderEpoch(0);
    for base in bases {
        report.segments += 1;
        let path = segment_path(dir, base, LOG_SUFFIX);
        if let Some(expected) = expected {
            if expected != base {
                report.problems.push(Problem {
                    file: path.clone(),
                    position: 0,
                    reason: format!(
                        "segment starts at offset {base} but the previous one ends at {expected}"
                    ),
                });
            }
        }
        let outcome = verify_segment(dir, base, &path, epoch, options, out, &mut report).await?;
        expected = Some(outcome.0);
        epoch = outcome.1;
    }
    Ok(report)
}

async fn verify_segment(
    dir: &Path,
    base: Offset,
    path: &Path,
    epoch: LeaderEpoch,
    options: VerifyOptions,
    out: &mut dyn Write,
    report: &mut VerifyReport,
) -> io::Result<(Offset, LeaderEpoch)> {
    let file = DirectFile::open_read(path).await?;
    let size = file.size_bytes().await?;
    let mut scanner = SegmentScanner::new(
        file,
        size,
        0,
        Some(base),
        options.batch_bytes_max,
        ScanDepth::Crc,
    )
    .with_latest_epoch(epoch);
    // position -> (base offset, cumulative max timestamp through this batch)
    let mut starts: HashMap<u64, (Offset, i64)> = HashMap::new();
    let mut next = base;
    let mut max_timestamp_ms = -1;
    let mut valid_bytes = 0;
    loop {
        match scanner.next().await {
            Ok(Some(batch)) => {
                let header = batch.header;
                let bytes = scanner.last_bytes();
                let parsed = RecordBatch::parse(bytes, options.batch_bytes_max)
                    .expect("scanner validated it");
                if let Err(e) = parsed.validate_records(options.decompressed_bytes_max) {
                    report.problems.push(Problem {
                        file: path.to_path_buf(),
                        position: batch.position,
                        reason: format!("records of batch at offset {}: {e}", header.base_offset),
                    });
                    break;
                }
                max_timestamp_ms = max_timestamp_ms.max(header.max_timestamp_ms);
                starts.insert(batch.position, (header.base_offset, max_timestamp_ms));
                if options.print {
                    writeln!(
                        out,
                        "baseOffset: {} lastOffset: {} count: {} position: {} size: {} epoch: {} codec: {} baseTimestamp: {} maxTimestamp: {} producerId: {} crc: {:#010x} valid",
                        header.base_offset, header.last_offset(), header.record_count, batch.position, header.total_bytes(),
                        header.partition_leader_epoch, header.compression().name(), header.base_timestamp_ms, header.max_timestamp_ms,
                        header.producer_id.0, header.crc
                    )?;
                }
                report.batches += 1;
                report.records += header.record_count as u64;
                next = header.next_offset();
                valid_bytes = batch.end_position();
            }
            Ok(None) => break,
            Err(ScanError::Io(e)) => return Err(e),
            Err(ScanError::Corrupt { position, reason }) => {
                report.problems.push(Problem {
                    file: path.to_path_buf(),
                    position,
                    reason,
                });
                break;
            }
        }
    }
    report.bytes += valid_bytes;
    verify_indexes(dir, base, size, next, &starts, report)?;
    Ok((next, scanner.latest_epoch()))
}

fn verify_indexes(
    dir: &Path,
    base: Offset,
    size: u64,
    next: Offset,
    starts: &HashMap<u64, (Offset, i64)>,
    report: &mut VerifyReport,
) -> io::Result<()> {
    let span = (next.0 - base.0).max(1) as u64;
    let index_path = segment_path(dir, base, INDEX_SUFFIX);
    match std::fs::read(&index_path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => report.missing_indexes.push(index_path),
        Err(e) => return Err(e),
        Ok(bytes) => match OffsetIndex::decode(&bytes, size.max(1), span) {
            Err(e) => report.problems.push(Problem {
                file: index_path,
                position: 0,
                reason: e.to_string(),
            }),
            Ok(index) => {
                for (i, entry) in index.entries().iter().enumerate() {
                    let offset = Offset(base.0 + i64::from(entry.relative_offset));
                    if starts.get(&u64::from(entry.position)).map(|s| s.0) != Some(offset) {
                        report.problems.push(Problem {
                            file: index_path.clone(),
                            position: (super::index::INDEX_HEADER_BYTES + i * super::index::OFFSET_ENTRY_BYTES) as u64,
                            reason: format!("entry {i} maps offset {offset} to byte {}, which is not the start of that batch", entry.position),
                        });
                        break;
                    }
                }
            }
        },
    }
    let time_path = segment_path(dir, base, TIME_INDEX_SUFFIX);
    match std::fs::read(&time_path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => report.missing_indexes.push(time_path),
        Err(e) => return Err(e),
        Ok(bytes) => match TimeIndex::decode(&bytes, span) {
            Err(e) => report.problems.push(Problem {
                file: time_path,
                position: 0,
                reason: e.to_string(),
            }),
            Ok(index) => {
                let by_offset: HashMap<Offset, i64> = starts.values().copied().collect();
                for (i, entry) in index.entries().iter().enumerate() {
                    let offset = Offset(base.0 + i64::from(entry.relative_offset));
                    if by_offset.get(&offset) != Some(&entry.timestamp_ms) {
                        report.problems.push(Problem {
                            file: time_path.clone(),
                            position: (super::index::INDEX_HEADER_BYTES + i * super::index::TIME_ENTRY_BYTES) as u64,
                            reason: format!("entry {i} says the newest timestamp through offset {offset} is {}, the batches disagree", entry.timestamp_ms),
                        });
                        break;
                    }
                }
            }
        },
    }
    Ok(())
}
