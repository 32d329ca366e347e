//! Replacing closed segments with their compacted version so that a crash at
//! any step leaves either the old segments or the new one, never a mix and
//! never neither. The new files are written as `{base}.{suffix}.cleaned` and
//! synced; renaming the `.log.cleaned` to `.log.swap` (after the indexes) and
//! syncing the directory commits the swap; then the replaced segments go and
//! the `.swap` files take their final names. Recovery deletes `.cleaned`
//! files (an uncommitted swap) and finishes every committed one.

use std::io;
use std::path::{Path, PathBuf};

use protocol::Offset;

use super::checkpoint;
use super::config::STORED_BATCH_BYTES_MAX;
use super::error::{LogError, LogResult};
use super::scan::{ScanDepth, SegmentScanner};
use super::segment::{
    parse_segment_name, remove_if_exists, segment_path, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX,
};
use crate::runtime::DirectFile;

pub const CLEANED_SUFFIX: &str = "cleaned";
pub const SWAP_SUFFIX: &str = "swap";

/// The files of one segment, in the order a swap renames them: the log last,
/// since its `.swap` name is the commit point.
const SEGMENT_SUFFIXES: [&str; 3] = [INDEX_SUFFIX, TIME_INDEX_SUFFIX, LOG_SUFFIX];

pub fn staged_path(dir: &Path, base: Offset, suffix: &str, stage: &str) -> PathBuf {
    let mut path = segment_path(dir, base, suffix).into_os_string();
    path.push(".");
    path.push(stage);
    PathBuf::from(path)
}

/// A step of the swap after which a test may stop it, as a crash would.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SwapStep {
    /// The `.cleaned` files are written and synced.
    Written,
    /// Index files renamed to `.swap`, the log not yet.
    IndexesStaged,
    /// The log renamed to `.swap` and the directory synced: committed.
    Committed,
    /// Some replaced segments deleted.
    OldPartlyRemoved,
    /// Every replaced segment deleted.
    OldRemoved,
    /// Done: final names, directory synced.
    Done,
}

impl SwapStep {
    pub const ALL: [SwapStep; 6] = [
        SwapStep::Written,
        SwapStep::IndexesStaged,
        SwapStep::Committed,
        SwapStep::OldPartlyRemoved,
        SwapStep::OldRemoved,
        SwapStep::Done,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SwapStep::Written => "written",
            SwapStep::IndexesStaged => "indexes-staged",
            SwapStep::Committed => "committed",
            SwapStep::OldPartlyRemoved => "old-partly-removed",
            SwapStep::OldRemoved => "old-removed",
            SwapStep::Done => "done",
        }
    }

    pub fn from_name(name: &str) -> Option<SwapStep> {
        SwapStep::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// Commits and finishes the swap of `replaced` (bases, oldest first; the first
/// is `base`) by the cleaned segment `base`. Blocking: run it on the runtime's
/// blocking thread. `stop_after` ends it early, as a crash would, for tests.
pub fn swap_in(
    dir: &Path,
    base: Offset,
    replaced: &[Offset],
    stop_after: Option<SwapStep>,
) -> LogResult<()> {
    assert_eq!(
        replaced.first(),
        Some(&base),
        "a group keeps its first base"
    );
    let stop = |step| stop_after.is_some_and(|s| s <= step);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |e| LogError::io(path, e)
    };
    if stop(SwapStep::Written) {
        return Ok(());
    }
    for suffix in SEGMENT_SUFFIXES {
        let from = staged_path(dir, base, suffix, CLEANED_SUFFIX);
        let to = staged_path(dir, base, suffix, SWAP_SUFFIX);
        std::fs::rename(&from, &to).map_err(io(&from))?;
        if suffix == TIME_INDEX_SUFFIX && stop(SwapStep::IndexesStaged) {
            return Ok(());
        }
    }
    checkpoint::sync_dir(dir).map_err(io(dir))?;
    if stop(SwapStep::Committed) {
        return Ok(());
    }
    remove_replaced(dir, &replaced[1..], || stop(SwapStep::OldPartlyRemoved))?;
    if stop(SwapStep::OldRemoved) {
        return Ok(());
    }
    finish(dir, base)
}

