//! A shard's journal ring file and its rounds: made once at its full size
//! and zeroed (so a write never changes the file's size or extents), opened
//! write-through (`O_DSYNC`), and written one round at a time, every log's
//! records handed over since the last round in one write that is durable
//! when it completes. Once half the ring is taken, a checkpoint starts
//! beside the rounds: it syncs the segment files the journaled chunks went
//! to, and the next round first moves the ring's start past them (a header
//! write). A round only waits for a checkpoint when the ring is full.
//!
//! A chunk may be handed over while its segment write is still in flight,
//! so that write and the round run side by side; the chunk then carries
//! the write's landing mark, and a checkpoint waits for it before syncing
//! the file, since a sync covers only writes that landed before it.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use protocol::Offset;

use super::checkpoint::sync_dir;
use super::journal::{
    may_start_record, record_candidates, scan, JournalError, JournalHeader, JournalSeq, RecordSpec,
    RingMark, RingWriter, RoundBuffer, JOURNAL_BLOCK_BYTES, JOURNAL_CHUNK_BYTES_MAX,
    RECORD_HEADER_BYTES,
};
use super::journal_replay::JOURNAL_SUFFIX;
use crate::runtime::{
    self, AlignedBuffer, DirectFile, OneshotReceiver, OneshotSender, SharedBuffer, TaskClass,
    Watermark,
};

/// The ring each shard keeps: at 250 MB/s a shard fills half of it in
/// about half a second, which is how often a checkpoint syncs the segment
/// files.
pub const JOURNAL_RING_BYTES_DEFAULT: u64 = 256 << 20;
/// The largest ring file `open` reads: a bound on what a stray file costs.
pub const JOURNAL_RING_BYTES_MAX: u64 = 4 << 30;
/// What one round holds at most (one largest chunk and its record always
/// fit): the bound on a round's buffer, whatever waits.
pub const JOURNAL_ROUND_BYTES_MAX: usize = 2 * JOURNAL_CHUNK_BYTES_MAX;
const ZERO_FILL_BYTES: usize = 1 << 20;
/// Reads of an existing ring at open, a piece at a time.
const OPEN_READ_BYTES: usize = 1 << 20;

/// A chunk image a log hands over: the bytes its segment write carried.
#[derive(Clone, Debug)]
pub struct JournalChunk {
    pub segment_base: Offset,
    pub position: u64,
    pub buffer: SharedBuffer,
    /// The segment file the chunk was written to, synced by a checkpoint.
    pub file: DirectFile,
    /// The segment write still in flight when the chunk was handed over:
    /// it has landed once the mark reaches the count. `None`: landed.
    pub landing: Option<Landing>,
}

/// When a segment write handed to the journal before it landed will have
/// landed: once `mark` reaches `count`.
#[derive(Clone, Debug)]
pub struct Landing {
    pub mark: Rc<Watermark>,
    pub count: i64,
}

impl Landing {
    async fn wait(&self) {
        self.mark.wait_at_least(self.count).await;
    }
}

#[derive(Clone, Debug)]
pub enum JournalEntry {
    Write(JournalChunk),
    /// See [`RecordBody::Fence`](super::journal::RecordBody::Fence).
    Fence,
    /// See [`RecordBody::SegmentFence`](super::journal::RecordBody::SegmentFence).
    SegmentFence(Offset),
}

struct Pending {
    log: Rc<str>,
    entries: Vec<JournalEntry>,
    done: OneshotSender<io::Result<()>>,
}

