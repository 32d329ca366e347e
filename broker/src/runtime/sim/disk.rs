//! The simulated disk: plain files in a real directory whose writes since
//! their last sync, and whose directory entries since their directory's last
//! sync, a simulated power loss takes back, keeps or tears.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use super::{current, io_delay, spawn};

/// One write or truncation not yet covered by a sync: what it replaced, so a
/// power loss can take it back.
#[derive(Debug)]
enum Change {
    Write {
        position: u64,
        bytes: Vec<u8>,
        replaced: Vec<u8>,
        size_before: u64,
    },
    Truncate {
        size_bytes: u64,
        cut: Vec<u8>,
        size_before: u64,
    },
}

#[derive(Debug)]
struct FileState {
    file: File,
    /// The path it was first opened by (a power loss of one directory tree,
    /// `power_loss_under`, picks its files by it).
    path: PathBuf,
    /// Changes since the last sync, oldest first, each with the sequence
    /// number it completed at.
    unsynced: Vec<(u64, Change)>,
}

#[derive(Debug, Default)]
struct DiskState {
    /// By inode: every handle of one file shares what was not synced.
    files: BTreeMap<u64, Rc<RefCell<FileState>>>,
    sequence: u64,
    syncs: u64,
    writes: u64,
    namespace: Option<Namespace>,
}

/// A directory's regular files: name to inode.
type Listing = BTreeMap<OsString, u64>;

/// The directory entries under a watched root as of each directory's last
/// sync. A file created, renamed or unlinked since is there or not after a
/// power loss depending on whether the directory's change reached the disk;
/// the last sync's listing is what is certain. Every inode a durable listing
/// names keeps a hard link in `shadow`, so a name a power loss brings back
/// (an unlinked file, the old file under a name a rename replaced) still has
/// its bytes.
#[derive(Debug)]
struct Namespace {
    root: PathBuf,
    shadow: PathBuf,
    /// By directory: its listing at its last sync, with an open handle that
    /// keeps the directory's inode taken (so one removed and made again has
    /// another inode) and that inode.
    durable: BTreeMap<PathBuf, Synced>,
}

#[derive(Debug)]
struct Synced {
    _handle: File,
    inode: u64,
    listing: Listing,
}

impl Namespace {
    fn shadow_of(&self, inode: u64) -> PathBuf {
        self.shadow.join(inode.to_string())
    }

    /// Takes `dir`'s listing as durable, as a sync of it does.
    fn synced(&mut self, dir: &Path) -> io::Result<()> {
        let listing = list_files(dir)?;
        for (name, &inode) in &listing {
            let shadow = self.shadow_of(inode);
            if !shadow.exists() {
                std::fs::hard_link(dir.join(name), shadow)?;
            }
        }
        let handle = File::open(dir)?;
        let inode = handle.metadata()?.ino();
        self.durable.insert(
            dir.to_path_buf(),
            Synced {
                _handle: handle,
                inode,
                listing,
            },
        );
        // Shadows no durable listing names any more are only garbage.
        let named: BTreeSet<u64> = self
            .durable
            .values()
            .flat_map(|synced| synced.listing.values().copied())
            .collect();
        for entry in std::fs::read_dir(&self.shadow)? {
            let entry = entry?;
            let inode = entry.file_name().to_string_lossy().parse::<u64>().ok();
            if inode.is_some_and(|i| !named.contains(&i)) {
                std::fs::remove_file(entry.path())?;
            }
        }
        Ok(())
    }

    /// Every directory under the root, the root included, that exists now
    /// or was synced.
    fn directories(&self) -> io::Result<BTreeSet<PathBuf>> {
        let mut found: BTreeSet<PathBuf> = self.durable.keys().cloned().collect();
        let mut stack = vec![self.root.clone()];
        while let Some(dir) = stack.pop() {
            if !dir.is_dir() {
                continue;
            }
            for entry in std::fs::read_dir(&dir)? {
                let entry = entry?;
                if entry.file_type()?.is_dir() {
                    stack.push(entry.path());
                }
            }
            found.insert(dir);
        }
        Ok(found)
    }