/// Removes the segments at `bases`, newest first, then syncs the directory.
fn remove_replaced(dir: &Path, bases: &[Offset], stop_midway: impl Fn() -> bool) -> LogResult<()> {
    for (i, &base) in bases.iter().rev().enumerate() {
        for suffix in SEGMENT_SUFFIXES {
            remove_if_exists(&segment_path(dir, base, suffix))?;
        }
        if i == 0 && bases.len() > 1 && stop_midway() {
            return Ok(());
        }
    }
    checkpoint::sync_dir(dir).map_err(|e| LogError::io(dir, e))
}

/// Gives a committed swap's files their final names (the old first segment's
/// files are replaced by the renames) and syncs the directory.
fn finish(dir: &Path, base: Offset) -> LogResult<()> {
    for suffix in SEGMENT_SUFFIXES {
        let from = staged_path(dir, base, suffix, SWAP_SUFFIX);
        let to = segment_path(dir, base, suffix);
        match std::fs::rename(&from, &to) {
            Ok(()) => {}
            // An index renamed before a crash, or never staged: a missing
            // index is rebuilt, a stale one must not stay.
            Err(e) if e.kind() == io::ErrorKind::NotFound && suffix != LOG_SUFFIX => {
                remove_if_exists(&to)?;
            }
            Err(e) => return Err(LogError::io(from, e)),
        }
    }
    checkpoint::sync_dir(dir).map_err(|e| LogError::io(dir, e))
}

/// At open, before segments are listed: deletes the files of uncommitted
/// swaps and finishes committed ones. Returns how many were finished.
pub async fn recover_swaps(dir: &Path) -> LogResult<usize> {
    let mut committed = Vec::new();
    let mut staged = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| LogError::io(dir, e))? {
        let entry = entry.map_err(|e| LogError::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((base, suffix)) = parse_segment_name(&name) else {
            continue;
        };
        if suffix.ends_with(&format!(".{CLEANED_SUFFIX}")) {
            staged.push(entry.path());
        } else if suffix == format!("{LOG_SUFFIX}.{SWAP_SUFFIX}") {
            committed.push(base);
        } else if suffix.ends_with(&format!(".{SWAP_SUFFIX}")) {
            staged.push(entry.path());
        }
    }
    committed.sort();
    // Index `.swap` files of a committed swap are finished with it, not removed.
    staged.retain(|path| {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let base = name.as_deref().and_then(parse_segment_name).map(|(b, _)| b);
        !(name.as_deref().is_some_and(|n| n.ends_with(SWAP_SUFFIX))
            && base.is_some_and(|b| committed.binary_search(&b).is_ok()))
    });
    for path in &staged {
        tracing::warn!(file = %path.display(), "removing the file of a compaction swap that never committed");
        remove_if_exists(path)?;
    }
    for &base in &committed {
        let end = swap_end(dir, base).await?;
        let mut replaced = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| LogError::io(dir, e))? {
            let entry = entry.map_err(|e| LogError::io(dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some((other, LOG_SUFFIX)) = parse_segment_name(&name) {
                if other > base && other < end {
                    replaced.push(other);
                }
            }
        }
        replaced.sort();
        tracing::info!(dir = %dir.display(), %base, %end, replaced = replaced.len(), "finishing a committed compaction swap");
        remove_replaced(dir, &replaced, || false)?;
        finish(dir, base)?;
    }
    if !staged.is_empty() && committed.is_empty() {
        checkpoint::sync_dir(dir).map_err(|e| LogError::io(dir, e))?;
    }
    Ok(committed.len())
}

/// The offset after the last batch of a committed `.log.swap` file (it was
/// synced whole before the commit).
async fn swap_end(dir: &Path, base: Offset) -> LogResult<Offset> {
    let path = staged_path(dir, base, LOG_SUFFIX, SWAP_SUFFIX);
    let file = DirectFile::open_read(&path)
        .await
        .map_err(|e| LogError::io(&path, e))?;
    let size = file
        .size_bytes()
        .await
        .map_err(|e| LogError::io(&path, e))?;
    let mut scanner = SegmentScanner::new(
        file,
        size,
        0,
        Some(base),
        STORED_BATCH_BYTES_MAX,
        ScanDepth::Headers,
    );
    let mut end = base;
    loop {
        match scanner.next().await {
            Ok(Some(batch)) => end = batch.header.next_offset(),
            Ok(None) => return Ok(end),
            Err(super::scan::ScanError::Io(e)) => return Err(LogError::io(&path, e)),
            Err(super::scan::ScanError::Corrupt { position, reason }) => {
                return Err(LogError::Corrupt {
                    path,
                    position,
                    reason,
                })
            }
        }
    }
}
