//! Direct-I/O files (O_DIRECT through io_uring) and the aligned buffers they
//! require. Positions and lengths of writes must be multiples of
//! [`DirectFile::alignment`]; reads may be unaligned.

use std::io;
use std::ops::Deref;
use std::path::Path;
use std::rc::Rc;

use glommio::io::{DmaBuffer, DmaFile, OpenOptions, ReadResult};

/// A file opened for direct I/O. Cheap to clone: clones share one descriptor.
///
/// It also remembers the lowest position written (or truncated) since its
/// last successful `fdatasync`, so the log can assert, before it persists a
/// recovery point, that the bytes the point vouches for were really synced.
#[derive(Clone, Debug)]
pub struct DirectFile {
    inner: Rc<DmaFile>,
    unsynced_from: Rc<std::cell::Cell<Option<u64>>>,
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
    let probe = dir.join(format!(".direct-io-probe-{}", std::process::id()));
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
        probe_device(path).await?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .dma_open(path)
            .await?;
        DirectFile::wrap(file)
    }

    pub async fn open_read_write(path: &Path) -> io::Result<DirectFile> {
        probe_device(path).await?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .dma_open(path)
            .await?;
        DirectFile::wrap(file)
    }

    pub async fn open_read(path: &Path) -> io::Result<DirectFile> {
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
            inner: Rc::new(file),
            unsynced_from: Rc::default(),
        })
    }

    fn mark_unsynced(&self, position: u64) {
        let from = self
            .unsynced_from
            .get()
            .map_or(position, |p| p.min(position));
        self.unsynced_from.set(Some(from));
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
        self.inner.alignment()
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
        let written = self.inner.write_rc_at(buffer.inner.clone(), position).await;
        // Marked again on completion: a sync that began while the write was
        // in flight may not cover it.
        self.mark_unsynced(position);
        let written = written?;
        if written != len {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short direct write: {written} of {len} bytes"),
            ));
        }
        Ok(())
    }

    /// Reads up to `len` bytes at `position`; fewer at the end of the file.
    pub async fn read_at(&self, position: u64, len: usize) -> io::Result<ReadBytes> {
        let result = self.inner.read_at(position, len).await?;
        Ok(ReadBytes { inner: result })
    }

    pub async fn fdatasync(&self) -> io::Result<()> {
        let pending = self.unsynced_from.take();
        if let Err(e) = self.inner.fdatasync().await {
            if let Some(from) = pending {
                self.mark_unsynced(from);
            }
            return Err(e.into());
        }
        Ok(())
    }

    pub async fn truncate(&self, size_bytes: u64) -> io::Result<()> {
        self.mark_unsynced(size_bytes);
        self.inner.truncate(size_bytes).await?;
        Ok(())
    }

    pub async fn size_bytes(&self) -> io::Result<u64> {
        Ok(self.inner.file_size().await?)
    }

    /// Allocates disk blocks ahead of appends without changing the file size, so
    /// later writes do not allocate extents on the hot path.
    pub async fn preallocate(&self, size_bytes: u64) -> io::Result<()> {
        self.inner.pre_allocate(size_bytes, true).await?;
        Ok(())
    }
}

/// Alignment of every direct write's position and length. 4 KiB covers every
/// logical block size Linux file systems use with O_DIRECT; files whose own
/// alignment does not divide it are refused at open.
pub const DIRECT_IO_ALIGNMENT_BYTES: u64 = 4096;

/// Memory aligned for direct I/O, owned and writable.
#[derive(Debug)]
pub struct AlignedBuffer {
    inner: DmaBuffer,
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
        AlignedBuffer {
            inner: glommio::allocate_dma_buffer(size_bytes),
        }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.inner.as_bytes_mut()
    }

    /// Shortens the buffer to `size_bytes` and freezes it for sharing with writes.
    pub fn seal(mut self, size_bytes: usize) -> SharedBuffer {
        self.inner.trim_to_size(size_bytes);
        SharedBuffer {
            inner: Rc::new(self.inner),
        }
    }
}

impl Deref for AlignedBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.inner.as_bytes()
    }
}

/// A frozen aligned buffer shared between an in-flight write and readers.
#[derive(Clone, Debug)]
pub struct SharedBuffer {
    inner: Rc<DmaBuffer>,
}

impl Deref for SharedBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.inner.as_bytes()
    }
}

/// Bytes read from a direct-I/O file, borrowed from the read's aligned buffer.
#[derive(Debug)]
pub struct ReadBytes {
    inner: ReadResult,
}

impl Deref for ReadBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.inner
    }
}
