//! Opening a partition directory: trust segments the recovery point covers,
//! rescan and validate the rest batch by batch, cut the log at the first
//! invalid byte, drop everything after it, and rebuild missing or damaged
//! indexes. Trusted segments are checked from their last index entry on; every
//! read from disk checks the CRC again, so nothing invalid is served.

use std::collections::VecDeque;
use std::path::Path;

use protocol::{LeaderEpoch, Offset};

use super::checkpoint;
use super::config::{LogConfig, STORED_BATCH_BYTES_MAX};
use super::error::{LogError, LogResult};
use super::index::{OffsetIndex, TimeIndex};
use super::scan::{ScanDepth, ScanError, SegmentScanner};
use super::segment::{
    parse_segment_name, segment_path, write_small_file, Segment, INDEX_SUFFIX, LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
};
use super::tail::Tail;
use crate::runtime::{self, DirectFile, DIRECT_IO_ALIGNMENT_BYTES};

#[derive(Debug)]
pub(super) struct Recovered {
    pub segments: VecDeque<Segment>,
    /// The recovery point the directory's checkpoint held, if any.
    pub recovery_point: Option<Offset>,
    /// Segments read through and checked batch by batch, not trusted.
    pub rescanned_segments: u64,
}

/// A segment rebuilt by a full scan, and where its valid bytes ended if they
/// ended before the file did.
#[derive(Debug)]
pub(super) struct Rebuilt {
    pub segment: Segment,
    pub corruption: Option<(u64, String)>,
}

/// `closed_clean`: the data dir's record of a clean shutdown names this log
/// (`checkpoint::take_clean_logs`), so it is trusted as its own marker is.
pub(super) async fn recover(
    dir: &Path,
    config: &LogConfig,
    now_ms: i64,
    closed_clean: bool,
) -> LogResult<Recovered> {
    super::swap::recover_swaps(dir).await?;
    // Directory listing and the marker's removal (with its directory fsync)
    // block: they run on the blocking threads, so a shard opening thousands
    // of partitions keeps serving and overlaps their fsyncs.
    let (bases, clean, recovery_point) = {
        let dir = dir.to_path_buf();
        runtime::blocking(move || -> LogResult<_> {
            let bases = list_segments(&dir)?;
            // A marker of its own (written by `close`) is removed either way.
            let marked =
                checkpoint::take_clean_shutdown(&dir).map_err(|e| LogError::io(&dir, e))?;
            let clean = marked || closed_clean;
            let recovery_point =
                checkpoint::read_recovery_point(&dir).map_err(|e| LogError::io(&dir, e))?;
            Ok((bases, clean, recovery_point))
        })
        .await?
    };
    let mut segments: VecDeque<Segment> = VecDeque::new();
    let mut rescanned_segments = 0;
    for (i, &base) in bases.iter().enumerate() {
        if let Some(previous) = segments.back() {
            if previous.next_offset != base {
                tracing::warn!(dir = %dir.display(), expected = %previous.next_offset, found = %base, "segment does not continue the log; dropping it and later segments");
                remove_segments(dir, &bases[i..])?;
                break;
            }
        }
        let path = segment_path(dir, base, LOG_SUFFIX);
        let file = DirectFile::open_read_write(&path)
            .await
            .map_err(|e| LogError::io(&path, e))?;
        let file_bytes = file
            .size_bytes()
            .await
            .map_err(|e| LogError::io(&path, e))?;
        let next_base = bases.get(i + 1).copied();
        let latest_epoch = segments.back().map_or(LeaderEpoch(0), |s| s.latest_epoch);
        let trusted = clean
            || matches!((next_base, recovery_point), (Some(next), Some(point)) if next <= point);
        let loaded = if trusted {
            let on_disk = OnDisk {
                base,
                file: &file,
                file_bytes,
                next_base,
                latest_epoch,
            };
            load_trusted(dir, &on_disk, config, now_ms).await?
        } else {
            None
        };
        let rebuilt = match loaded {
            Some(segment) => Rebuilt {
                segment,
                corruption: None,
            },
            None => {
                rescanned_segments += 1;
                // Bytes found after a crash may be in the kernel or the device
                // only: sync them before a recovery point vouches for them.
                file.mark_untrusted();
                let rebuilt =
                    scan_segment(dir, base, &file, file_bytes, latest_epoch, config, now_ms)
                        .await?;
                file.fdatasync().await.map_err(|e| LogError::io(&path, e))?;
                if next_base.is_some() && rebuilt.corruption.is_none() {
                    // A closed segment's indexes are never written again: persist the rebuilt ones.
                    write_index_files(dir, &rebuilt.segment).await?;
                }
                rebuilt
            }
        };
        let mut rebuilt = rebuilt;
        if let Some((position, _)) = &rebuilt.corruption {
            if next_base == Some(rebuilt.segment.next_offset) {
                // A rolled segment not finished before the crash: its valid
                // batches reach the next segment's base, and what follows
                // them (the alignment padding its finish would have cut) can
                // hold nothing of the log. Cut it and go on.
                tracing::info!(file = %path.display(), position, "cutting the padding of a rolled segment never finished");
                file.truncate(*position)
                    .await
                    .map_err(|e| LogError::io(&path, e))?;
                file.fdatasync().await.map_err(|e| LogError::io(&path, e))?;
                write_index_files(dir, &rebuilt.segment).await?;
                rebuilt.corruption = None;
            }
        }
        let corrupted = rebuilt.corruption.is_some();
        if let Some((position, reason)) = &rebuilt.corruption {
            tracing::warn!(file = %path.display(), position, reason = %reason, "truncating the log at the first invalid byte");
            file.truncate(*position)
                .await
                .map_err(|e| LogError::io(&path, e))?;
            file.fdatasync().await.map_err(|e| LogError::io(&path, e))?;
            remove_segments(dir, &bases[i + 1..])?;
        }
        segments.push_back(rebuilt.segment);
        if corrupted {
            break;
        }
    }
    if segments.is_empty() {
        segments.push_back(Segment::new_active(
            Offset::ZERO,
            now_ms,
            config.write_chunk_bytes,
            config.index_interval_bytes,
        ));
    }
    let last = segments.back_mut().expect("segment");
    if last.tail.is_none() {
        activate(dir, last, config).await?;
    }
    Ok(Recovered {
        segments,
        recovery_point,
        rescanned_segments,
    })
}

