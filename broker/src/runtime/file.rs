//! Direct-I/O files (O_DIRECT through io_uring) and the aligned buffers they
//! require. Positions and lengths of writes must be multiples of
//! [`DirectFile::alignment`]; reads may be unaligned.

use std::io;
use std::ops::Deref;
use std::path::Path;
use std::rc::Rc;

use glommio::io::{DmaBuffer, DmaFile, OpenOptions, ReadResult};

use super::sim::{self, SimFile};

/// A file opened for direct I/O. Cheap to clone: clones share one descriptor.
///
/// It also remembers the lowest position written (or truncated) since its
/// last successful `fdatasync`, so the log can assert, before it persists a
/// recovery point, that the bytes the point vouches for were really synced.
#[derive(Clone, Debug)]
pub struct DirectFile {
    inner: Backend,
    unsynced_from: Rc<std::cell::Cell<Option<u64>>>,
    /// Bumped by every mark of `unsynced_from`: a sync clears the marks made
    /// before it began only if none came while it ran.
    marks: Rc<std::cell::Cell<u64>>,
    /// Opened with `O_DSYNC`: a write is durable when it completes.
    write_through: bool,
}

/// `O_DSYNC` on Linux (asm-generic, so x86_64 and aarch64 alike).
const O_DSYNC: i32 = 0o10000;

/// Where the bytes go: io_uring on a shard, the simulated disk under a
/// simulation (`runtime::sim`).
#[derive(Clone, Debug)]
enum Backend {
    Dma(Rc<DmaFile>),
    Sim(SimFile),
}

thread_local! {
    /// Devices whose io_uring poll-queue support has been probed on a non-empty file.
    static PROBED_DEVICES: std::cell::RefCell<std::collections::HashSet<u64>> = Default::default();
}