    /// Puts `dir` back to its listing at its last sync (empty if it never
    /// was): names made since go, names removed or replaced since come back.
    /// Returns how many names changed.
    fn revert(&self, dir: &Path) -> io::Result<usize> {
        // Removing a directory counts as durable at once.
        if !dir.is_dir() {
            return Ok(0);
        }
        let empty = Listing::new();
        // A directory made again since its last sync has synced nothing yet.
        let dir_inode = std::fs::metadata(dir)?.ino();
        let durable = match self.durable.get(dir) {
            Some(synced) if synced.inode == dir_inode => &synced.listing,
            _ => &empty,
        };
        let current = list_files(dir)?;
        let mut changed = 0;
        for (name, inode) in &current {
            if durable.get(name) != Some(inode) {
                std::fs::remove_file(dir.join(name))?;
                changed += 1;
            }
        }
        for (name, &inode) in durable {
            if current.get(name) != Some(&inode) {
                std::fs::hard_link(self.shadow_of(inode), dir.join(name))?;
                changed += 1;
            }
        }
        Ok(changed)
    }
}

fn list_files(dir: &Path) -> io::Result<Listing> {
    let mut listing = Listing::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let metadata = entry.metadata()?;
        if metadata.is_file() {
            listing.insert(entry.file_name(), metadata.ino());
        }
    }
    Ok(listing)
}

/// Called after a directory sync: under a simulation whose disk watches
/// that directory, its listing becomes the durable one.
pub fn directory_synced(dir: &Path) -> io::Result<()> {
    if !super::is_active() {
        return Ok(());
    }
    let executor = current();
    let mut state = executor.disk.state.borrow_mut();
    match state.namespace.as_mut() {
        Some(namespace) if dir.starts_with(&namespace.root) => namespace.synced(dir),
        _ => Ok(()),
    }
}

/// The simulated disk under a run: plain files in a real directory, with
/// each file's changes since its last sync remembered so a power loss can
/// drop them, keep them or tear them. It outlives executors, like a disk
/// outlives a killed process. Under a watched root (`watch`), the files a
/// directory lists are durable only as of its last sync: a power loss
/// leaves each directory as it was then or as it is now. Bytes written
/// through `std::fs` (small checkpoint files, written, synced and renamed)
/// count as durable at once; making directories and removing them too.
#[derive(Clone, Debug, Default)]
pub struct SimDisk {
    state: Rc<RefCell<DiskState>>,
}

/// What a power loss did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PowerLoss {
    pub files: usize,
    pub changes_lost: usize,
    pub changes_kept: usize,
    pub writes_torn: usize,
    /// Directories put back to their listing at their last sync.
    pub directories_reverted: usize,
    /// Names those reverts removed or brought back.
    pub names_reverted: usize,
}

impl SimDisk {
    pub fn new() -> SimDisk {
        SimDisk::default()
    }

    /// Models the directory entries under `root` from now on (see
    /// `Namespace`); `shadow`, outside `root` on the same file system, holds
    /// the hard links that keep replaced and unlinked files. What is under
    /// `root` now counts as durable.
    pub fn watch(&self, root: &Path, shadow: &Path) -> io::Result<()> {
        std::fs::create_dir_all(root)?;
        std::fs::create_dir_all(shadow)?;
        assert!(
            !shadow.starts_with(root),
            "the shadow directory is outside the watched root"
        );
        let mut namespace = Namespace {
            root: root.to_path_buf(),
            shadow: shadow.to_path_buf(),
            durable: BTreeMap::new(),
        };
        for dir in namespace.directories()? {
            namespace.synced(&dir)?;
        }
        self.state.borrow_mut().namespace = Some(namespace);
        Ok(())
    }

    /// A file or directory synced through `std::fs` while no simulation ran
    /// (a start-up step such as journal replay): a file's sync covers every
    /// change the simulated disk still holds unsynced for it too.
    /// A directory's listing becomes the durable one, as `directory_synced`.
    pub fn synced_outside(&self, path: &Path) -> io::Result<()> {
        let metadata = std::fs::metadata(path)?;
        let mut state = self.state.borrow_mut();
        state.syncs += 1;
        if metadata.is_dir() {
            return match state.namespace.as_mut() {
                Some(namespace) if path.starts_with(&namespace.root) => namespace.synced(path),
                _ => Ok(()),
            };
        }
        if let Some(file) = state.files.get(&metadata.ino()) {
            file.borrow_mut().unsynced.clear();
        }
        Ok(())
    }