impl Pending {
    fn specs(&self) -> impl Iterator<Item = RecordSpec<'_>> {
        self.entries.iter().map(|entry| match entry {
            JournalEntry::Write(chunk) => {
                RecordSpec::write(&self.log, chunk.segment_base, chunk.position, &chunk.buffer)
            }
            JournalEntry::Fence => RecordSpec::fence(&self.log),
            JournalEntry::SegmentFence(base) => RecordSpec::segment_fence(&self.log, *base),
        })
    }

    fn encoded_bytes(&self) -> usize {
        self.entries
            .iter()
            .map(|entry| {
                RECORD_HEADER_BYTES
                    + self.log.len()
                    + match entry {
                        JournalEntry::Write(chunk) => chunk.buffer.len(),
                        JournalEntry::Fence | JournalEntry::SegmentFence(_) => 0,
                    }
            })
            .sum()
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JournalStats {
    pub rounds: u64,
    pub records: u64,
    /// Bytes written in rounds, padding included.
    pub round_bytes: u64,
    pub checkpoints: u64,
    /// Rounds that found the ring full and waited for a checkpoint.
    pub checkpoint_waits: u64,
}

/// A segment file a checkpoint syncs: its place among the files written
/// since the last one, and the landings it waits for first.
struct ToSync {
    order: usize,
    file: DirectFile,
    landings: Vec<Landing>,
}

pub struct ShardJournal {
    path: PathBuf,
    file: DirectFile,
    writer: RefCell<RingWriter>,
    pending: RefCell<Vec<Pending>>,
    running: Cell<bool>,
    /// Segment files written by records since the last checkpoint's mark,
    /// with the landings of their writes still in flight when handed over,
    /// by identity; each with the order it was first written in, which is
    /// the order a checkpoint syncs them in (not the map's, which differs
    /// from run to run and would make a simulated seed replay differently).
    to_sync: RefCell<HashMap<usize, ToSync>>,
    /// A checkpoint's syncs are under way.
    checkpointing: Cell<bool>,
    /// Checkpoints whose syncs ended (well or not), for a full ring's wait.
    checkpoints_ended: Rc<Watermark>,
    /// What the last checkpoint's syncs made releasable: the next round
    /// writes the header that releases it before it plans its own room.
    releasable: Cell<Option<RingMark>>,
    /// Set by `release_all`: no append is taken after it.
    closed: Cell<bool>,
    /// The logs with records in the ring since it was opened (released or
    /// not): a log opened again under one of these names fences them first.
    names: RefCell<std::collections::HashSet<Rc<str>>>,
    /// Set by the first failed write: a round that failed part-way may have
    /// left bytes a scan stops at, so nothing after it could be replayed.
    failed: Cell<Option<io::ErrorKind>>,
    stats: Cell<JournalStats>,
}

impl std::fmt::Debug for ShardJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardJournal")
            .field("path", &self.path)
            .field("stats", &self.stats.get())
            .finish_non_exhaustive()
    }
}

fn invalid(path: &Path, e: JournalError) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("journal {}: {e}", path.display()),
    )
}