/// glommio decides once per device whether reads may use the IOPOLL ring, by
/// reading the first block of whichever file is opened first. If that file is
/// empty the read "succeeds" and every later read fails with EOPNOTSUPP on
/// devices without poll queues. Opening a non-empty file first gives it a
/// truthful answer.
async fn probe_device(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let device = std::fs::metadata(dir)?.dev();
    if PROBED_DEVICES.with(|p| p.borrow().contains(&device)) {
        return Ok(());
    }
    // A non-empty file is its own truthful probe: glommio reads its first block.
    // Only an empty or new file needs a stand-in, which must be written next to
    // it (so read-only tools such as verify-log never write unless they must).
    if std::fs::metadata(path).is_ok_and(|m| m.len() > 0) {
        let opened = DmaFile::open(path).await?;
        opened.close().await?;
        PROBED_DEVICES.with(|p| p.borrow_mut().insert(device));
        return Ok(());
    }
    // Named apart per probe: shards probe the same directory at once (each
    // makes its journal ring there), and one's removal must not pull the
    // file from under another's open.
    static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let probe = dir.join(format!(
        ".direct-io-probe-{}-{}",
        std::process::id(),
        PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::write(&probe, [0u8; DIRECT_IO_ALIGNMENT_BYTES as usize])?;
    let opened = DmaFile::open(&probe).await;
    let _ = std::fs::remove_file(&probe);
    opened?.close().await?;
    PROBED_DEVICES.with(|p| p.borrow_mut().insert(device));
    Ok(())
}

impl DirectFile {
    /// Creates `path`, failing if it exists: a segment file is never silently replaced.
    pub async fn create_new(path: &Path) -> io::Result<DirectFile> {
        if sim::is_active() {
            return Ok(DirectFile::wrap_sim(SimFile::open(path, true, true).await?));
        }
        probe_device(path).await?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .dma_open(path)
            .await?;
        DirectFile::wrap(file)
    }

    /// Opens an existing file for write-through direct I/O (`O_DSYNC`): each
    /// write is durable when it completes, and over blocks already written
    /// (a file made at its full size) needs no metadata, so it is one device
    /// write instead of a write, an `fdatasync` and its metadata.
    pub async fn open_write_through(path: &Path) -> io::Result<DirectFile> {
        let mut file = DirectFile::open_existing(path, O_DSYNC).await?;
        file.write_through = true;
        Ok(file)
    }

    /// The same for every clone of one opened file, different between opens.
    pub fn identity(&self) -> usize {
        Rc::as_ptr(&self.unsynced_from) as usize
    }

    pub async fn open_read_write(path: &Path) -> io::Result<DirectFile> {
        DirectFile::open_existing(path, 0).await
    }

    /// Opens an existing file for reading and writing with `custom_flags`
    /// beside O_DIRECT (the simulated disk takes none).
    async fn open_existing(path: &Path, custom_flags: i32) -> io::Result<DirectFile> {
        if sim::is_active() {
            return Ok(DirectFile::wrap_sim(
                SimFile::open(path, true, false).await?,
            ));
        }
        probe_device(path).await?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(custom_flags)
            .dma_open(path)
            .await?;
        DirectFile::wrap(file)
    }

    pub async fn open_read(path: &Path) -> io::Result<DirectFile> {
        if sim::is_active() {
            return Ok(DirectFile::wrap_sim(
                SimFile::open(path, false, false).await?,
            ));
        }
        probe_device(path).await?;
        let file = OpenOptions::new().read(true).dma_open(path).await?;
        DirectFile::wrap(file)
    }

    fn wrap(file: DmaFile) -> io::Result<DirectFile> {
        if !DIRECT_IO_ALIGNMENT_BYTES.is_multiple_of(file.alignment()) {
            return Err(io::Error::other(format!(
                "file system needs {}-byte direct I/O alignment, above the supported {}",
                file.alignment(),
                DIRECT_IO_ALIGNMENT_BYTES
            )));
        }
        Ok(DirectFile {
            inner: Backend::Dma(Rc::new(file)),
            unsynced_from: Rc::default(),
            marks: Rc::default(),
            write_through: false,
        })
    }

    fn wrap_sim(file: SimFile) -> DirectFile {
        DirectFile {
            inner: Backend::Sim(file),
            unsynced_from: Rc::default(),
            marks: Rc::default(),
            write_through: false,
        }
    }

    fn mark_unsynced(&self, position: u64) {
        let from = self
            .unsynced_from
            .get()
            .map_or(position, |p| p.min(position));
        self.unsynced_from.set(Some(from));
        self.marks.set(self.marks.get() + 1);
    }

    /// Treats the whole file as not yet synced: for a file found after a
    /// crash, whose writes may never have reached stable storage.
    pub fn mark_untrusted(&self) {
        self.mark_unsynced(0);
    }

    /// Whether every byte below `position` was synced since it was last
    /// written or truncated through this process.
    pub fn is_synced_below(&self, position: u64) -> bool {
        self.unsynced_from.get().is_none_or(|from| from >= position)
    }

    pub fn alignment(&self) -> u64 {
        match &self.inner {
            Backend::Dma(file) => file.alignment(),
            Backend::Sim(_) => DIRECT_IO_ALIGNMENT_BYTES,
        }
    }

    /// Writes the whole buffer at `position`; both must be aligned. The buffer
    /// stays readable by others while the write is in flight.
    pub async fn write_at(&self, buffer: &SharedBuffer, position: u64) -> io::Result<()> {
        let len = buffer.len();
        assert_eq!(
            position % DIRECT_IO_ALIGNMENT_BYTES,
            0,
            "aligned write position"
        );
        assert_eq!(
            len as u64 % DIRECT_IO_ALIGNMENT_BYTES,
            0,
            "aligned write length"
        );
        self.mark_unsynced(position);
        let written = self.submit_write(buffer, position).await;
        // Marked again on completion: a sync that began while the write was
        // in flight may not cover it.
        self.mark_unsynced(position);
        let mut done = written?;
        while done != len {
            // Part written: the file system ran out of room (or the device
            // failed) part-way. Writing the rest gets the kernel's own error
            // for it (ENOSPC), which names the cause; a short write of
            // unaligned length cannot be continued with direct I/O.
            if done == 0 || !(done as u64).is_multiple_of(DIRECT_IO_ALIGNMENT_BYTES) {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!("short direct write: {done} of {len} bytes"),
                ));
            }
            let rest_len = len - done;
            let mut rest = AlignedBuffer::new(rest_len);
            rest.as_mut_slice().copy_from_slice(&buffer[done..]);
            let more = self
                .submit_write(&rest.seal(rest_len), position + done as u64)
                .await;
            self.mark_unsynced(position);
            done += more?;
        }
        Ok(())
    }

    async fn submit_write(&self, buffer: &SharedBuffer, position: u64) -> io::Result<usize> {
        match (&self.inner, &buffer.inner) {
            (Backend::Dma(file), SharedInner::Dma(dma)) => {
                Ok(file.write_rc_at(dma.clone(), position).await?)
            }
            (Backend::Sim(file), _) => {
                file.write_at(buffer, position).await?;
                if self.write_through {
                    // The simulated disk has no O_DSYNC: the same promise.
                    file.fdatasync().await?;
                }
                Ok(buffer.len())
            }
            (Backend::Dma(_), SharedInner::Heap(_)) => {
                unreachable!("heap buffers exist only under a simulation")
            }
        }
    }

    /// Reads up to `len` bytes at `position`; fewer at the end of the file.
    pub async fn read_at(&self, position: u64, len: usize) -> io::Result<ReadBytes> {
        match &self.inner {
            Backend::Dma(file) => Ok(ReadBytes {
                inner: ReadInner::Dma(file.read_at(position, len).await?),
            }),
            Backend::Sim(file) => Ok(ReadBytes {
                inner: ReadInner::Heap(file.read_at(position, len).await?),
            }),
        }
    }

    pub async fn fdatasync(&self) -> io::Result<()> {
        // The file counts as unsynced until the sync completes: one in
        // flight (a journal checkpoint's, a seal's) must not pass for done
        // with whoever decides meanwhile what to sync or what a recovery
        // point may vouch for, nor one that fails or whose caller stops
        // waiting (a dropped write-out). A success clears only if nothing
        // was written or cut while it ran: that may not be covered.
        let marks_before = self.marks.get();
        let synced = match &self.inner {
            Backend::Dma(file) => file.fdatasync().await.map_err(io::Error::from),
            Backend::Sim(file) => file.fdatasync().await,
        };
        if synced.is_ok() && self.marks.get() == marks_before {
            self.unsynced_from.set(None);
        }
        synced
    }

    pub async fn truncate(&self, size_bytes: u64) -> io::Result<()> {
        self.mark_unsynced(size_bytes);
        let cut = match &self.inner {
            Backend::Dma(file) => file.truncate(size_bytes).await.map_err(io::Error::from),
            Backend::Sim(file) => file.truncate(size_bytes).await,
        };
        // Marked again on completion, as a write is.
        self.mark_unsynced(size_bytes);
        cut
    }

    pub async fn size_bytes(&self) -> io::Result<u64> {
        match &self.inner {
            Backend::Dma(file) => Ok(file.file_size().await?),
            Backend::Sim(file) => file.size_bytes(),
        }
    }

    /// Extends the file to `size_bytes` with allocated, unwritten blocks
    /// (`fallocate` mode 0), which read as zeros. `from_bytes` is where the
    /// caller's data ends: nothing below it changes.
    ///
    /// Why: an appending direct write on ext4 must allocate blocks and move
    /// the file size, which it cannot do without blocking, so io_uring hands
    /// every such write to a kernel worker thread. A write into space
    /// already allocated below the file size completes inline. The caller
    /// trims what it never wrote (a segment's seal, a recovery's cut).
    pub async fn preallocate(&self, from_bytes: u64, size_bytes: u64) -> io::Result<()> {
        // The file's size is metadata a sync must carry, like a write's.
        self.mark_unsynced(from_bytes);
        match &self.inner {
            Backend::Dma(file) => Ok(file.pre_allocate(size_bytes, false).await?),
            Backend::Sim(file) => {
                if file.size_bytes()? < size_bytes {
                    file.truncate(size_bytes).await?;
                }
                Ok(())
            }
        }
    }
}