/// The state of the empty log `create_empty_logs` just made in `dir` (an
/// empty first segment, nothing else of the log's own): nothing to list,
/// check or rebuild.
pub(super) async fn empty(dir: &Path, config: &LogConfig, now_ms: i64) -> LogResult<Recovered> {
    let path = segment_path(dir, Offset::ZERO, LOG_SUFFIX);
    let file = DirectFile::open_read_write(&path)
        .await
        .map_err(|e| LogError::io(&path, e))?;
    let mut segment = Segment::new_active(
        Offset::ZERO,
        now_ms,
        config.write_chunk_bytes,
        config.index_interval_bytes,
    );
    segment.file = Some(file);
    activate(dir, &mut segment, config).await?;
    Ok(Recovered {
        segments: VecDeque::from([segment]),
        recovery_point: None,
        rescanned_segments: 0,
    })
}

fn list_segments(dir: &Path) -> LogResult<Vec<Offset>> {
    let mut bases = Vec::new();
    let mut indexes = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| LogError::io(dir, e))? {
        let entry = entry.map_err(|e| LogError::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".tmp") {
            std::fs::remove_file(entry.path()).map_err(|e| LogError::io(entry.path(), e))?;
            continue;
        }
        match parse_segment_name(&name) {
            Some((base, LOG_SUFFIX)) => bases.push(base),
            Some((base, INDEX_SUFFIX | TIME_INDEX_SUFFIX)) => indexes.push((base, entry.path())),
            _ => {}
        }
    }
    bases.sort();
    for (base, path) in indexes {
        if bases.binary_search(&base).is_err() {
            std::fs::remove_file(&path).map_err(|e| LogError::io(&path, e))?;
        }
    }
    Ok(bases)
}