    /// Syncs and writes completed so far.
    pub fn stats(&self) -> (u64, u64) {
        let state = self.state.borrow();
        (state.writes, state.syncs)
    }

    /// Cuts the power: every change not covered by a sync is lost, kept, or
    /// (a write) kept up to a 512-byte sector boundary, each drawn from
    /// `seed`. A sync covers what completed before it was issued, so what
    /// remains is a state the real disk could be in.
    pub fn power_loss(&self, seed: u64) -> io::Result<PowerLoss> {
        self.power_loss_where(seed, None)
    }

    /// A power loss of the files and directories under `root` only, as of
    /// one machine among several sharing this simulated disk: its processes
    /// must be gone (killed) before, and everything else goes on.
    pub fn power_loss_under(&self, seed: u64, root: &Path) -> io::Result<PowerLoss> {
        self.power_loss_where(seed, Some(root))
    }

    fn power_loss_where(&self, seed: u64, under: Option<&Path>) -> io::Result<PowerLoss> {
        let inside = |path: &Path| under.is_none_or(|root| path.starts_with(root));
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut draw = |bound: u64| {
            rng ^= rng >> 12;
            rng ^= rng << 25;
            rng ^= rng >> 27;
            rng.wrapping_mul(0x2545_f491_4f6c_dd1d) % bound.max(1)
        };
        let mut report = PowerLoss::default();
        let mut files: Vec<Rc<RefCell<FileState>>> = {
            let mut state = self.state.borrow_mut();
            let (hit, spared): (BTreeMap<_, _>, BTreeMap<_, _>) = std::mem::take(&mut state.files)
                .into_iter()
                .partition(|(_, f)| inside(&f.borrow().path));
            state.files = spared;
            hit.into_values().collect()
        };
        // In the order their first unsynced change completed, not by inode
        // number (which the host's file system picks), so the draws fall on
        // the same files every time a seed runs.
        files.sort_by_key(|f| f.borrow().unsynced.first().map_or(0, |(seq, _)| *seq));
        for file in files {
            let mut file = file.borrow_mut();
            let changes = std::mem::take(&mut file.unsynced);
            if changes.is_empty() {
                continue;
            }
            report.files += 1;
            // Back to the synced state: undo every change, newest first.
            for (_, change) in changes.iter().rev() {
                match change {
                    Change::Write {
                        position,
                        replaced,
                        size_before,
                        ..
                    } => {
                        file.file.write_all_at(replaced, *position)?;
                        file.file.set_len(*size_before)?;
                    }
                    Change::Truncate {
                        size_bytes,
                        cut,
                        size_before,
                    } => {
                        file.file.set_len(*size_before)?;
                        file.file.write_all_at(cut, *size_bytes)?;
                    }
                }
            }
            // Then some of them again, in order: the disk may have written
            // any of them before the power went.
            for (_, change) in &changes {
                match draw(3) {
                    0 => report.changes_lost += 1,
                    1 => {
                        report.changes_kept += 1;
                        redo(&file.file, change, None)?;
                    }
                    _ => match change {
                        Change::Write { bytes, .. } if bytes.len() > 512 => {
                            report.writes_torn += 1;
                            let sectors = bytes.len() as u64 / 512;
                            redo(&file.file, change, Some(draw(sectors) as usize * 512))?;
                        }
                        _ => {
                            report.changes_kept += 1;
                            redo(&file.file, change, None)?;
                        }
                    },
                }
            }
        }
        // Each directory is as of its last sync or as now: its changes since
        // reached the disk or did not.
        let state = self.state.borrow();
        if let Some(namespace) = state.namespace.as_ref() {
            for dir in namespace.directories()? {
                if !inside(&dir) {
                    continue;
                }
                if draw(2) == 0 {
                    let names = namespace.revert(&dir)?;
                    if names > 0 {
                        report.directories_reverted += 1;
                        report.names_reverted += names;
                    }
                }
            }
        }
        Ok(report)
    }