/// Alignment of every direct write's position and length. 4 KiB covers every
/// logical block size Linux file systems use with O_DIRECT; files whose own
/// alignment does not divide it are refused at open.
pub const DIRECT_IO_ALIGNMENT_BYTES: u64 = 4096;

/// Memory aligned for direct I/O, owned and writable.
#[derive(Debug)]
pub struct AlignedBuffer {
    inner: BufferInner,
}

/// io_uring's registered memory on a shard; plain heap memory under a
/// simulation, whose files are not opened for direct I/O.
#[derive(Debug)]
enum BufferInner {
    Dma(DmaBuffer),
    Heap(Vec<u8>),
}

impl AlignedBuffer {
    /// Allocates `size_bytes` (a multiple of the alignment) of uninitialised-content
    /// memory from the executor's I/O pool, or the heap when the pool is exhausted.
    pub fn new(size_bytes: usize) -> AlignedBuffer {
        assert_eq!(
            size_bytes as u64 % DIRECT_IO_ALIGNMENT_BYTES,
            0,
            "aligned size"
        );
        if sim::is_active() {
            return AlignedBuffer {
                inner: BufferInner::Heap(vec![0; size_bytes]),
            };
        }
        AlignedBuffer {
            inner: BufferInner::Dma(glommio::allocate_dma_buffer(size_bytes)),
        }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match &mut self.inner {
            BufferInner::Dma(buffer) => buffer.as_bytes_mut(),
            BufferInner::Heap(buffer) => buffer,
        }
    }

