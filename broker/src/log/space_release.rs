//! Gives a shard's removed segment files' disk space back at a bounded pace.
//!
//! Retention (and a follower's reset, a compaction swap, and a replica's
//! removal) takes a segment's names away at once (and syncs the directory),
//! but the blocks of its `.log` file are freed only as this releaser
//! truncates the still-open file, a step at a time. Freed all at once,
//! gigabytes of blocks go to the file system's next commit, which (with
//! online discard, common on SSDs and virtual disks) issues a discard for
//! every one of them before any later sync on the disk returns: 16
//! partitions dropping two 128 MiB segments each stalled every
//! acknowledgement for 200-600 ms (docs/performance.md). Each step here frees
//! at most `RELEASE_STEP_BYTES` and is synced on its own, so each commit
//! carries a small discard, and steps are spaced to `bytes_per_s` per shard.
//!
//! A crash with files still queued loses nothing and leaks nothing: their
//! names are gone, and the file system frees an unlinked file's blocks at
//! its next mount (ext4's orphan list).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use super::segment::LOG_SUFFIX;

use crate::runtime::{self, TaskClass, Watermark};

/// Bytes freed by one truncation and its sync: small enough that its
/// discard delays a commit by little. At 1.25M msgs/s with retention
/// removing what came in, steps of 32 MiB still let publish p99 reach
/// 20-130 ms; 8 MiB gave 6.0 ms, 2 MiB 4.9 ms (docs/performance.md).
pub const RELEASE_STEP_BYTES: u64 = 4 << 20;

/// Past this much space waiting, steps follow each other without a pause:
/// the disk's free space then matters more than smooth commits.
pub const RELEASE_PENDING_BYTES_MAX: u64 = 8 << 30;

/// What a shard's releaser has done, for the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReleaseStats {
    pub released_bytes: u64,
    pub released_files: u64,
    pub pending_bytes: u64,
    /// Files whose truncation failed; closing them freed their blocks at once.
    pub failures: u64,
}

#[derive(Debug)]
pub struct SpaceReleaser {
    queue: RefCell<VecDeque<(File, u64)>>,
    /// Files ever queued: the release loop waits for it to move.
    queued: Watermark,
    bytes_per_s: u64,
    stats: Cell<ReleaseStats>,
}

impl SpaceReleaser {
    /// A releaser for this executor, with its loop running in the
    /// background queue.
    pub fn start(bytes_per_s: u64) -> Rc<SpaceReleaser> {
        assert!(bytes_per_s > 0);
        let releaser = Rc::new(SpaceReleaser {
            queue: RefCell::default(),
            queued: Watermark::new(0),
            bytes_per_s,
            stats: Cell::default(),
        });
        runtime::spawn_in(TaskClass::Background, releaser.clone().run()).detach();
        releaser
    }

    /// Takes over files whose names are already gone, each with its length,
    /// and frees their blocks in steps.
    pub fn release(&self, files: Vec<(File, u64)>) {
        let mut stats = self.stats.get();
        for (file, len) in files {
            stats.pending_bytes += len;
            self.queue.borrow_mut().push_back((file, len));
            self.queued.advance(self.queued.get() + 1);
        }
        self.stats.set(stats);
    }

    pub fn stats(&self) -> ReleaseStats {
        self.stats.get()
    }

    async fn run(self: Rc<Self>) {
        let mut taken = 0;
        loop {
            self.queued.wait_at_least(taken + 1).await;
            loop {
                // Popped on its own line: a borrow held across the await
                // below would refuse `release` meanwhile.
                let next = self.queue.borrow_mut().pop_front();
                let Some((file, len)) = next else { break };
                taken += 1;
                self.release_one(file, len).await;
            }
        }
    }

    async fn release_one(&self, file: File, len: u64) {
        let mut file = Some(file);
        let mut left = len;
        while left > 0 {
            let to = left.saturating_sub(RELEASE_STEP_BYTES);
            let f = file.take().expect("the file comes back from each step");
            let (f, outcome) = runtime::blocking(move || {
                let outcome = f.set_len(to).and_then(|()| f.sync_data());
                (f, outcome)
            })
            .await;
            file = Some(f);
            let mut stats = self.stats.get();
            if let Err(e) = outcome {
                // Closing it frees the rest at once: the stall this avoids,
                // once, rather than space never given back.
                tracing::warn!(error = %e, "releasing a removed segment's space in steps failed; freeing it at once");
                stats.pending_bytes -= left;
                stats.failures += 1;
                self.stats.set(stats);
                break;
            }
            stats.pending_bytes -= left - to;
            stats.released_bytes += left - to;
            self.stats.set(stats);
            let step = left - to;
            left = to;
            if stats.pending_bytes <= RELEASE_PENDING_BYTES_MAX {
                runtime::sleep(Duration::from_nanos(
                    (u128::from(step) * 1_000_000_000 / u128::from(self.bytes_per_s)) as u64,
                ))
                .await;
            }
        }
        if let Some(f) = file {
            // The close may free what a failure left, on a blocking thread.
            runtime::blocking(move || drop(f)).await;
        }
        let mut stats = self.stats.get();
        stats.released_files += 1;
        self.stats.set(stats);
    }
}