    /// The shared state of `file`'s inode. Handles share one descriptor:
    /// a writable one replaces a read-only one first opened (both read).
    fn register(
        &self,
        file: File,
        path: &Path,
        writable: bool,
    ) -> io::Result<Rc<RefCell<FileState>>> {
        let inode = file.metadata()?.ino();
        let mut state = self.state.borrow_mut();
        match state.files.entry(inode) {
            std::collections::btree_map::Entry::Occupied(known) => {
                if writable {
                    known.get().borrow_mut().file = file;
                }
                Ok(known.get().clone())
            }
            std::collections::btree_map::Entry::Vacant(slot) => Ok(slot
                .insert(Rc::new(RefCell::new(FileState {
                    file,
                    path: path.to_path_buf(),
                    unsynced: Vec::new(),
                })))
                .clone()),
        }
    }
}

fn redo(file: &File, change: &Change, torn_at: Option<usize>) -> io::Result<()> {
    match change {
        Change::Write {
            position, bytes, ..
        } => {
            let bytes = &bytes[..torn_at.unwrap_or(bytes.len())];
            file.write_all_at(bytes, *position)
        }
        Change::Truncate { size_bytes, .. } => file.set_len(*size_bytes),
    }
}

/// A direct-I/O file under simulation.
#[derive(Clone, Debug)]
pub struct SimFile {
    state: Rc<RefCell<FileState>>,
    writable: bool,
}

impl SimFile {
    pub(crate) async fn open(
        path: &std::path::Path,
        write: bool,
        create_new: bool,
    ) -> io::Result<SimFile> {
        io_delay().await;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .create_new(create_new)
            .open(path)?;
        let state = current().disk.register(file, path, write)?;
        Ok(SimFile {
            state,
            writable: write,
        })
    }

    /// Submits the write at its first poll. Like an io_uring write, it then
    /// lands even if its caller stops waiting (a cancelled task's writes still
    /// reach the file, later than anything the caller does next).
    pub(crate) async fn write_at(&self, bytes: &[u8], position: u64) -> io::Result<()> {
        assert!(self.writable, "written through a read-only handle");
        let (done, result) = crate::runtime::oneshot::oneshot();
        let (file, bytes) = (self.clone(), bytes.to_vec());
        spawn(async move {
            io_delay().await;
            done.send(file.apply_write(&bytes, position));
        })
        .detach();
        result
            .await
            .unwrap_or_else(|| Err(io::Error::other("the simulated process died mid-write")))
    }

    fn apply_write(&self, bytes: &[u8], position: u64) -> io::Result<()> {
        let executor = current();
        let mut disk = executor.disk.state.borrow_mut();
        disk.sequence += 1;
        disk.writes += 1;
        let sequence = disk.sequence;
        let mut state = self.state.borrow_mut();
        let size_before = state.file.metadata()?.len();
        let mut replaced = vec![0u8; bytes.len()];
        let available = size_before.saturating_sub(position).min(bytes.len() as u64) as usize;
        state
            .file
            .read_exact_at(&mut replaced[..available], position)?;
        replaced.truncate(available);
        state.file.write_all_at(bytes, position)?;
        state.unsynced.push((
            sequence,
            Change::Write {
                position,
                bytes: bytes.to_vec(),
                replaced,
                size_before,
            },
        ));
        Ok(())
    }

    pub(crate) async fn read_at(&self, position: u64, len: usize) -> io::Result<Vec<u8>> {
        io_delay().await;
        let state = self.state.borrow();
        let size = state.file.metadata()?.len();
        let available = size.saturating_sub(position).min(len as u64) as usize;
        let mut out = vec![0u8; available];
        state.file.read_exact_at(&mut out, position)?;
        Ok(out)
    }

    /// Covers the changes completed before it was issued.
    pub(crate) async fn fdatasync(&self) -> io::Result<()> {
        let issued = current().disk.state.borrow().sequence;
        io_delay().await;
        let executor = current();
        executor.disk.state.borrow_mut().syncs += 1;
        self.state
            .borrow_mut()
            .unsynced
            .retain(|(sequence, _)| *sequence > issued);
        Ok(())
    }