fn remove_segments(dir: &Path, bases: &[Offset]) -> LogResult<()> {
    for &base in bases {
        for suffix in [LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
            let path = segment_path(dir, base, suffix);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(LogError::io(&path, e)),
            }
        }
    }
    checkpoint::sync_dir(dir).map_err(|e| LogError::io(dir, e))
}

async fn write_index_files(dir: &Path, segment: &Segment) -> LogResult<()> {
    write_small_file(
        &segment_path(dir, segment.base, INDEX_SUFFIX),
        &segment.offset_index.encode(),
    )
    .await?;
    write_small_file(
        &segment_path(dir, segment.base, TIME_INDEX_SUFFIX),
        &segment.time_index.encode(),
    )
    .await
}

async fn read_small_file(path: &Path) -> LogResult<Option<Vec<u8>>> {
    let file = match DirectFile::open_read(path).await {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(LogError::io(path, e)),
    };
    let size = file.size_bytes().await.map_err(|e| LogError::io(path, e))?;
    let bytes = file
        .read_at(0, size as usize)
        .await
        .map_err(|e| LogError::io(path, e))?;
    Ok(Some(bytes.to_vec()))
}

/// A segment file found at open, with what its neighbours tell about it.
#[derive(Clone, Copy)]
struct OnDisk<'a> {
    base: Offset,
    file: &'a DirectFile,
    file_bytes: u64,
    /// Base of the next segment, which is where this one must end.
    next_base: Option<Offset>,
    /// Last epoch of the previous segment; this one may not go below it.
    latest_epoch: LeaderEpoch,
}

/// Loads a segment the recovery point vouches for from its index files, then
/// checks the batches after the last index entry (which also proves that entry
/// right). Returns `None` when anything disagrees, and the caller rescans.
async fn load_trusted(
    dir: &Path,
    on_disk: &OnDisk<'_>,
    config: &LogConfig,
    now_ms: i64,
) -> LogResult<Option<Segment>> {
    let OnDisk {
        base,
        file,
        file_bytes,
        next_base,
        latest_epoch,
    } = *on_disk;
    if file_bytes == 0 {
        // Nothing to check, and no index needed: a new log's close leaves
        // its empty segment without index files. Only the last segment may
        // be empty.
        if next_base.is_some() {
            return Ok(None);
        }
        let scanned = scan_segment(dir, base, file, 0, latest_epoch, config, now_ms).await?;
        return Ok(Some(scanned.segment));
    }
    let span = next_base.map_or(u64::from(u32::MAX) + 1, |next| (next.0 - base.0) as u64);
    let (Some(index_bytes), Some(time_bytes)) = (
        read_small_file(&segment_path(dir, base, INDEX_SUFFIX)).await?,
        read_small_file(&segment_path(dir, base, TIME_INDEX_SUFFIX)).await?,
    ) else {
        return Ok(None);
    };
    let (Ok(offset_index), Ok(time_index)) = (
        OffsetIndex::decode(&index_bytes, file_bytes, span),
        TimeIndex::decode(&time_bytes, span),
    ) else {
        tracing::warn!(dir = %dir.display(), %base, "index files are damaged; rebuilding");
        return Ok(None);
    };
    let last = offset_index.lookup(u32::MAX);
    let start = Offset(base.0 + i64::from(last.relative_offset));
    let mut segment = Segment {
        base,
        next_offset: start,
        size_bytes: u64::from(last.position),
        max_timestamp_ms: time_index.last().map_or(-1, |e| e.timestamp_ms),
        created_ms: now_ms,
        latest_epoch,
        offset_index,
        time_index,
        bytes_since_index_entry: 0,
        file: Some(file.clone()),
        tail: None,
        closing: false,
        allocated_bytes: 0,
    };
    let mut scanner = SegmentScanner::new(
        file.clone(),
        file_bytes,
        u64::from(last.position),
        Some(start),
        STORED_BATCH_BYTES_MAX,
        ScanDepth::Headers,
    );
    loop {
        match scanner.next().await {
            Ok(Some(batch)) => segment.account_batch(&batch.header, config.index_interval_bytes),
            Ok(None) => break,
            Err(ScanError::Io(e)) => return Err(LogError::io(dir, e)),
            Err(ScanError::Corrupt { .. }) => return Ok(None),
        }
    }
    if next_base.is_some_and(|next| next != segment.next_offset) || segment.size_bytes != file_bytes
    {
        return Ok(None);
    }
    Ok(Some(segment))
}