/// Opens the file at `path` to hold it past its unlink, with its length,
/// if it is larger than one release step; smaller files (and files that
/// cannot be opened, such as when out of descriptors) are left to their
/// unlink, which frees them at once: the handles a releaser keeps stay
/// few, and nothing fails for want of one.
pub fn hold_if_large(path: &Path) -> Option<(File, u64)> {
    let file = File::options().write(true).open(path).ok()?;
    let len = file.metadata().ok()?.len();
    (len > RELEASE_STEP_BYTES).then_some((file, len))
}

/// Removes `dir` and everything in it (a removed replica), holding its
/// large segment files past the removal as `hold_if_large` does.
pub fn remove_dir_holding_segments(dir: &Path) -> io::Result<Vec<(File, u64)>> {
    let mut held = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == LOG_SUFFIX) {
            held.extend(hold_if_large(&path));
        }
    }
    std::fs::remove_dir_all(dir)?;
    Ok(held)
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;

    use super::*;

    /// A removed file of `len` bytes, written and synced: the handle to
    /// release and another that shows what the file system still holds.
    fn removed_file(dir: &std::path::Path, name: &str, len: u64) -> (File, File) {
        let path = dir.join(name);
        let mut f = File::create(&path).unwrap();
        let block = vec![7u8; 1 << 20];
        let mut written = 0;
        while written < len {
            let n = (len - written).min(block.len() as u64) as usize;
            f.write_all(&block[..n]).unwrap();
            written += n as u64;
        }
        f.sync_all().unwrap();
        let file = File::options().write(true).open(&path).unwrap();
        let probe = File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(probe.metadata().unwrap().blocks() > 0);
        (file, probe)
    }

    #[test]
    fn a_removed_directory_leaves_only_its_large_segment_files_held() {
        let dir = tempfile::tempdir().unwrap();
        let replica = dir.path().join("t-0");
        std::fs::create_dir(&replica).unwrap();
        let large = RELEASE_STEP_BYTES + 4096;
        std::fs::File::create(replica.join("00000000000000000000.log"))
            .unwrap()
            .set_len(large)
            .unwrap();
        std::fs::write(replica.join("00000000000000000100.log"), [1u8; 4096]).unwrap();
        std::fs::write(replica.join("00000000000000000000.index"), [2u8; 64]).unwrap();
        let held = remove_dir_holding_segments(&replica).unwrap();
        assert!(!replica.exists());
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].1, large);
        assert_eq!(held[0].0.metadata().unwrap().len(), large);
    }

    #[test]
    fn released_files_are_emptied_in_steps_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let len = RELEASE_STEP_BYTES * 2 + 4096;
        let (first, first_probe) = removed_file(dir.path(), "a.log", len);
        let (second, second_probe) = removed_file(dir.path(), "b.log", 4096);
        runtime::run_local(async move {
            // Fast enough for a test, slow enough that the steps are paced.
            let releaser = SpaceReleaser::start(1 << 30);
            releaser.release(vec![(first, len)]);
            assert_eq!(releaser.stats().pending_bytes, len);
            // The second arrives while the first is part-way released.
            while releaser.stats().released_bytes == 0 {
                runtime::sleep(Duration::from_millis(1)).await;
            }
            assert!(releaser.stats().released_bytes < len);
            releaser.release(vec![(second, 4096)]);
            while releaser.stats().released_files < 2 {
                runtime::sleep(Duration::from_millis(5)).await;
            }
            assert_eq!(
                releaser.stats(),
                ReleaseStats {
                    released_bytes: len + 4096,
                    released_files: 2,
                    pending_bytes: 0,
                    failures: 0,
                }
            );
        });
        // Other handles are still open: only the truncations can have freed
        // the blocks.
        for probe in [first_probe, second_probe] {
            let meta = probe.metadata().unwrap();
            assert_eq!((meta.len(), meta.blocks()), (0, 0));
        }
    }
}