impl ShardJournal {
    /// Opens `dir/NAME.ring`, making it (zeroed, with an empty header) when it
    /// does not exist or has another size. An existing ring must have been
    /// replayed (`journal_replay::replay_journals`) since its last use.
    pub async fn open(dir: &Path, name: &str, ring_bytes: u64) -> io::Result<Rc<ShardJournal>> {
        let path = dir.join(format!("{name}.{JOURNAL_SUFFIX}"));
        let existing = match std::fs::metadata(&path) {
            Ok(meta) if meta.len() > JOURNAL_RING_BYTES_MAX => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "journal {} is {} bytes, above the {JOURNAL_RING_BYTES_MAX} a ring may have",
                        path.display(),
                        meta.len()
                    ),
                ));
            }
            Ok(meta) => {
                let ring = Self::read_to_resume(&path, meta.len()).await?;
                let found = scan(&ring).map_err(|e| invalid(&path, e))?;
                if !found.records.is_empty() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "journal {} holds {} records not replayed",
                            path.display(),
                            found.records.len()
                        ),
                    ));
                }
                Some(ring)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        // Nothing live in it: a ring of another size is made again.
        let (writer, file) = match existing {
            Some(ring) if ring.len() as u64 == ring_bytes => {
                let found = scan(&ring).map_err(|e| invalid(&path, e))?;
                // A new id for this start: nothing in the ring from before it
                // can pass for a record written after it.
                let (writer, header_block) = RingWriter::resume(&found, runtime::random_u64());
                let file = DirectFile::open_write_through(&path).await?;
                file.write_at(&aligned(&header_block), 0).await?;
                (writer, file)
            }
            _ => {
                let writer = Self::make(dir, &path, ring_bytes).await?;
                (writer, DirectFile::open_write_through(&path).await?)
            }
        };
        Ok(Rc::new(ShardJournal {
            path,
            file,
            writer: RefCell::new(writer),
            pending: RefCell::default(),
            running: Cell::new(false),
            to_sync: RefCell::default(),
            checkpointing: Cell::new(false),
            checkpoints_ended: Rc::new(Watermark::new(0)),
            releasable: Cell::new(None),
            names: RefCell::default(),
            closed: Cell::new(false),
            failed: Cell::new(None),
            stats: Cell::default(),
        }))
    }

    /// Writes the whole ring under a temporary name, then renames it into
    /// place: a ring file that exists is always whole.
    async fn make(dir: &Path, path: &Path, ring_bytes: u64) -> io::Result<RingWriter> {
        let writer = RingWriter::new(ring_bytes, JournalSeq(0), runtime::random_u64())
            .map_err(|e| invalid(path, e))?;
        let (dir, path) = (dir.to_path_buf(), path.to_path_buf());
        let tmp = path.with_extension(format!("{JOURNAL_SUFFIX}.tmp"));
        {
            let (dir, path, tmp) = (dir.clone(), path.clone(), tmp.clone());
            runtime::blocking(move || -> io::Result<()> {
                std::fs::create_dir_all(&dir)?;
                for stale in [&tmp, &path] {
                    match std::fs::remove_file(stale) {
                        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                        _ => {}
                    }
                }
                Ok(())
            })
            .await?;
        }
        if let Err(e) = Self::fill(&tmp, &writer, ring_bytes).await {
            // Nothing half-made stays behind to take the room (a full disk
            // is the likely cause).
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        runtime::blocking(move || -> io::Result<()> {
            std::fs::rename(&tmp, &path)?;
            sync_dir(&dir)
        })
        .await?;
        Ok(writer)
    }

    /// Writes every byte of a new ring at `tmp`: zeros, then the header.
    async fn fill(tmp: &Path, writer: &RingWriter, ring_bytes: u64) -> io::Result<()> {
        let file = DirectFile::create_new(tmp).await?;
        let mut zeros = AlignedBuffer::new(ZERO_FILL_BYTES);
        zeros.as_mut_slice().fill(0);
        let zeros = zeros.seal(ZERO_FILL_BYTES);
        let mut at = JOURNAL_BLOCK_BYTES;
        while at < ring_bytes {
            let len = (ring_bytes - at).min(ZERO_FILL_BYTES as u64) as usize;
            if len == ZERO_FILL_BYTES {
                file.write_at(&zeros, at).await?;
            } else {
                let mut part = AlignedBuffer::new(len);
                part.as_mut_slice().fill(0);
                file.write_at(&part.seal(len), at).await?;
            }
            at += len as u64;
        }
        let block = writer.header().encode_block(None);
        file.write_at(&aligned(&block), 0).await?;
        file.fdatasync().await
    }

    /// The ring as far as a scan from its header needs it when nothing is
    /// live (after a replay, every start): the header block and the blocks
    /// where the first record would begin, the rest left zero. If any of
    /// those may hold a record start, the whole ring is read, so the scan
    /// sees what is there.
    async fn read_to_resume(path: &Path, ring_bytes: u64) -> io::Result<Vec<u8>> {
        let block = JOURNAL_BLOCK_BYTES as usize;
        if !(JOURNAL_BLOCK_BYTES * 2..=JOURNAL_RING_BYTES_MAX).contains(&ring_bytes) {
            return Self::read_all(path, ring_bytes).await;
        }
        let file = DirectFile::open_read(path).await?;
        // Zeroed lazily by the allocator: only the blocks read are touched.
        let mut ring = vec![0u8; ring_bytes as usize];
        let head = file.read_at(0, block).await?;
        ring[..head.len()].copy_from_slice(&head);
        let Ok(header) = JournalHeader::decode_block(&ring[..block]) else {
            return Self::read_all(path, ring_bytes).await;
        };
        for candidate in record_candidates(header.start.position) {
            if candidate + JOURNAL_BLOCK_BYTES > ring_bytes {
                continue;
            }
            let bytes = file.read_at(candidate, block).await?;
            if bytes.len() != block || may_start_record(&bytes) {
                return Self::read_all(path, ring_bytes).await;
            }
            let at = candidate as usize;
            ring[at..at + bytes.len()].copy_from_slice(&bytes);
        }
        Ok(ring)
    }

    async fn read_all(path: &Path, ring_bytes: u64) -> io::Result<Vec<u8>> {
        let file = DirectFile::open_read(path).await?;
        let mut ring = Vec::with_capacity(ring_bytes as usize);
        while (ring.len() as u64) < ring_bytes {
            let want = (ring_bytes - ring.len() as u64).min(OPEN_READ_BYTES as u64) as usize;
            let bytes = file.read_at(ring.len() as u64, want).await?;
            if bytes.is_empty() {
                break;
            }
            ring.extend_from_slice(&bytes);
        }
        Ok(ring)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn stats(&self) -> JournalStats {
        self.stats.get()
    }

    /// Whether a write or checkpoint failed: every append fails from now on.
    pub fn is_failed(&self) -> bool {
        self.failed.get().is_some()
    }

    /// Whether `submit` queues entries now (not failed, not closed).
    pub fn takes_appends(&self) -> bool {
        !self.is_failed() && !self.closed.get()
    }

    /// Whether records of `log` were written since the ring was opened.
    pub fn has_records_of(&self, log: &str) -> bool {
        self.names.borrow().contains(log)
    }

    /// Journals `entries` of `log` (its directory name) and returns once they
    /// are durable, sharing the round with every other log that asked
    /// meanwhile.
    pub async fn append(
        self: &Rc<Self>,
        log: Rc<str>,
        entries: Vec<JournalEntry>,
    ) -> io::Result<()> {
        self.submit(log, entries).await
    }

    /// Queues `entries` of `log` for the next round at once, in the order
    /// of the calls, and answers when they are durable (or not), whether
    /// the answer is awaited or not: the round runs in a task of its own.
    pub fn submit(self: &Rc<Self>, log: Rc<str>, entries: Vec<JournalEntry>) -> JournalAnswer {
        let (done, result) = runtime::oneshot();
        if let Some(kind) = self.failed.get() {
            done.send(Err(self.failure(kind)));
            return JournalAnswer(result);
        }
        if self.closed.get() {
            done.send(Err(io::Error::other(format!(
                "journal {} is closed: the shard is stopping",
                self.path.display()
            ))));
            return JournalAnswer(result);
        }
        if entries.is_empty() {
            done.send(Ok(()));
            return JournalAnswer(result);
        }
        self.names.borrow_mut().insert(log.clone());
        self.pending
            .borrow_mut()
            .push(Pending { log, entries, done });
        if !self.running.replace(true) {
            let journal = self.clone();
            // Acknowledgements wait on it: in the requests' queue, whoever
            // started it.
            runtime::spawn_in(
                TaskClass::Requests,
                async move { journal.run_rounds().await },
            )
            .detach();
        }
        JournalAnswer(result)
    }

    fn failure(&self, kind: io::ErrorKind) -> io::Error {
        io::Error::new(
            kind,
            format!("journal {} failed a write earlier", self.path.display()),
        )
    }

    async fn run_rounds(self: Rc<Self>) {
        loop {
            let batch = {
                let mut pending = self.pending.borrow_mut();
                let mut round_bytes = 0;
                let count = pending
                    .iter()
                    .take_while(|p| {
                        round_bytes += p.encoded_bytes();
                        round_bytes <= JOURNAL_ROUND_BYTES_MAX
                    })
                    .count()
                    .max(1)
                    .min(pending.len());
                pending.drain(..count).collect::<Vec<_>>()
            };
            if batch.is_empty() {
                self.running.set(false);
                return;
            }
            Box::pin(self.write_rounds(batch)).await;
        }
    }

    /// Writes `batch` as one round, or as several when it does not fit one.
    async fn write_rounds(self: &Rc<Self>, batch: Vec<Pending>) {
        if let Some(kind) = self.failed.get() {
            for pending in batch {
                pending.done.send(Err(self.failure(kind)));
            }
            return;
        }
        // Records the format refuses (a bad name, an unaligned chunk) are a
        // caller's bug: answered to that caller alone.
        let mut accepted = Vec::with_capacity(batch.len());
        for pending in batch {
            match RingWriter::check_records(&pending.specs().collect::<Vec<_>>()) {
                Ok(()) => accepted.push(pending),
                Err(error) => pending.done.send(Err(invalid(&self.path, error))),
            }
        }
        let batch = accepted;
        if batch.is_empty() {
            return;
        }
        match self.write_round(&batch).await {
            Ok(()) => {
                for pending in batch {
                    pending.done.send(Ok(()));
                }
            }
            Err(RoundError::TooLarge(e)) if batch.len() > 1 => {
                drop(e);
                let mut first = batch;
                let second = first.split_off(first.len() / 2);
                Box::pin(self.write_rounds(first)).await;
                Box::pin(self.write_rounds(second)).await;
            }
            Err(RoundError::TooLarge(e)) | Err(RoundError::Refused(e)) => {
                for pending in batch {
                    pending
                        .done
                        .send(Err(io::Error::new(e.kind(), e.to_string())));
                }
            }
            Err(RoundError::Failed(e)) => {
                self.failed.set(Some(e.kind()));
                tracing::error!(path = %self.path.display(), error = %e, "journal write failed; journaled writes fail from now on");
                for pending in batch {
                    pending
                        .done
                        .send(Err(io::Error::new(e.kind(), e.to_string())));
                }
            }
        }
    }

    async fn write_round(self: &Rc<Self>, batch: &[Pending]) -> Result<(), RoundError> {
        let specs: Vec<RecordSpec<'_>> = batch.iter().flat_map(Pending::specs).collect();
        let round = loop {
            self.release().await.map_err(RoundError::Failed)?;
            let planned = self.writer.borrow_mut().round_in::<AlignedBuffer>(&specs);
            match planned {
                Ok(round) => break round,
                Err(JournalError::Full { .. }) => {
                    self.bump(|stats| stats.checkpoint_waits += 1);
                    self.checkpoint_and_wait().await;
                    if let Some(kind) = self.failed.get() {
                        return Err(RoundError::Failed(self.failure(kind)));
                    }
                }
                Err(e @ JournalError::RoundTooLarge { .. }) => {
                    return Err(RoundError::TooLarge(invalid(&self.path, e)))
                }
                Err(e) => return Err(RoundError::Refused(invalid(&self.path, e))),
            }
        };
        let round_bytes = round.bytes.len();
        self.file
            .write_at(&round.bytes.seal(round_bytes), round.position)
            .await
            .map_err(RoundError::Failed)?;
        {
            let mut to_sync = self.to_sync.borrow_mut();
            for pending in batch {
                for entry in &pending.entries {
                    if let JournalEntry::Write(chunk) = entry {
                        let order = to_sync.len();
                        let ToSync { landings, .. } = to_sync
                            .entry(chunk.file.identity())
                            .or_insert_with(|| ToSync {
                                order,
                                file: chunk.file.clone(),
                                landings: Vec::new(),
                            });
                        if let Some(landing) = &chunk.landing {
                            // A file's waves land one after another: one that
                            // landed needs no waiting for, which keeps the
                            // list short between checkpoints.
                            while landings.last().is_some_and(|l| l.mark.get() >= l.count) {
                                landings.pop();
                            }
                            // A wave's chunks share one landing.
                            if !landings
                                .last()
                                .is_some_and(|l| Rc::ptr_eq(&l.mark, &landing.mark))
                            {
                                landings.push(landing.clone());
                            }
                        }
                    }
                }
            }
        }
        self.bump(|stats| {
            stats.rounds += 1;
            stats.records += round.records as u64;
            stats.round_bytes += round_bytes as u64;
        });
        // Half the ring taken: the syncs that make room start now, beside
        // the rounds, so a round seldom finds it full.
        let (free, area) = {
            let writer = self.writer.borrow();
            (
                writer.free_bytes(),
                writer.header().ring_bytes - JOURNAL_BLOCK_BYTES,
            )
        };
        if free < area / 2 {
            self.start_checkpoint();
        }
        Ok(())
    }

    fn bump(&self, change: impl FnOnce(&mut JournalStats)) {
        let mut stats = self.stats.get();
        change(&mut stats);
        self.stats.set(stats);
    }

    /// Starts a checkpoint unless one is under way: every segment file
    /// journaled chunks went to so far is synced, in a task of its own,
    /// and what that covers becomes releasable.
    fn start_checkpoint(self: &Rc<Self>) {
        if self.checkpointing.replace(true) {
            return;
        }
        let mark = self.writer.borrow().mark();
        let mut files: Vec<ToSync> = std::mem::take(&mut *self.to_sync.borrow_mut())
            .into_values()
            .collect();
        files.sort_unstable_by_key(|f| f.order);
        let journal = self.clone();
        runtime::spawn_in(TaskClass::Background, async move {
            let syncs: Vec<_> = files
                .into_iter()
                .map(|ToSync { file, landings, .. }| {
                    runtime::spawn(async move {
                        // Released records must be in the file: a sync
                        // covers only the writes that landed before it.
                        for landing in &landings {
                            landing.wait().await;
                        }
                        file.fdatasync().await
                    })
                })
                .collect();
            let mut outcome = Ok(());
            for sync in syncs {
                if let Err(e) = sync.await {
                    outcome = Err(e);
                }
            }
            match outcome {
                // Released by the next round (or `release_all`), which owns
                // the header's writes.
                Ok(()) => journal.releasable.set(Some(mark)),
                Err(e) => {
                    // The records it was to release stay live, and their
                    // files unsynced: nothing may be released from now on.
                    tracing::error!(path = %journal.path.display(), error = %e, "journal checkpoint sync failed; journaled writes fail from now on");
                    journal.failed.set(Some(e.kind()));
                }
            }
            journal.checkpointing.set(false);
            journal
                .checkpoints_ended
                .advance(journal.checkpoints_ended.get() + 1);
        })
        .detach();
    }

    /// Starts a checkpoint if none is under way, and waits for the end of
    /// the one under way then.
    async fn checkpoint_and_wait(self: &Rc<Self>) {
        let ended = self.checkpoints_ended.get();
        self.start_checkpoint();
        self.checkpoints_ended.wait_at_least(ended + 1).await;
    }

    /// Writes the header that moves the ring's start past what the last
    /// checkpoint synced, if anything waits to be released. Only the round
    /// loop (or `release_all`, once appends stopped) calls it, so a round
    /// never uses room whose release is not durable yet.
    async fn release(&self) -> io::Result<()> {
        let Some(mark) = self.releasable.take() else {
            return Ok(());
        };
        let block = self.writer.borrow_mut().release_to(mark);
        if let Err(e) = self.file.write_at(&aligned(&block), 0).await {
            self.failed.set(Some(e.kind()));
            return Err(e);
        }
        self.bump(|stats| stats.checkpoints += 1);
        Ok(())
    }

    /// Releases every record (a clean shutdown, once every log closed and
    /// no append is under way): the next start then finds nothing to replay
    /// and keeps its logs' clean-shutdown records.
    pub async fn release_all(self: &Rc<Self>) -> io::Result<()> {
        // A late append (a request answered while the shard stops) must not
        // write into room released below before its header is durable.
        self.closed.set(true);
        // Appends stopped; a round loop may still be on its way out.
        while self.running.get() || !self.pending.borrow().is_empty() {
            runtime::sleep(std::time::Duration::from_millis(1)).await;
        }
        if let Some(kind) = self.failed.get() {
            return Err(self.failure(kind));
        }
        // One under way covers only part: wait for it, then start another.
        while self.checkpointing.get() {
            let ended = self.checkpoints_ended.get();
            self.checkpoints_ended.wait_at_least(ended + 1).await;
        }
        self.release().await?;
        self.checkpoint_and_wait().await;
        if let Some(kind) = self.failed.get() {
            return Err(self.failure(kind));
        }
        self.release().await
    }
}

/// The answer to [`ShardJournal::submit`]: `Ok` once the entries are durable.
#[derive(Debug)]
pub struct JournalAnswer(OneshotReceiver<io::Result<()>>);

impl std::future::Future for JournalAnswer {
    type Output = io::Result<()>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll(cx).map(|answer| {
            answer.unwrap_or_else(|| Err(io::Error::other("the journal's round was dropped")))
        })
    }
}