/// Validates a whole segment file batch by batch (CRC, offsets, epochs) and
/// builds its indexes from what is valid.
pub(super) async fn scan_segment(
    dir: &Path,
    base: Offset,
    file: &DirectFile,
    file_bytes: u64,
    latest_epoch: LeaderEpoch,
    config: &LogConfig,
    now_ms: i64,
) -> LogResult<Rebuilt> {
    let mut segment = Segment::new_active(
        base,
        now_ms,
        config.write_chunk_bytes,
        config.index_interval_bytes,
    );
    segment.tail = None;
    segment.file = Some(file.clone());
    segment.latest_epoch = latest_epoch;
    let mut scanner = SegmentScanner::new(
        file.clone(),
        file_bytes,
        0,
        Some(base),
        STORED_BATCH_BYTES_MAX,
        ScanDepth::Crc,
    )
    .with_latest_epoch(latest_epoch);
    let mut corruption = None;
    loop {
        match scanner.next().await {
            Ok(Some(batch)) => segment.account_batch(&batch.header, config.index_interval_bytes),
            Ok(None) => break,
            Err(ScanError::Io(e)) => {
                return Err(LogError::io(segment_path(dir, base, LOG_SUFFIX), e))
            }
            Err(ScanError::Corrupt { position, reason }) => {
                corruption = Some((position, reason));
                break;
            }
        }
    }
    Ok(Rebuilt {
        segment,
        corruption,
    })
}

/// Makes a segment the active one: loads the partial last page its next write
/// will rewrite.
pub(super) async fn activate(
    dir: &Path,
    segment: &mut Segment,
    config: &LogConfig,
) -> LogResult<()> {
    let size = segment.size_bytes;
    let page_start = size - size % DIRECT_IO_ALIGNMENT_BYTES;
    let partial = match &segment.file {
        Some(file) if size > page_start => {
            let path = segment_path(dir, segment.base, LOG_SUFFIX);
            let bytes = file
                .read_at(page_start, (size - page_start) as usize)
                .await
                .map_err(|e| LogError::io(&path, e))?;
            if bytes.len() as u64 != size - page_start {
                return Err(LogError::Corrupt {
                    path,
                    position: page_start,
                    reason: "short read of the last page".into(),
                });
            }
            bytes.to_vec()
        }
        _ => Vec::new(),
    };
    segment.tail = Some(Tail::new(config.write_chunk_bytes, size, &partial));
    segment.closing = false;
    if segment.bytes_since_index_entry == 0 && segment.offset_index.entries().is_empty() {
        segment.bytes_since_index_entry = u64::from(config.index_interval_bytes);
    }
    Ok(())
}

/// Rebuilds the segment `base` from its file's first `file_bytes` bytes and
/// makes it active (after truncation).
pub(super) async fn rebuild_segment(
    dir: &Path,
    base: Offset,
    file: &DirectFile,
    file_bytes: u64,
    config: &LogConfig,
    now_ms: i64,
) -> LogResult<Rebuilt> {
    let mut rebuilt =
        scan_segment(dir, base, file, file_bytes, LeaderEpoch(0), config, now_ms).await?;
    if let Some((position, reason)) = &rebuilt.corruption {
        return Err(LogError::Corrupt {
            path: segment_path(dir, base, LOG_SUFFIX),
            position: *position,
            reason: reason.clone(),
        });
    }
    activate(dir, &mut rebuilt.segment, config).await?;
    Ok(rebuilt)
}