    /// Shortens the buffer to `size_bytes` and freezes it for sharing with writes.
    pub fn seal(self, size_bytes: usize) -> SharedBuffer {
        let inner = match self.inner {
            BufferInner::Dma(mut buffer) => {
                buffer.trim_to_size(size_bytes);
                SharedInner::Dma(Rc::new(buffer))
            }
            BufferInner::Heap(mut buffer) => {
                buffer.truncate(size_bytes);
                SharedInner::Heap(Rc::new(buffer))
            }
        };
        SharedBuffer { inner }
    }
}

impl Deref for AlignedBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.inner {
            BufferInner::Dma(buffer) => buffer.as_bytes(),
            BufferInner::Heap(buffer) => buffer,
        }
    }
}

/// A frozen aligned buffer shared between an in-flight write and readers.
#[derive(Clone, Debug)]
pub struct SharedBuffer {
    inner: SharedInner,
}

#[derive(Clone, Debug)]
enum SharedInner {
    Dma(Rc<DmaBuffer>),
    Heap(Rc<Vec<u8>>),
}

impl Deref for SharedBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.inner {
            SharedInner::Dma(buffer) => buffer.as_bytes(),
            SharedInner::Heap(buffer) => buffer,
        }
    }
}

/// Bytes read from a direct-I/O file, borrowed from the read's aligned buffer.
#[derive(Debug)]
pub struct ReadBytes {
    inner: ReadInner,
}

#[derive(Debug)]
enum ReadInner {
    Dma(ReadResult),
    Heap(Vec<u8>),
}

impl Deref for ReadBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.inner {
            ReadInner::Dma(bytes) => bytes,
            ReadInner::Heap(bytes) => bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::sim::{self, SimConfig, SimDisk};

    /// A sync whose caller stops waiting vouches for nothing: the file still
    /// counts as unsynced, so the sync it needs next is not skipped (a
    /// write-out dropped with its client once left a rolled segment passing
    /// for synced, and a power loss then tore records acknowledged after it).
    #[test]
    fn a_sync_dropped_before_it_completes_leaves_the_file_unsynced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        sim::run(&SimConfig::new(1), &SimDisk::new(), None, async move {
            let file = DirectFile::create_new(&path).await.unwrap();
            let mut buffer = AlignedBuffer::new(4096);
            buffer.as_mut_slice().fill(7);
            file.write_at(&buffer.seal(4096), 0).await.unwrap();
            assert!(!file.is_synced_below(4096));
            let dropped = futures_lite::future::poll_once(file.fdatasync()).await;
            assert!(dropped.is_none(), "the simulated sync completed at once");
            assert!(
                !file.is_synced_below(4096),
                "a sync nobody waited for counted as done"
            );
            file.fdatasync().await.unwrap();
            assert!(file.is_synced_below(4096));
        })
        .unwrap();
    }

    /// A sync in flight counts for nothing until it completes, and one that
    /// a write overlapped leaves the file unsynced: it may not cover it.
    #[test]
    fn a_sync_counts_only_once_done_and_only_for_what_came_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        sim::run(&SimConfig::new(3), &SimDisk::new(), None, async move {
            let file = DirectFile::create_new(&path).await.unwrap();
            let page = || {
                let mut buffer = AlignedBuffer::new(4096);
                buffer.as_mut_slice().fill(7);
                buffer.seal(4096)
            };
            file.write_at(&page(), 0).await.unwrap();
            let syncing = file.clone();
            let sync = crate::runtime::spawn(async move { syncing.fdatasync().await });
            crate::runtime::yield_now().await;
            assert!(
                !file.is_synced_below(4096),
                "a sync in flight passed for done"
            );
            file.write_at(&page(), 4096).await.unwrap();
            sync.await.unwrap();
            assert!(
                !file.is_synced_below(8192),
                "a sync that a write overlapped vouched for it"
            );
            file.fdatasync().await.unwrap();
            assert!(file.is_synced_below(8192));
        })
        .unwrap();
    }
}