enum RoundError {
    /// More than a ring holds: split, or refused if it is one log's.
    TooLarge(io::Error),
    /// Records the format refuses (a bad name, an unaligned chunk): a bug
    /// of the caller's, answered to it without touching the ring.
    Refused(io::Error),
    /// The ring could not be written: the journal fails from now on.
    Failed(io::Error),
}

impl RoundBuffer for AlignedBuffer {
    fn with_len(len: usize) -> Self {
        AlignedBuffer::new(len)
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

fn aligned(bytes: &[u8]) -> SharedBuffer {
    let mut buffer = AlignedBuffer::new(bytes.len());
    buffer.as_mut_slice().copy_from_slice(bytes);
    buffer.seal(bytes.len())
}

#[cfg(test)]
mod tests {
    use super::super::journal::{RecordBody, JOURNAL_RING_BYTES_MIN};
    use super::super::journal_replay::{replay_journals, JOURNAL_DIR};
    use super::super::segment::{segment_path, LOG_SUFFIX};
    use super::*;

    fn chunk_of(fill: u8, blocks: usize) -> SharedBuffer {
        let len = blocks * JOURNAL_BLOCK_BYTES as usize;
        let mut buffer = AlignedBuffer::new(len);
        buffer.as_mut_slice().fill(fill);
        buffer.seal(len)
    }

    async fn segment_file(data: &Path, log: &str) -> DirectFile {
        let dir = data.join("topics").join(log);
        std::fs::create_dir_all(&dir).unwrap();
        DirectFile::create_new(&segment_path(&dir, Offset(0), LOG_SUFFIX))
            .await
            .unwrap()
    }

    /// The ring `shard-0` under `data`'s journal directory.
    async fn open_in(data: &Path, ring_bytes: u64) -> io::Result<Rc<ShardJournal>> {
        ShardJournal::open(&data.join(JOURNAL_DIR), "shard-0", ring_bytes).await
    }

    #[test]
    fn concurrent_appends_share_rounds_and_replay_into_their_segments() {
        let data = tempfile::tempdir().unwrap();
        let data_path = data.path().to_path_buf();
        runtime::run_local(async move {
            let journal = open_in(&data_path, JOURNAL_RING_BYTES_MIN * 4)
                .await
                .unwrap();
            let mut tasks = Vec::new();
            for log in 0..3u8 {
                let file = segment_file(&data_path, &format!("t-{log}")).await;
                let journal = journal.clone();
                tasks.push(runtime::spawn(async move {
                    for i in 0..4u8 {
                        let chunk = JournalChunk {
                            segment_base: Offset(0),
                            position: u64::from(i) * JOURNAL_BLOCK_BYTES,
                            buffer: chunk_of(log * 16 + i + 1, 1),
                            file: file.clone(),
                            landing: None,
                        };
                        journal
                            .append(format!("t-{log}").into(), vec![JournalEntry::Write(chunk)])
                            .await
                            .unwrap();
                    }
                }));
            }
            for task in tasks {
                task.await;
            }
            let stats = journal.stats();
            assert_eq!(stats.records, 12);
            assert!(
                stats.rounds < 12,
                "appends that wait together share a round: {stats:?}"
            );
        });
        // Nothing reached the segment files but the journal: replay puts it there.
        let report = replay_journals(data.path()).unwrap();
        assert_eq!((report.records, report.writes), (12, 12));
        for log in 0..3u8 {
            let dir = data.path().join("topics").join(format!("t-{log}"));
            let bytes = std::fs::read(segment_path(&dir, Offset(0), LOG_SUFFIX)).unwrap();
            for i in 0..4u8 {
                let at = usize::from(i) * JOURNAL_BLOCK_BYTES as usize;
                assert!(bytes[at..at + JOURNAL_BLOCK_BYTES as usize]
                    .iter()
                    .all(|b| *b == log * 16 + i + 1));
            }
        }
    }

    #[test]
    fn a_checkpoint_releases_nothing_before_the_segment_writes_handed_over_have_landed() {
        let data = tempfile::tempdir().unwrap();
        let data_path = data.path().to_path_buf();
        runtime::run_local(async move {
            let journal = open_in(&data_path, JOURNAL_RING_BYTES_MIN).await.unwrap();
            let file = segment_file(&data_path, "t-0").await;
            let chunk = |i: u64, landing: Option<Landing>| JournalChunk {
                segment_base: Offset(0),
                position: i * 2 * JOURNAL_BLOCK_BYTES,
                buffer: chunk_of(i as u8 + 1, 2),
                file: file.clone(),
                landing,
            };
            let append = |chunk: JournalChunk| {
                journal.submit("t-0".into(), vec![JournalEntry::Write(chunk)])
            };
            // The first chunk's segment write is still in flight.
            let mark = Rc::new(Watermark::new(0));
            let first = chunk(
                0,
                Some(Landing {
                    mark: mark.clone(),
                    count: 1,
                }),
            );
            append(first.clone()).await.unwrap();
            // Three blocks a round in a ring of fifteen: the third round
            // takes half of it, and a checkpoint starts.
            for i in 1..3 {
                let landed = chunk(i, None);
                file.write_at(&landed.buffer, landed.position)
                    .await
                    .unwrap();
                append(landed).await.unwrap();
            }
            assert!(journal.checkpointing.get());
            runtime::sleep(std::time::Duration::from_millis(20)).await;
            // The next round releases what an ended checkpoint synced: nothing
            // yet, since the sync waits for the first write to land.
            let landed = chunk(3, None);
            file.write_at(&landed.buffer, landed.position)
                .await
                .unwrap();
            append(landed).await.unwrap();
            assert!(journal.checkpointing.get());
            assert_eq!(journal.stats().checkpoints, 0);
            file.write_at(&first.buffer, first.position).await.unwrap();
            mark.advance(1);
            journal.checkpoints_ended.wait_at_least(1).await;
            let landed = chunk(4, None);
            file.write_at(&landed.buffer, landed.position)
                .await
                .unwrap();
            append(landed).await.unwrap();
            assert_eq!(journal.stats().checkpoints, 1);
        });
    }

    #[test]
    fn a_full_ring_checkpoints_and_keeps_only_what_came_after() {
        let data = tempfile::tempdir().unwrap();
        let data_path = data.path().to_path_buf();
        let ring_bytes = JOURNAL_RING_BYTES_MIN;
        let (journal_path, last_fill) = runtime::run_local(async move {
            let journal = open_in(&data_path, ring_bytes).await.unwrap();
            let file = segment_file(&data_path, "t-0").await;
            // Three blocks a round in a ring of fifteen: it fills every few rounds.
            let mut fill = 0u8;
            for i in 0..40u64 {
                fill = (i % 250) as u8 + 1;
                let chunk = JournalChunk {
                    segment_base: Offset(0),
                    position: (i % 8) * 2 * JOURNAL_BLOCK_BYTES,
                    buffer: chunk_of(fill, 2),
                    file: file.clone(),
                    landing: None,
                };
                // Handed over without a landing: its segment write landed first.
                file.write_at(&chunk.buffer, chunk.position).await.unwrap();
                journal
                    .append("t-0".into(), vec![JournalEntry::Write(chunk)])
                    .await
                    .unwrap();
            }
            let stats = journal.stats();
            assert!(stats.checkpoints >= 5, "{stats:?}");
            (journal.path().to_path_buf(), fill)
        });
        let ring = std::fs::read(&journal_path).unwrap();
        let found = scan(&ring).unwrap();
        // The live records are the last ones, from the header's start to the
        // fortieth append, the newest last.
        let last = found.records.last().unwrap();
        assert_eq!(found.records[0].seq, found.header.start.seq);
        assert_eq!(
            last.seq.0 - found.header.start.seq.0 + 1,
            found.records.len() as u64
        );
        assert!(found.records.len() < 40, "older records were released");
        match last.body {
            RecordBody::Write { bytes, .. } => assert!(bytes.iter().all(|b| *b == last_fill)),
            _ => panic!("no fences were written"),
        }
    }

    #[test]
    fn a_record_the_format_refuses_fails_only_its_own_append() {
        let data = tempfile::tempdir().unwrap();
        let data_path = data.path().to_path_buf();
        runtime::run_local(async move {
            let journal = open_in(&data_path, JOURNAL_RING_BYTES_MIN).await.unwrap();
            let good = journal.clone();
            let bad = journal.clone();
            let (good, bad) = futures_lite::future::zip(
                runtime::spawn(async move {
                    good.append("t-0".into(), vec![JournalEntry::Fence]).await
                }),
                runtime::spawn(async move {
                    bad.append("../t-1".into(), vec![JournalEntry::Fence]).await
                }),
            )
            .await;
            assert!(good.is_ok());
            assert!(bad.unwrap_err().to_string().contains("../t-1"));
            assert_eq!(journal.stats().records, 1);
        });
    }

    #[test]
    fn a_replayed_ring_reopens_empty_and_a_resized_one_is_made_again() {
        let data = tempfile::tempdir().unwrap();
        let data_path = data.path().to_path_buf();
        let dir = data_path.join(JOURNAL_DIR);
        {
            let (data_path, dir) = (data_path.clone(), dir.clone());
            runtime::run_local(async move {
                let journal = ShardJournal::open(&dir, "shard-0", JOURNAL_RING_BYTES_MIN)
                    .await
                    .unwrap();
                let file = segment_file(&data_path, "t-0").await;
                let chunk = JournalChunk {
                    segment_base: Offset(0),
                    position: 0,
                    buffer: chunk_of(9, 1),
                    file,
                    landing: None,
                };
                journal
                    .append("t-0".into(), vec![JournalEntry::Write(chunk)])
                    .await
                    .unwrap();
                // Not replayed: the ring refuses to open over its records.
                let error = ShardJournal::open(&dir, "shard-0", JOURNAL_RING_BYTES_MIN)
                    .await
                    .unwrap_err();
                assert!(error.to_string().contains("not replayed"), "{error}");
            });
        }
        assert_eq!(replay_journals(&data_path).unwrap().writes, 1);
        runtime::run_local(async move {
            let journal = ShardJournal::open(&dir, "shard-0", JOURNAL_RING_BYTES_MIN)
                .await
                .unwrap();
            journal
                .append("t-0".into(), vec![JournalEntry::Fence])
                .await
                .unwrap();
            drop(journal);
            let bytes = std::fs::read(dir.join("shard-0.ring")).unwrap();
            let found = scan(&bytes).unwrap();
            assert_eq!(found.records.len(), 1);
            assert_eq!(found.records[0].body, RecordBody::Fence);
            // Never made again over records not replayed, whatever the size.
            let resized = ShardJournal::open(&dir, "shard-0", JOURNAL_RING_BYTES_MIN * 2)
                .await
                .unwrap_err();
            assert!(resized.to_string().contains("not replayed"), "{resized}");
        });
        replay_journals(&data_path).unwrap();
        let dir = data_path.join(JOURNAL_DIR);
        runtime::run_local(async move {
            // Replayed: another size is made again.
            ShardJournal::open(&dir, "shard-0", JOURNAL_RING_BYTES_MIN * 2)
                .await
                .unwrap();
            assert_eq!(
                std::fs::metadata(dir.join("shard-0.ring")).unwrap().len(),
                JOURNAL_RING_BYTES_MIN * 2
            );
        });
    }
}
