//! The partition directory's small metadata files: the recovery-point checkpoint
//! (every offset below it is synced and its segments need no rescan), the
//! clean-shutdown marker, and the atomic replacement of small files one or
//! many at a time. All are tiny and rare, so they use blocking std I/O with
//! write-to-temp, fsync, rename, fsync-directory; the log runs them on the
//! executor's blocking threads (`runtime::blocking`), never on the shard's.

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

/// Replaces `name` in each directory of `files` with its contents durably,
/// as `write_atomically` does for one, sharing the syncs: every temp file is
/// written before any is synced (`SyncSet`), and the first directory sync
/// after the renames commits them all. Returns each directory's result.
pub fn write_all_atomically(name: &str, files: &[(PathBuf, Vec<u8>)]) -> Vec<io::Result<()>> {
    let Some((first, _)) = files.first() else {
        return Vec::new();
    };
    let tmp_name = format!("{name}.tmp");
    // Opened on the parent, which a missing directory of the list leaves.
    let mut set = match SyncSet::new(first.parent().unwrap_or(first)) {
        Ok(set) => set,
        Err(e) => return files.iter().map(|_| Err(copy(&e))).collect(),
    };
    let mut results: Vec<io::Result<()>> = files
        .iter()
        .map(|(dir, contents)| {
            let mut file = fs::File::create(dir.join(&tmp_name))?;
            file.write_all(contents)?;
            set.add(file)
        })
        .collect();
    if let Err(e) = set.sync() {
        return files.iter().map(|_| Err(copy(&e))).collect();
    }
    for ((dir, _), result) in files.iter().zip(&mut results) {
        if result.is_ok() {
            *result = fs::rename(dir.join(&tmp_name), dir.join(name));
        }
    }
    for ((dir, _), result) in files.iter().zip(&mut results) {
        if result.is_ok() {
            *result = sync_dir(dir);
        }
    }
    results
}

fn copy(e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), e.to_string())
}

/// Files written for one durability point, synced together by `sync`. Up to
/// `SYNC_EACH_FILES_MAX` are synced one by one. More share one `syncfs` of
/// their file system: synced one after another, each would wait for a file
/// system commit of its own, while one `syncfs` writes them all out in one
/// or two. `syncfs` reports any writeback error on the file system since its
/// descriptor was opened (Linux 5.8 and later, which the runtime needs
/// anyway), and `new` opens it before the first file is written. It also
/// writes out other dirty pages of that file system, which is why few files
/// do without it; a broker's own are few, since segments use direct I/O.
#[derive(Debug)]
pub struct SyncSet {
    file_system: fs::File,
    device: u64,
    /// Files on that file system, while they are few enough to sync each.
    few: Vec<fs::File>,
    count: usize,
    /// Files on other file systems, synced each.
    elsewhere: Vec<fs::File>,
}

/// Files a `SyncSet` syncs one by one; beyond it they share a `syncfs`.
pub const SYNC_EACH_FILES_MAX: usize = 16;

impl SyncSet {
    /// A set for files on the file system that holds `on`.
    pub fn new(on: &Path) -> io::Result<SyncSet> {
        use std::os::unix::fs::MetadataExt;
        let file_system = fs::File::open(on)?;
        let device = file_system.metadata()?.dev();
        Ok(SyncSet {
            file_system,
            device,
            few: Vec::new(),
            count: 0,
            elsewhere: Vec::new(),
        })
    }

    /// Adds a file written since `new`.
    pub fn add(&mut self, file: fs::File) -> io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        if file.metadata()?.dev() != self.device {
            self.elsewhere.push(file);
            return Ok(());
        }
        self.count += 1;
        if self.count <= SYNC_EACH_FILES_MAX {
            self.few.push(file);
        } else {
            self.few.clear();
        }
        Ok(())
    }

    /// Makes the data of every added file durable.
    pub fn sync(self) -> io::Result<()> {
        if self.count > SYNC_EACH_FILES_MAX {
            // A simulated disk counts bytes written through `std::fs` as
            // durable at once.
            if !crate::runtime::sim::is_active() {
                nix::unistd::syncfs(std::os::fd::AsRawFd::as_raw_fd(&self.file_system))?;
            }
        }
        for file in self.few.iter().chain(&self.elsewhere) {
            file.sync_data()?;
        }
        Ok(())
    }
}

/// Makes everything written on the file system that holds `path` durable
/// (`syncfs`), whoever wrote it: a start runs it before it opens anything,
/// so what a killed process left only in the page cache (a directory made,
/// a file written, neither synced yet) cannot be trusted now and vanish at
/// a later power loss. A simulated disk has no page cache to drain.
pub fn sync_file_system(path: &Path) -> io::Result<()> {
    if crate::runtime::sim::is_active() {
        return Ok(());
    }
    let file = fs::File::open(path)?;
    nix::unistd::syncfs(std::os::fd::AsRawFd::as_raw_fd(&file))?;
    Ok(())
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
/// durability steps; returns every one recorded since recording began.
///
/// Never cleared: tests run on parallel threads of one process, so a call
/// that took what was recorded so far could take another test's record
/// between its action and its check. Each test looks for its own paths,
/// which live under its own temporary directory.
pub fn record_dir_syncs() -> Vec<PathBuf> {
    SYNCED_DIRS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get_or_insert_with(Vec::new)
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Enough directories that the temp files share one `syncfs`, the first
    // of them missing: it alone fails, every other file is replaced and its
    // directory synced, and no temp file is left behind.
    #[test]
    fn many_files_are_replaced_together_and_each_failure_is_its_own() {
        let root = tempfile::tempdir().unwrap();
        let count = SYNC_EACH_FILES_MAX * 2 + 1;
        let files: Vec<(PathBuf, Vec<u8>)> = (0..count)
            .map(|i| {
                let dir = root.path().join(format!("d-{i}"));
                if i != 0 {
                    fs::create_dir(&dir).unwrap();
                    fs::write(dir.join("f"), b"old").unwrap();
                }
                (dir, format!("new {i}").into_bytes())
            })
            .collect();
        record_dir_syncs();
        let results = write_all_atomically("f", &files);
        let synced = record_dir_syncs();
        assert_eq!(results.len(), count);
        for (i, ((dir, contents), result)) in files.iter().zip(&results).enumerate() {
            if i == 0 {
                assert!(result.is_err(), "the missing directory fails");
                continue;
            }
            result.as_ref().unwrap();
            assert_eq!(&fs::read(dir.join("f")).unwrap(), contents);
            assert!(!dir.join("f.tmp").exists());
            assert!(synced.contains(dir), "{} synced", dir.display());
        }
    }
}