    pub(crate) async fn truncate(&self, size_bytes: u64) -> io::Result<()> {
        io_delay().await;
        let executor = current();
        let mut disk = executor.disk.state.borrow_mut();
        disk.sequence += 1;
        let sequence = disk.sequence;
        let mut state = self.state.borrow_mut();
        let size_before = state.file.metadata()?.len();
        let mut cut = vec![0u8; size_before.saturating_sub(size_bytes) as usize];
        state
            .file
            .read_exact_at(&mut cut, size_bytes.min(size_before))?;
        state.file.set_len(size_bytes)?;
        state.unsynced.push((
            sequence,
            Change::Truncate {
                size_bytes,
                cut,
                size_before,
            },
        ));
        Ok(())
    }

    pub(crate) fn size_bytes(&self) -> io::Result<u64> {
        Ok(self.state.borrow().file.metadata()?.len())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{run, SimConfig};
    use super::*;

    #[test]
    fn a_power_loss_keeps_synced_writes_and_may_drop_the_rest() {
        let dir = std::env::temp_dir().join(format!("ringlog-sim-disk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        let _ = std::fs::remove_file(&path);
        for seed in 0..32 {
            let _ = std::fs::remove_file(&path);
            let disk = SimDisk::new();
            let p = path.clone();
            run(&SimConfig::new(seed), &disk, None, async move {
                let file = SimFile::open(&p, true, true).await.unwrap();
                file.write_at(&[1u8; 4096], 0).await.unwrap();
                file.fdatasync().await.unwrap();
                file.write_at(&[2u8; 4096], 4096).await.unwrap();
                file.write_at(&[3u8; 4096], 0).await.unwrap();
            })
            .unwrap();
            disk.power_loss(seed).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            // The synced page is there, as written or as overwritten later.
            assert!(bytes.len() >= 4096, "seed {seed}");
            assert!(
                bytes[..4096].iter().all(|&b| b == 1 || b == 3),
                "seed {seed}"
            );
            if bytes.len() > 4096 {
                assert!(
                    bytes[4096..].iter().all(|&b| b == 2 || b == 0),
                    "seed {seed}"
                );
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_power_loss_under_one_directory_spares_the_others() {
        let root = scratch("under");
        let (mut hit_lost, mut spared_lost) = (0, 0);
        for seed in 0..32 {
            clean(&root);
            let disk = SimDisk::new();
            let data = root.join("data");
            disk.watch(&data, &root.with_extension("shadow")).unwrap();
            let (a, b) = (data.join("a"), data.join("b"));
            std::fs::create_dir_all(&a).unwrap();
            std::fs::create_dir_all(&b).unwrap();
            sync_dir(&data);
            let (pa, pb) = (a.join("f"), b.join("f"));
            run(&SimConfig::new(seed), &disk, None, async move {
                for path in [pa, pb] {
                    let file = SimFile::open(&path, true, true).await.unwrap();
                    file.fdatasync().await.unwrap();
                    sync_dir(path.parent().unwrap());
                    file.write_at(&[7u8; 4096], 0).await.unwrap();
                }
            })
            .unwrap();
            disk.power_loss_under(seed, &a).unwrap();
            let size = |path: &Path| std::fs::metadata(path).unwrap().len();
            if size(&a.join("f")) < 4096 {
                hit_lost += 1;
            }
            if size(&b.join("f")) < 4096 {
                spared_lost += 1;
            }
            // What was spared is still unsynced: a later power loss of the
            // whole disk may still take it.
            disk.power_loss(seed).unwrap();
        }
        assert!(hit_lost > 0, "the unsynced write under `a` always survived");
        assert_eq!(spared_lost, 0, "a write under `b` was lost");
        clean(&root);
    }

    /// Runs `body` under a simulation over a disk watching `root`, then cuts
    /// the power with `seed`.
    fn with_power_loss(seed: u64, root: &Path, body: impl FnOnce(&Path) + 'static) -> PowerLoss {
        let disk = SimDisk::new();
        let shadow = root.with_extension("shadow");
        let data = root.join("data");
        disk.watch(&data, &shadow).unwrap();
        let d = data.clone();
        run(&SimConfig::new(seed), &disk, None, async move { body(&d) }).unwrap();
        disk.power_loss(seed).unwrap()
    }

    /// As the log's directory sync does.
    fn sync_dir(dir: &Path) {
        File::open(dir).unwrap().sync_all().unwrap();
        directory_synced(dir).unwrap();
    }

    fn scratch(name: &str) -> PathBuf {
        let root =
            std::env::temp_dir().join(format!("ringlog-sim-ns-{name}-{}", std::process::id()));
        clean(&root);
        std::fs::create_dir_all(&root).unwrap();
        root
    }

    fn clean(root: &Path) {
        let _ = std::fs::remove_dir_all(root);
        let _ = std::fs::remove_dir_all(root.with_extension("shadow"));
    }

    #[test]
    fn a_new_file_survives_a_power_loss_only_once_its_directory_is_synced() {
        let root = scratch("create");
        let (mut lost, mut kept) = (0, 0);
        for seed in 0..32 {
            clean(&root);
            with_power_loss(seed, &root, |dir| {
                std::fs::write(dir.join("synced"), b"one").unwrap();
                sync_dir(dir);
                // Its bytes are durable (std::fs writes count so), its name not.
                std::fs::write(dir.join("unsynced"), b"two").unwrap();
            });
            let data = root.join("data");
            assert_eq!(
                std::fs::read(data.join("synced")).unwrap(),
                b"one",
                "seed {seed}"
            );
            match std::fs::read(data.join("unsynced")) {
                Ok(bytes) => {
                    assert_eq!(bytes, b"two", "seed {seed}");
                    kept += 1;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => lost += 1,
                Err(e) => panic!("seed {seed}: {e}"),
            }
        }
        assert!(lost > 0 && kept > 0, "lost {lost}, kept {kept}");
        clean(&root);
    }

    #[test]
    fn unsynced_renames_and_unlinks_of_a_directory_are_undone_or_kept_together() {
        let root = scratch("rename");
        let (mut undone, mut done) = (0, 0);
        for seed in 0..32 {
            clean(&root);
            with_power_loss(seed, &root, |dir| {
                std::fs::write(dir.join("checkpoint"), b"old").unwrap();
                std::fs::write(dir.join("doomed"), b"segment").unwrap();
                sync_dir(dir);
                std::fs::write(dir.join("checkpoint.tmp"), b"new").unwrap();
                std::fs::rename(dir.join("checkpoint.tmp"), dir.join("checkpoint")).unwrap();
                std::fs::remove_file(dir.join("doomed")).unwrap();
            });
            let data = root.join("data");
            let checkpoint = std::fs::read(data.join("checkpoint")).unwrap();
            let doomed = std::fs::read(data.join("doomed")).ok();
            assert!(!data.join("checkpoint.tmp").exists(), "seed {seed}");
            if checkpoint == b"old" {
                assert_eq!(doomed.as_deref(), Some(&b"segment"[..]), "seed {seed}");
                undone += 1;
            } else {
                assert_eq!(checkpoint, b"new", "seed {seed}");
                assert_eq!(doomed, None, "seed {seed}");
                done += 1;
            }
        }
        assert!(undone > 0 && done > 0, "undone {undone}, done {done}");
        clean(&root);
    }

    #[test]
    fn a_directory_made_again_gets_nothing_of_the_old_one_back() {
        let root = scratch("remade");
        for seed in 0..16 {
            clean(&root);
            with_power_loss(seed, &root, |dir| {
                let partition = dir.join("p");
                std::fs::create_dir(&partition).unwrap();
                std::fs::write(partition.join("old"), b"deleted topic").unwrap();
                sync_dir(&partition);
                // Removing and making directories count as durable at once.
                std::fs::remove_dir_all(&partition).unwrap();
                std::fs::create_dir(&partition).unwrap();
                std::fs::write(partition.join("new"), b"new topic").unwrap();
            });
            let partition = root.join("data").join("p");
            assert!(!partition.join("old").exists(), "seed {seed}");
        }
        clean(&root);
    }
}
