//! The partition directory's small metadata files: the recovery-point checkpoint
//! (every offset below it is synced and its segments need no rescan) and the
//! clean-shutdown marker. Both are tiny and rare, so they use blocking std I/O
//! with write-to-temp, fsync, rename, fsync-directory; the log runs them on
//! the executor's blocking thread (`runtime::blocking`), never on the shard's.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use protocol::Offset;

pub const RECOVERY_POINT_FILE: &str = "recovery-point";
pub const CLEAN_SHUTDOWN_FILE: &str = "clean-shutdown";
const CHECKPOINT_VERSION: &str = "ringlog-recovery-point v1";
/// In the data dir: the partition directories a clean shutdown closed, one
/// name per line, so a restart removes one marker with one directory sync
/// instead of one per partition.
pub const CLEAN_LOGS_FILE: &str = "clean-shutdown-logs";
const CLEAN_LOGS_VERSION: &str = "ringlog-clean-shutdown-logs v1";

pub fn read_recovery_point(dir: &Path) -> io::Result<Option<Offset>> {
    let text = match fs::read_to_string(dir.join(RECOVERY_POINT_FILE)) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut lines = text.lines();
    // A damaged checkpoint only costs a full rescan, so treat it as absent.
    if lines.next() != Some(CHECKPOINT_VERSION) {
        return Ok(None);
    }
    Ok(lines.next().and_then(|l| l.trim().parse().ok()).map(Offset))
}

pub fn write_recovery_point(dir: &Path, offset: Offset) -> io::Result<()> {
    write_atomically(
        dir,
        RECOVERY_POINT_FILE,
        format!("{CHECKPOINT_VERSION}\n{}\n", offset.0).as_bytes(),
    )
}

pub fn write_clean_shutdown(dir: &Path) -> io::Result<()> {
    write_atomically(dir, CLEAN_SHUTDOWN_FILE, b"clean\n")
}

/// Records, durably, that the logs in `names` (directory names under
/// `topics/`) were closed cleanly: synced, indexed, checkpointed.
pub fn write_clean_logs(data_dir: &Path, names: &[String]) -> io::Result<()> {
    let mut text = format!("{CLEAN_LOGS_VERSION}\n");
    for name in names {
        assert!(
            !name.contains('\n'),
            "a partition directory name has no newline"
        );
        text.push_str(name);
        text.push('\n');
    }
    write_atomically(data_dir, CLEAN_LOGS_FILE, text.as_bytes())
}

/// Reads the logs a clean shutdown closed and removes the record durably,
/// so that a crash from here on rescans them: the caller must take it
/// before any of those logs is opened for writing. A damaged record names
/// none (every log is then rescanned).
pub fn take_clean_logs(data_dir: &Path) -> io::Result<std::collections::HashSet<String>> {
    let path = data_dir.join(CLEAN_LOGS_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Default::default()),
        Err(e) => return Err(e),
    };
    fs::remove_file(&path)?;
    sync_dir(data_dir)?;
    let mut lines = text.lines();
    if lines.next() != Some(CLEAN_LOGS_VERSION) || !text.ends_with('\n') {
        return Ok(Default::default());
    }
    Ok(lines.map(str::to_string).collect())
}

/// Removes the marker and reports whether it was there.
pub fn take_clean_shutdown(dir: &Path) -> io::Result<bool> {
    match fs::remove_file(dir.join(CLEAN_SHUTDOWN_FILE)) {
        Ok(()) => {
            sync_dir(dir)?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Replaces `dir/name` with `contents` durably: temp file, fsync, rename,
/// fsync of the directory. For small, rarely written files.
pub fn write_atomically(dir: &Path, name: &str, contents: &[u8]) -> io::Result<()> {
    let tmp: PathBuf = dir.join(format!("{name}.tmp"));
    let mut file = fs::File::create(&tmp)?;
    file.write_all(contents)?;
    file.sync_data()?;
    fs::rename(&tmp, dir.join(name))?;
    sync_dir(dir)
}

pub fn sync_dir(dir: &Path) -> io::Result<()> {
    fs::File::open(dir)?.sync_all()?;
    // A simulated disk takes the directory's entries as durable from here.
    crate::runtime::sim::directory_synced(dir)?;
    if let Some(synced) = SYNCED_DIRS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .as_mut()
    {
        synced.push(dir.to_path_buf());
    }
    Ok(())
}

/// Creates `dir` and every missing ancestor so that each survives a power
/// loss: after each directory is made, its parent is synced (a new directory
/// entry is durable only once its parent directory is).
pub fn create_dir_durably(dir: &Path) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut at = dir;
    while !at.exists() {
        missing.push(at);
        match at.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => at = parent,
            _ => break,
        }
    }
    for path in missing.into_iter().rev() {
        match fs::create_dir(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
    }
    Ok(())
}

/// Directories synced by this process (on any thread: the log syncs on the
/// executor's blocking thread), while a test records them.
static SYNCED_DIRS: std::sync::Mutex<Option<Vec<PathBuf>>> = std::sync::Mutex::new(None);

/// Starts recording the directories this process syncs, for tests that check
/// durability steps; returns what was recorded since the previous call.
pub fn record_dir_syncs() -> Vec<PathBuf> {
    SYNCED_DIRS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .replace(Vec::new())
        .unwrap_or_default()
}
