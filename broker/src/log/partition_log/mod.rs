//! The log of one partition replica: append, read, lookups, truncation,
//! retention, flushing and close. It is owned by one shard and used from one
//! executor only; it knows nothing of the network.
//!
//! Appends are synchronous in-memory steps (validate, stamp, stage in the tail,
//! index) so offsets are assigned atomically; all writes of appended bytes and
//! the syncs acknowledgements wait for run under `io_gate`, one at a time, in
//! segment order. Finishing a rolled segment (trim, index files, recovery
//! point, producer snapshot) runs under `segments_gate` alone, beside them.
//!
//! With a shard journal attached (`attach_journal`), a write-out under
//! `flush.policy=always` hands the chunks its writes carry to the journal
//! as it submits them, and its commit waits for the journal's answers
//! instead of syncing the segment files: `durable` then says what the
//! journal holds, and the recovery point stays behind what the segment
//! files hold synced. Whatever changes or removes bytes the journal may
//! still hold for the log fences it first (`fence_journal`).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use protocol::record_batch::marker::{parse_marker, MarkerKind};
use protocol::record_batch::{field, peek_total_bytes};
use protocol::{BatchHeader, LeaderEpoch, Offset, RecordBatch, BATCH_HEADER_BYTES};

use super::checkpoint;
use super::config::{FlushPolicy, LogConfig, STORED_BATCH_BYTES_MAX};
use super::error::{LogError, LogResult};
use super::index::relative;
use super::policy::{self, ActiveSummary, SegmentSummary};
use super::producer_state::{MarkerCheck, ProducerStateTable, SequenceCheck};
use super::recovery;
use super::segment::{
    remove_if_exists, segment_path, write_small_file, Segment, INDEX_SUFFIX, LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
};
use super::shard_journal::{JournalAnswer, JournalChunk, JournalEntry, Landing, ShardJournal};
use super::space_release::{self, SpaceReleaser};
use super::tail::{SealedChunk, Tail};
use super::txn_index::{AbortedIndex, AbortedTxn};
use crate::clock::Clock;
use crate::latency::LatencyHistogram;
use crate::runtime::{self, DirectFile, SerialGate, Watermark, DIRECT_IO_ALIGNMENT_BYTES};

mod compact;
mod producers;

pub use compact::{CleanReport, CleanRequest};
pub use producers::{SNAPSHOT_SUFFIX, TXN_INDEX_SUFFIX};

/// How often, at most, the recovery point is persisted outside rolls and close.
pub const RECOVERY_POINT_CHECKPOINT_MS: i64 = 10_000;

/// How often, at most, silent producers are looked for: expiry is measured
/// in hours, and the walk visits every producer of the partition.
pub const PRODUCER_EXPIRY_CHECK_MS: i64 = 10_000;

/// Attempts of a read that keeps racing truncations before it gives up.
const READ_ATTEMPTS_MAX: usize = 4;

/// Bytes read at a time by the timestamp lookup.
const TIMESTAMP_SCAN_WINDOW_BYTES: u64 = 1 << 20;

/// Bytes of one read from a segment file: a longer range is read in pieces
/// one after another. A catch-up reader's 4 MiB read occupies the device
/// long enough that appends' writes and the journal's rounds queued behind
/// it wait: with three readers catching up, producing 500k msgs/s fell to
/// 300k with publish p99 1.9 s; with pieces of 512, 256 and 128 KiB it
/// held 500k at p99 28, 26 and 18 ms while the disk read 1.48, 1.24 and
/// 1.13 GB/s (docs/performance.md). The middle one keeps reads clear of
/// the 1 GB/s a catch-up is asked for.
pub const DISK_READ_BYTES_MAX: usize = 256 << 10;

/// Direct writes of one segment in flight at once. A few keep the device busy
/// while the next completes; more only add memory held by in-flight buffers.
pub const WRITE_BEHIND_CHUNKS_MAX: usize = 4;

/// Bounds on how far a segment file is extended with allocated space ahead
/// of its writes at once (`preallocate_for`): as much again as the segment
/// holds, within these, so a quiet partition reserves little and a busy one
/// extends its file a few times a second.
pub const PREALLOCATE_BYTES_MIN: u64 = 64 << 10;
pub const PREALLOCATE_BYTES_MAX: u64 = 16 << 20;

/// Where an append landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendInfo {
    pub base_offset: Offset,
    pub last_offset: Offset,
    /// The offset after the batch (after the original, for a duplicate).
    pub log_end_offset: Offset,
    pub max_timestamp_ms: i64,
    /// The batch repeated one its producer had already appended: nothing
    /// was written, and the offsets are the original's.
    pub duplicate: bool,
}

/// Whole stored batches returned by a read, exactly as stored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FetchedBatches {
    pub bytes: Vec<u8>,
    /// Offset after the last returned batch; the next read starts here.
    pub next_offset: Offset,
    pub batch_count: usize,
}

#[derive(Debug)]
struct LogState {
    segments: VecDeque<Segment>,
    latest_epoch: LeaderEpoch,
    /// Persisted recovery point: every offset below it is synced.
    recovery_point: Offset,
    recovery_point_written_ms: i64,
    last_sync_ms: i64,
    closed: bool,
    stats: LogStats,
    /// Compaction covered every key below this offset: what lies past it is
    /// the dirty part. Kept in memory only; after a restart the whole log
    /// counts as dirty once.
    cleaned_to: Offset,
    /// Idempotent producers' epochs and last batches, as of the log end.
    producers: ProducerStateTable,
    /// Producer snapshots taken at rolls, written once the rolled segment
    /// is (offset they stand at, encoded table).
    pending_snapshots: Vec<(Offset, Vec<u8>)>,
    /// When silent producers were last looked for.
    producers_expired_ms: i64,
    /// Aborted transactions whose marker is in the log.
    aborted: AbortedIndex,
    /// When this replica first saw each open transaction (producer -> its
    /// first offset, broker wall ms), for `hanging_transactions`.
    txn_seen: std::collections::HashMap<protocol::ProducerId, (Offset, i64)>,
    /// The log's shape when it opened, kept while nothing may have changed
    /// since: the files were then final (left by a clean close, or a new
    /// empty log), and a close that finds the same shape, no write and no
    /// truncation rewrites nothing. Cleared when producers expire, whose
    /// snapshot on disk would then be stale.
    sealed_at_open: Option<LogShape>,
}

/// Where a log starts and ends, and in how many segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LogShape {
    log_start: Offset,
    log_end: Offset,
    segment_count: usize,
}

impl LogState {
    /// Staged bytes not yet in their file, or a rolled segment not yet
    /// finished: work for a write-out even without a sync.
    fn has_unwritten(&self) -> bool {
        self.segments.iter().any(|s| s.closing) || self.unwritten_bytes() > 0
    }

    fn shape(&self) -> LogShape {
        LogShape {
            log_start: self.segments.front().expect("a log has a segment").base,
            log_end: self.active().next_offset,
            segment_count: self.segments.len(),
        }
    }
}

/// Counters of the log's disk work, for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogStats {
    pub appended_batches: u64,
    pub appended_bytes: u64,
    /// fdatasync calls that made appended data durable (group commits count once).
    pub data_syncs: u64,
    /// Commits made durable by the shard journal instead (each counts once).
    pub journal_commits: u64,
    /// Commits under `always` that synced the files although a journal is
    /// attached (a policy change, a journal failure, a refused record).
    pub journal_fallbacks: u64,
    pub chunk_writes: u64,
    /// Segments checked batch by batch when the log opened, rather than
    /// trusted (after a crash, or with no record of a clean shutdown).
    pub rescanned_segments: u64,
    /// Bytes read from segment files (reads the batch cache and the staged
    /// tail did not answer).
    pub read_bytes: u64,
    /// Extensions of a segment file with allocated space ahead of its
    /// writes (`preallocate_for`), and those the file system refused.
    pub preallocations: u64,
    pub preallocations_refused: u64,
    /// Each direct chunk write, submission to completion, and each data
    /// sync (every file it covers): what an acknowledgement under the
    /// flush policy waits for.
    pub write_latency: LatencyHistogram,
    pub sync_latency: LatencyHistogram,
}

impl std::ops::AddAssign for LogStats {
    fn add_assign(&mut self, other: LogStats) {
        self.appended_batches += other.appended_batches;
        self.appended_bytes += other.appended_bytes;
        self.data_syncs += other.data_syncs;
        self.journal_commits += other.journal_commits;
        self.journal_fallbacks += other.journal_fallbacks;
        self.chunk_writes += other.chunk_writes;
        self.rescanned_segments += other.rescanned_segments;
        self.read_bytes += other.read_bytes;
        self.preallocations += other.preallocations;
        self.preallocations_refused += other.preallocations_refused;
        self.write_latency += other.write_latency;
        self.sync_latency += other.sync_latency;
    }
}

impl LogState {
    fn active(&self) -> &Segment {
        self.segments
            .back()
            .expect("a log always has an active segment")
    }

    fn active_mut(&mut self) -> &mut Segment {
        self.segments
            .back_mut()
            .expect("a log always has an active segment")
    }

    fn segment_mut(&mut self, base: Offset) -> Option<&mut Segment> {
        self.segments.iter_mut().find(|s| s.base == base)
    }

    /// Index of the segment holding `offset` (the last one starting at or before it).
    fn segment_index_for(&self, offset: Offset) -> usize {
        let at = self.segments.partition_point(|s| s.base <= offset);
        assert!(at > 0, "offset {offset} below the log start");
        at - 1
    }

    fn unwritten_bytes(&self) -> usize {
        self.segments
            .iter()
            .filter_map(|s| s.tail.as_ref())
            .map(Tail::unwritten_bytes)
            .sum()
    }
}

#[derive(Debug)]
pub struct PartitionLog {
    dir: PathBuf,
    config: RefCell<LogConfig>,
    clock: Rc<dyn Clock>,
    state: RefCell<LogState>,
    io_gate: SerialGate,
    /// Held while the set of closed segments changes on disk: by retention,
    /// truncation and reset (inside `io_gate`) and by a compaction swap
    /// (alone, so appends and their syncs go on during a swap).
    segments_gate: SerialGate,
    /// Offset below which every record has reached the file (a completed
    /// direct write: in the kernel or the device, safe from a process crash,
    /// not yet from a power loss).
    written: Watermark,
    /// Bumped by every truncation and retention pass, and odd while one is
    /// changing files: a read that saw it odd, or change while it awaited
    /// the disk, starts over.
    generation: Cell<u64>,
    /// Offset below which every record is synced to disk (safe from a power
    /// loss too).
    durable: Watermark,
    /// Tail writes handed to the kernel, and those that came back. A write
    /// outlives a cancelled caller (a produce request dropped with its
    /// connection): io_uring may still carry it out, so the next write-out
    /// waits for it before writing anything that overlaps it.
    writes_submitted: Cell<i64>,
    writes_landed: Rc<Watermark>,
    /// The shard's journal and this log's name in it.
    journal: RefCell<Option<LogJournal>>,
    /// Answers of the journal for chunks handed to it under `always` as
    /// their writes were submitted, not awaited by a commit yet.
    unanswered: RefCell<Vec<JournalAnswer>>,
    /// A chunk landed that no answer above covers and no sync did (written
    /// under another policy or while the journal took no appends, answers
    /// dropped by a policy change, a fence or a dropped commit, a fence
    /// that failed): the next commit syncs the files, and fences if the
    /// journal may hold records of the log.
    unlisted_writes: Cell<bool>,
    /// The journal may hold records of this log since its last fence.
    journaled: Cell<bool>,
    /// The shard's releaser, if any, which frees removed segment files'
    /// blocks in paced steps (`release_space_through`).
    releaser: RefCell<Option<Rc<SpaceReleaser>>>,
}

#[derive(Debug)]
struct LogJournal {
    journal: Rc<ShardJournal>,
    name: Rc<str>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Stamp {
    /// Leader append: assign offsets and stamp the epoch.
    Leader(LeaderEpoch),
    /// Leader append of a transaction marker this broker wrote.
    Marker(LeaderEpoch),
    /// Follower append: keep the leader's offsets and epoch.
    Replica,
}

/// Whether every byte of `segment` that holds data has been synced since it
/// was last written.
fn segment_synced(segment: &Segment) -> bool {
    segment.size_bytes == 0
        || segment
            .file
            .as_ref()
            .is_some_and(|f| f.is_synced_below(segment.size_bytes))
}

impl PartitionLog {
    /// Opens (or creates) the partition log in `dir`, recovering from an unclean
    /// shutdown first.
    pub async fn open(
        dir: &Path,
        config: LogConfig,
        clock: Rc<dyn Clock>,
    ) -> LogResult<Rc<PartitionLog>> {
        PartitionLog::open_after(dir, config, clock, false).await
    }

    /// As `open`; `closed_clean` when the data dir's record of a clean
    /// shutdown (`checkpoint::take_clean_logs`, already removed durably)
    /// names this log, which `close_unmarked` closed: it is then trusted as
    /// a log with its own marker is, and not rescanned.
    pub async fn open_after(
        dir: &Path,
        config: LogConfig,
        clock: Rc<dyn Clock>,
        closed_clean: bool,
    ) -> LogResult<Rc<PartitionLog>> {
        config.validate()?;
        let owned = dir.to_path_buf();
        runtime::blocking(move || checkpoint::create_dir_durably(&owned))
            .await
            .map_err(|e| LogError::io(dir, e))?;
        let recovered = recovery::recover(dir, &config, clock.now_ms(), closed_clean).await?;
        PartitionLog::assemble(dir, config, clock, recovered, false).await
    }

    /// Opens the empty log that `create_empty_logs` just made in `dir`
    /// (and has not been written since): as `open`, without the listings,
    /// checks and producer rebuild an empty log has no use for.
    pub async fn open_empty(
        dir: &Path,
        config: LogConfig,
        clock: Rc<dyn Clock>,
    ) -> LogResult<Rc<PartitionLog>> {
        config.validate()?;
        let recovered = recovery::empty(dir, &config, clock.now_ms()).await?;
        PartitionLog::assemble(dir, config, clock, recovered, true).await
    }

    /// The log over what recovery (or `recovery::empty`) found in `dir`.
    async fn assemble(
        dir: &Path,
        config: LogConfig,
        clock: Rc<dyn Clock>,
        recovered: recovery::Recovered,
        empty: bool,
    ) -> LogResult<Rc<PartitionLog>> {
        let log_end = recovered
            .segments
            .back()
            .expect("recovery yields a segment")
            .next_offset;
        let latest_epoch = recovered.segments.back().expect("segment").latest_epoch;
        let opened_ms = clock.now_ms();
        let log = PartitionLog {
            dir: dir.to_path_buf(),
            config: RefCell::new(config),
            clock,
            state: RefCell::new(LogState {
                segments: recovered.segments,
                latest_epoch,
                recovery_point: log_end,
                recovery_point_written_ms: 0,
                last_sync_ms: 0,
                closed: false,
                stats: LogStats {
                    rescanned_segments: recovered.rescanned_segments,
                    ..LogStats::default()
                },
                cleaned_to: Offset::ZERO,
                producers: ProducerStateTable::new(),
                pending_snapshots: Vec::new(),
                // The first expiry comes a check interval after the open,
                // whenever the owner first maintains the log: not on the
                // first append, which would forget producers whose batches
                // carry old timestamps the moment they write.
                producers_expired_ms: opened_ms,
                aborted: AbortedIndex::new(),
                txn_seen: std::collections::HashMap::new(),
                sealed_at_open: None,
            }),
            io_gate: SerialGate::new(),
            segments_gate: SerialGate::new(),
            written: Watermark::new(log_end.0),
            generation: Cell::new(0),
            durable: Watermark::new(log_end.0),
            writes_submitted: Cell::new(0),
            writes_landed: Rc::new(Watermark::new(0)),
            journal: RefCell::new(None),
            unanswered: RefCell::default(),
            unlisted_writes: Cell::new(false),
            journaled: Cell::new(false),
            releaser: RefCell::new(None),
        };
        {
            let _gate = log.io_gate.enter().await;
            let active_base = log.state.borrow().active().base;
            let file = log.ensure_file(active_base).await?;
            // After a clean shutdown (or for a new, empty log) the checkpoint
            // already vouches for every byte and nothing is unsynced: two
            // fsyncs and a device flush per partition saved, which is most
            // of a restart with thousands of partitions.
            let vouched = recovered.recovery_point.unwrap_or(Offset::ZERO) == log_end
                && log.all_segments_synced();
            if !vouched {
                file.fdatasync()
                    .await
                    .map_err(|e| LogError::io(&log.dir, e))?;
                log.persist_recovery_point(log_end).await?;
            }
        }
        if !empty {
            log.rebuild_producers().await?;
        }
        // Nothing rescanned: the last close sealed every segment (or the log
        // is new), so the files need nothing until the log changes.
        if recovered.rescanned_segments == 0 {
            let mut state = log.state.borrow_mut();
            state.sealed_at_open = Some(state.shape());
        }
        log.check_invariants();
        Ok(Rc::new(log))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Lets commits under `always` go through the shard's journal from now
    /// on. The journal names the log by its directory's name, which replay
    /// finds under the data dir's `topics`. If the ring holds records of an
    /// earlier log of that name (removed and made again, or closed by a
    /// failed swap and reopened in this run), they are fenced first: the
    /// open synced whatever it did not find synced, so this log's files
    /// hold all of it, and older images must never be written over it.
    pub async fn attach_journal(&self, journal: Rc<ShardJournal>) -> LogResult<()> {
        let name: Rc<str> = self
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into())
            .expect("a log directory has a name");
        if journal.has_records_of(&name) {
            journal
                .append(name.clone(), vec![JournalEntry::Fence])
                .await
                .map_err(|e| LogError::io(journal.path(), e))?;
        }
        *self.journal.borrow_mut() = Some(LogJournal { journal, name });
        Ok(())
    }

    /// From now on retention hands the `.log` files it removes to
    /// `releaser`, which frees their blocks in paced steps, instead of
    /// freeing them all with the unlink.
    pub fn release_space_through(&self, releaser: Rc<SpaceReleaser>) {
        *self.releaser.borrow_mut() = Some(releaser);
    }

    /// The settings now in force (a copy: they may change, `set_config`).
    pub fn config(&self) -> LogConfig {
        self.config.borrow().clone()
    }

    /// Applies a topic's changed settings. Appends, rolls, retention and the
    /// cleaner use them from their next decision on; nothing on disk changes.
    pub fn set_config(&self, config: LogConfig) -> LogResult<()> {
        config.validate()?;
        let leaves_always = matches!(self.config.borrow().flush_policy, FlushPolicy::Always)
            && !matches!(config.flush_policy, FlushPolicy::Always);
        if leaves_always && !self.unanswered.borrow().is_empty() {
            // Handed over, never to be awaited, while the journal may hold
            // older images of their pages: acknowledged from now on once
            // written, they wait for a fence first (`fence_owed`).
            self.unanswered.borrow_mut().clear();
            self.unlisted_writes.set(true);
        }
        *self.config.borrow_mut() = config;
        Ok(())
    }

    /// Written bytes newer than images the journal holds of their pages,
    /// and no fence yet: nothing may be acknowledged until a write-out
    /// syncs them and writes one.
    fn fence_owed(&self) -> bool {
        self.journaled.get() && self.unlisted_writes.get()
    }

    pub fn log_start_offset(&self) -> Offset {
        self.state.borrow().segments.front().expect("segment").base
    }

    pub fn log_end_offset(&self) -> Offset {
        self.state.borrow().active().next_offset
    }

    /// Every offset below this one is synced to disk.
    pub fn durable_offset(&self) -> Offset {
        Offset(self.durable.get())
    }

    /// Every offset below this one has reached the file: a process crash
    /// cannot lose it, a power loss can until it is durable.
    pub fn written_offset(&self) -> Offset {
        Offset(self.written.get())
    }

    /// Every offset below this one may be acknowledged under the flush
    /// policy: durable under `always`, written otherwise. Replication counts a
    /// replica's records only up to here, so acknowledged records survive
    /// what the policy promises on every in-sync replica.
    pub fn stable_offset(&self) -> Offset {
        let policy = self.config.borrow().flush_policy;
        match policy {
            FlushPolicy::Always => self.durable_offset(),
            FlushPolicy::IntervalMs(_) | FlushPolicy::None => self.written_offset(),
        }
    }

    /// Compaction covered every key below this offset (in this process).
    pub fn cleaned_to(&self) -> Offset {
        self.state.borrow().cleaned_to
    }

    pub fn recovery_point(&self) -> Offset {
        self.state.borrow().recovery_point
    }

    pub fn latest_epoch(&self) -> LeaderEpoch {
        self.state.borrow().latest_epoch
    }

    pub fn stats(&self) -> LogStats {
        self.state.borrow().stats
    }

    pub fn segment_count(&self) -> usize {
        self.state.borrow().segments.len()
    }

    pub fn size_bytes(&self) -> u64 {
        self.state
            .borrow()
            .segments
            .iter()
            .map(|s| s.size_bytes)
            .sum()
    }

    /// Base offsets of the segments, oldest first.
    pub fn segment_bases(&self) -> Vec<Offset> {
        self.state
            .borrow()
            .segments
            .iter()
            .map(|s| s.base)
            .collect()
    }

    /// Every invariant of the log, over all its segments: after open, flush,
    /// roll, retention and truncation.
    pub fn check_invariants(&self) {
        self.check_state(&self.state.borrow());
    }

    fn check_state(&self, state: &LogState) {
        let mut expected = state.segments.front().expect("segment").base;
        for (i, segment) in state.segments.iter().enumerate() {
            segment.check_invariants();
            assert_eq!(segment.base, expected, "segments are contiguous");
            expected = segment.next_offset;
            let is_last = i + 1 == state.segments.len();
            assert!(
                is_last || !segment.is_empty() || segment.closing,
                "only the active segment is empty"
            );
            assert_eq!(
                is_last,
                segment.tail.is_some() && !segment.closing,
                "exactly the last segment is active"
            );
        }
        assert!(
            state.recovery_point.0 <= self.durable.get(),
            "recovery point {} above the durable offset {}",
            state.recovery_point,
            self.durable.get()
        );
        assert!(
            self.durable.get() <= self.written.get(),
            "durable offset {} above the written offset {}",
            self.durable.get(),
            self.written.get()
        );
        assert!(
            self.written.get() <= expected.0,
            "written offset {} beyond the log end {expected}",
            self.written.get()
        );
    }

    /// The invariants an append can break, in constant time (they run after
    /// every append): the active segment is the last, continues the one
    /// before it and ends where its tail does; the watermarks stay ordered
    /// within the log.
    fn check_append(&self, state: &LogState) {
        let active = state.active();
        active.check_invariants();
        assert!(
            active.tail.is_some() && !active.closing,
            "the last segment is active"
        );
        if let Some(previous) = state.segments.iter().rev().nth(1) {
            assert_eq!(
                previous.next_offset, active.base,
                "the active segment continues the log"
            );
        }
        assert!(
            self.durable.get() <= self.written.get() && self.written.get() <= active.next_offset.0,
            "durable {} <= written {} <= log end {}",
            self.durable.get(),
            self.written.get(),
            active.next_offset
        );
    }

    /// Validates `batch`, assigns it the next offsets, stamps `leader_epoch` and
    /// stages it for writing. Waits only when too many bytes are unwritten.
    pub async fn append(&self, batch: &[u8], leader_epoch: LeaderEpoch) -> LogResult<AppendInfo> {
        self.append_with(batch, Stamp::Leader(leader_epoch), None)
            .await
    }

    /// `append`, only if `still_leads` holds when the batch is staged: an
    /// append may wait for earlier bytes to be written first, and a leader
    /// deposed (or re-elected at a newer epoch) meanwhile must not stamp a
    /// batch with its old epoch. `LogError::Changed` otherwise.
    pub async fn append_if(
        &self,
        batch: &[u8],
        leader_epoch: LeaderEpoch,
        still_leads: &dyn Fn() -> bool,
    ) -> LogResult<AppendInfo> {
        self.append_with(batch, Stamp::Leader(leader_epoch), Some(still_leads))
            .await
    }

    /// Appends a transaction marker (built by
    /// `protocol::record_batch::marker::build_marker_batch`) as leader at
    /// `leader_epoch`, if `still_leads` holds when it is staged. Refused
    /// when the batch is no marker, or its producer epoch or coordinator
    /// epoch is older than this partition has seen.
    pub async fn append_marker(
        &self,
        batch: &[u8],
        leader_epoch: LeaderEpoch,
        still_leads: &dyn Fn() -> bool,
    ) -> LogResult<AppendInfo> {
        self.append_with(batch, Stamp::Marker(leader_epoch), Some(still_leads))
            .await
    }

    /// The offset read_committed consumers read up to: the high watermark,
    /// or before it where the oldest transaction not yet stably ended began.
    pub fn last_stable_offset(&self, high_watermark: Offset) -> Offset {
        let first = self
            .state
            .borrow_mut()
            .producers
            .first_unstable_offset(high_watermark);
        // Retention may have removed an open transaction's first batches.
        let lso = first.map_or(high_watermark, |f| f.min(high_watermark));
        lso.max(self.log_start_offset().min(high_watermark))
    }

    /// Transactions this replica has seen open for longer than
    /// `open_ms_max` (counted from when it first saw them, in this process):
    /// (producer, its epoch, the last coordinator epoch it heard). Their
    /// coordinator should long have ended them; a leader aborts them so a
    /// producer that set the transactional bit without a coordinator (or a
    /// coordinator that lost them) cannot hold the last stable offset
    /// forever.
    pub fn hanging_transactions(
        &self,
        now_ms: i64,
        open_ms_max: i64,
    ) -> Vec<(protocol::ProducerId, protocol::ProducerEpoch, i32)> {
        let mut state = self.state.borrow_mut();
        let LogState {
            producers,
            txn_seen,
            ..
        } = &mut *state;
        if producers.open_transactions().next().is_none() {
            // The common case, every few seconds for every replica.
            txn_seen.clear();
            return Vec::new();
        }
        let open: std::collections::HashMap<_, _> = producers
            .open_transactions()
            .map(|(first, id)| (id, first))
            .collect();
        txn_seen.retain(|id, (first, _)| open.get(id) == Some(first));
        let mut hanging = Vec::new();
        for (id, first) in open {
            let since_ms = txn_seen.entry(id).or_insert((first, now_ms)).1;
            if now_ms.saturating_sub(since_ms) > open_ms_max {
                let entry = producers
                    .get(id)
                    .expect("an open transaction's producer is known");
                hanging.push((id, entry.epoch, entry.coordinator_epoch.max(0)));
            }
        }
        hanging.sort();
        hanging
    }

    /// Aborted transactions a reader of `[from, to)` must skip, oldest first.
    pub fn aborted_transactions(&self, from: Offset, to: Offset) -> Vec<AbortedTxn> {
        self.state.borrow().aborted.overlapping(from, to)
    }

    /// Appends a batch copied from the leader, keeping its offsets and epoch.
    pub async fn append_replica(&self, batch: &[u8]) -> LogResult<AppendInfo> {
        self.append_with(batch, Stamp::Replica, None).await
    }

    async fn append_with(
        &self,
        batch: &[u8],
        stamp: Stamp,
        still_valid: Option<&dyn Fn() -> bool>,
    ) -> LogResult<AppendInfo> {
        // One copy of the settings for the whole append (`set_config` may
        // replace them while it waits).
        let config = self.config();
        let parsed = RecordBatch::parse(batch, config.batch_bytes_max)?;
        let header = *parsed.header();
        if let Stamp::Leader(_) = stamp {
            if header.is_control() {
                return Err(LogError::InvalidRecord(
                    "control batches are written by brokers only".into(),
                ));
            }
        }
        // A control batch that is not a transaction marker ends nothing.
        let marker = match stamp {
            _ if !header.is_control() => None,
            Stamp::Marker(_) => Some(parse_marker(&parsed)?),
            Stamp::Leader(_) | Stamp::Replica => parse_marker(&parsed).ok(),
        };
        if let Stamp::Leader(_) | Stamp::Marker(_) = stamp {
            header.check_producer_batch()?;
            if config.cleanup_policy.compact && !header.is_control() {
                Self::check_keyed(&parsed, config.decompressed_bytes_max)?;
            }
        }
        while self.state.borrow().unwritten_bytes() + batch.len() > config.unwritten_bytes_max {
            let _gate = self.io_gate.enter().await;
            self.write_out(false).await?;
        }
        if still_valid.is_some_and(|still| !still()) {
            return Err(LogError::Changed);
        }
        let now_ms = self.clock.now_ms();
        if self.generation.get() % 2 == 1 {
            // A truncation is changing the files: this replica was a follower
            // a moment ago and its log end is about to move.
            return Err(LogError::Changed);
        }
        let mut state = self.state.borrow_mut();
        if state.closed {
            return Err(LogError::Closed);
        }
        let log_end = state.active().next_offset;
        let (base, epoch) = match stamp {
            Stamp::Leader(epoch) | Stamp::Marker(epoch) => (log_end, epoch),
            Stamp::Replica => (header.base_offset, header.partition_leader_epoch),
        };
        if epoch < state.latest_epoch {
            return Err(LogError::StaleLeaderEpoch {
                epoch,
                latest: state.latest_epoch,
            });
        }
        // A replica's batch may start past its log end: the leader's log has a
        // hole there that compaction left, and offsets never move.
        let misplaced = match stamp {
            Stamp::Leader(_) | Stamp::Marker(_) => base != log_end,
            Stamp::Replica => base < log_end,
        };
        if misplaced {
            return Err(LogError::NonContiguousReplica {
                batch_base: base,
                log_end,
            });
        }
        if let (Stamp::Marker(_), Some(marker)) = (stamp, marker) {
            let check =
                state
                    .producers
                    .check_marker(header.producer_id, header.producer_epoch, marker)?;
            if let MarkerCheck::Written(offset) = check {
                // A resend (by a coordinator that took over): answered as the
                // marker already here, once that is as safe.
                return Ok(AppendInfo {
                    base_offset: offset,
                    last_offset: offset,
                    log_end_offset: offset.plus(1),
                    max_timestamp_ms: header.max_timestamp_ms,
                    duplicate: true,
                });
            }
        }
        if let Stamp::Leader(_) = stamp {
            match state.producers.check(&header)? {
                SequenceCheck::Append => {}
                SequenceCheck::Duplicate(original) => {
                    return Ok(AppendInfo {
                        base_offset: original.base_offset,
                        last_offset: original.last_offset,
                        log_end_offset: original.last_offset.plus(1),
                        max_timestamp_ms: header.max_timestamp_ms,
                        duplicate: true,
                    });
                }
            }
        }
        let stored = BatchHeader {
            base_offset: base,
            partition_leader_epoch: epoch,
            ..header
        };
        let active = state.active();
        let summary = ActiveSummary {
            base: active.base,
            next_offset: active.next_offset,
            size_bytes: active.size_bytes,
            created_ms: active.created_ms,
        };
        if policy::should_roll(
            &config,
            summary,
            batch.len() as u64,
            stored.next_offset(),
            now_ms,
        ) {
            self.roll(&mut state, now_ms);
        }
        let mut stamped_prefix = [0u8; field::MAGIC];
        stamped_prefix.copy_from_slice(&batch[..field::MAGIC]);
        stamped_prefix[field::BASE_OFFSET..field::BASE_OFFSET + 8]
            .copy_from_slice(&base.0.to_be_bytes());
        stamped_prefix[field::PARTITION_LEADER_EPOCH..field::PARTITION_LEADER_EPOCH + 4]
            .copy_from_slice(&epoch.0.to_be_bytes());
        let interval = config.index_interval_bytes;
        let active = state.active_mut();
        let tail = active.tail.as_mut().expect("active segment has a tail");
        tail.append(&stamped_prefix);
        tail.append(&batch[field::MAGIC..]);
        active.account_batch(&stored, interval);
        if let Some(done) = state.producers.apply(&stored, marker) {
            if done.kind == MarkerKind::Abort {
                state.aborted.insert(AbortedTxn {
                    producer_id: done.producer_id,
                    first_offset: done.first_offset,
                    last_offset: done.marker_offset,
                });
            }
        }
        state.latest_epoch = epoch;
        state.stats.appended_batches += 1;
        state.stats.appended_bytes += batch.len() as u64;
        self.check_append(&state);
        Ok(AppendInfo {
            base_offset: base,
            last_offset: stored.last_offset(),
            log_end_offset: stored.next_offset(),
            max_timestamp_ms: stored.max_timestamp_ms,
            duplicate: false,
        })
    }

    /// Compaction keeps the latest record per key, so a compacted log takes
    /// only records with a key (Kafka refuses them the same way).
    fn check_keyed(batch: &RecordBatch<'_>, decompressed_bytes_max: usize) -> LogResult<()> {
        let section = batch.records_section(decompressed_bytes_max)?;
        for record in section.iter() {
            if record?.key.is_none() {
                return Err(LogError::InvalidRecord(
                    "a compacted topic takes only records with a key".into(),
                ));
            }
        }
        Ok(())
    }

    fn roll(&self, state: &mut LogState, now_ms: i64) {
        let active = state.active_mut();
        active.closing = true;
        active.tail.as_mut().expect("tail").seal_partial();
        let base = active.next_offset;
        let epoch = active.latest_epoch;
        // The state as the new segment starts: recovery replays from here.
        let snapshot = state.producers.encode_snapshot(base);
        state.pending_snapshots.push((base, snapshot));
        let mut next = Segment::new_active(
            base,
            now_ms,
            self.config().write_chunk_bytes,
            self.config().index_interval_bytes,
        );
        next.latest_epoch = epoch;
        state.segments.push_back(next);
        self.check_state(state);
    }

    /// Waits until the records below `next_offset` may be acknowledged under the
    /// flush policy: synced for `always`, written to the file otherwise, so a
    /// process crash never loses an acknowledged record whatever the policy.
    /// Concurrent callers share writes and syncs (group commit).
    pub async fn wait_for_ack(&self, next_offset: Offset) -> LogResult<()> {
        let policy = self.config.borrow().flush_policy;
        match policy {
            FlushPolicy::Always => self.flush_to(next_offset).await,
            FlushPolicy::IntervalMs(_) | FlushPolicy::None => self.write_to(next_offset).await,
        }
    }

    /// Writes and syncs everything below `target`. Callers that arrive while a
    /// sync is in flight wait for it and then share the next one: group commit.
    pub async fn flush_to(&self, target: Offset) -> LogResult<()> {
        self.reach(target, &self.durable, true).await
    }

    /// Writes (without syncing) everything below `target` to the file.
    pub async fn write_to(&self, target: Offset) -> LogResult<()> {
        self.reach(target, &self.written, false).await
    }

    async fn reach(&self, target: Offset, mark: &Watermark, sync: bool) -> LogResult<()> {
        while mark.get() < target.0 || self.fence_owed() {
            let _gate = self.io_gate.enter().await;
            if mark.get() >= target.0 && !self.fence_owed() {
                break;
            }
            // Appended while the log was closing: never written, never acknowledged.
            self.refuse_if_closed()?;
            let (log_start, log_end) = (self.log_start_offset(), self.log_end_offset());
            if target > log_end {
                // Truncated meanwhile (a leader became a follower): those
                // records are gone and will never be written here.
                return Err(LogError::OffsetOutOfRange {
                    requested: target,
                    log_start,
                    log_end,
                });
            }
            self.write_out(sync).await?;
        }
        Ok(())
    }

    /// Writes and syncs everything appended so far and finishes every rolled
    /// segment, as [`maintain`](Self::maintain) would later.
    pub async fn flush(&self) -> LogResult<()> {
        self.flush_to(self.log_end_offset()).await?;
        let _segments = self.segments_gate.enter().await;
        self.finish_rolled().await
    }

    /// Whether `maintain` has anything to do at `now_ms` beyond forgetting
    /// expired producers: staged bytes to write, bytes the policy will sync,
    /// a rolled segment to finish, a recovery point due. An owner of
    /// thousands of idle logs asks this instead of maintaining each one, so
    /// it reads a few fields and its segment list, nothing else; producer
    /// expiry, every `PRODUCER_EXPIRY_CHECK_MS` at most, can wait for the
    /// owner's rarer pass over every log.
    pub fn maintenance_due(&self, now_ms: i64) -> bool {
        let checkpoint_due = {
            let state = self.state.borrow();
            self.durable.get() > state.recovery_point.0
                && now_ms - state.recovery_point_written_ms >= RECOVERY_POINT_CHECKPOINT_MS
        } && self.checkpointable_offset() > self.recovery_point();
        checkpoint_due || self.has_pending_writes()
    }

    /// Whether appended bytes still wait for `maintain`: staged and not
    /// written, a rolled segment not finished, or (under a policy that
    /// syncs) written and not synced. Under `interval_ms` that holds until
    /// the interval has passed, so an owner keeps visiting the log until it
    /// syncs; the first bytes after an idle spell are synced at the next
    /// visit, the interval having passed long ago.
    pub fn has_pending_writes(&self) -> bool {
        let state = self.state.borrow();
        let unsynced = self.durable.get() < state.active().next_offset.0;
        let syncs = !matches!(self.config.borrow().flush_policy, FlushPolicy::None);
        (syncs && unsynced) || state.has_unwritten()
    }

    /// Periodic work: interval flushes, write-behind of staged bytes and
    /// recovery-point checkpoints. The owner calls it every few milliseconds
    /// when [`PartitionLog::maintenance_due`] says so.
    pub async fn maintain(&self) -> LogResult<()> {
        let now_ms = self.clock.now_ms();
        // A rolled segment not finished yet (its finish failed, say) is
        // written out again, as `has_pending_writes` reports it.
        let (last_sync_ms, has_unwritten) = {
            let state = self.state.borrow();
            (state.last_sync_ms, state.has_unwritten())
        };
        // A log closed by its owner has nothing left here: everything is
        // written, synced and checkpointed. One closed by a failed compaction
        // swap still syncs what it wrote and acknowledged before.
        {
            let _gate = self.io_gate.enter().await;
            let unsynced = self.durable.get() < self.log_end_offset().0;
            let policy = self.config.borrow().flush_policy;
            match policy {
                // Nothing new since the last sync: an idle log costs no sync.
                FlushPolicy::IntervalMs(ms) if unsynced && now_ms - last_sync_ms >= ms as i64 => {
                    self.write_out(true).await?
                }
                // Under `always`, records nobody waited for (acks=0, a
                // follower's) are synced here, promptly, like everything else.
                FlushPolicy::Always if unsynced => self.write_out(true).await?,
                _ if has_unwritten => self.write_out(false).await?,
                _ => {}
            }
            self.expire_producers(now_ms);
        }
        // Outside the I/O gate: a rolled segment's syncs and index files
        // never hold up the writes and syncs acknowledgements wait for. The
        // segments gate is asked for only when there is work under it, so
        // an idle log's visit never waits behind a compaction swap.
        let checkpoint_due = || {
            now_ms - self.state.borrow().recovery_point_written_ms >= RECOVERY_POINT_CHECKPOINT_MS
                && self.checkpointable_offset() > self.recovery_point()
        };
        let rolled = self.state.borrow().segments.iter().any(|s| s.closing);
        if !rolled && !checkpoint_due() {
            return Ok(());
        }
        let _segments = self.segments_gate.enter().await;
        self.finish_rolled().await?;
        if checkpoint_due() {
            self.persist_recovery_point(self.checkpointable_offset())
                .await?;
        }
        Ok(())
    }

    /// Whether every byte of every segment is synced since it was written
    /// (files opened and not written since count as synced).
    fn all_segments_synced(&self) -> bool {
        self.state.borrow().segments.iter().all(segment_synced)
    }

    async fn persist_recovery_point(&self, offset: Offset) -> LogResult<()> {
        {
            let state = self.state.borrow();
            for segment in state.segments.iter().filter(|s| s.next_offset <= offset) {
                assert!(
                    segment_synced(segment),
                    "recovery point {offset} vouches for segment {} of {}, whose bytes are not all synced",
                    segment.base,
                    self.dir.display()
                );
            }
            if let Some(unfinished) = state.segments.iter().find(|s| s.closing) {
                assert!(
                    offset <= unfinished.base,
                    "recovery point {offset} passes the rolled segment {} of {}, not finished",
                    unfinished.base,
                    self.dir.display()
                );
            }
        }
        let dir = self.dir.clone();
        runtime::blocking(move || checkpoint::write_recovery_point(&dir, offset))
            .await
            .map_err(|e| LogError::io(&self.dir, e))?;
        let mut state = self.state.borrow_mut();
        state.recovery_point = offset;
        state.recovery_point_written_ms = self.clock.now_ms();
        Ok(())
    }

    async fn ensure_file(&self, base: Offset) -> LogResult<DirectFile> {
        if let Some(file) = self
            .state
            .borrow_mut()
            .segment_mut(base)
            .and_then(|s| s.file.clone())
        {
            return Ok(file);
        }
        // Boxed: once per segment, and the creation's future would otherwise
        // grow every write's.
        Box::pin(self.create_segment_file(base)).await
    }

    async fn create_segment_file(&self, base: Offset) -> LogResult<DirectFile> {
        let path = segment_path(&self.dir, base, LOG_SUFFIX);
        let file = DirectFile::create_new(&path)
            .await
            .map_err(|e| LogError::io(&path, e))?;
        // Its directory entry is durable before any write to it is vouched for.
        self.remove_files_and_sync(Vec::new(), false).await?;
        if let Some(segment) = self.state.borrow_mut().segment_mut(base) {
            segment.file = Some(file.clone());
        }
        Ok(file)
    }

    /// Carries staged bytes of every segment to its file in order, and with
    /// `sync` makes everything appended before the call durable. Callers hold
    /// `io_gate`.
    ///
    /// Appends run at every await here, and one of them may roll the segment
    /// being written: its last partial chunk is then sealed after this call
    /// looked at the tail. A closing segment is therefore written to the very
    /// end of its tail before anything after it counts as written, never only
    /// up to where it ended when the call began.
    ///
    /// A rolled segment is only written here, not finished: its trim, index
    /// files, recovery point and producer snapshot are
    /// [`finish_rolled`](Self::finish_rolled)'s, outside this gate, so a roll
    /// does not hold up the acknowledgements of the segment after it.
    async fn write_out(&self, sync: bool) -> LogResult<()> {
        assert!(self.io_gate.is_held());
        self.settle_writes().await;
        let target_end = self.log_end_offset();
        let mut after: Option<Offset> = None;
        while let Some(base) = self.next_segment_to_write(after, target_end) {
            after = Some(base);
            let file = self.ensure_file(base).await?;
            let end = {
                let mut state = self.state.borrow_mut();
                // Finished meanwhile: every byte of it was written already.
                let Some(tail) = state.segment_mut(base).and_then(|s| s.tail.as_mut()) else {
                    continue;
                };
                tail.seal_partial();
                tail.end()
            };
            self.write_waves(base, &file, end).await?;
        }
        let mut synced_files = false;
        if sync {
            let started = self.clock.monotonic();
            let journaled = self.commit_to_journal().await;
            if !journaled {
                self.sync_files().await?;
                synced_files = true;
            }
            let elapsed = self.clock.monotonic().saturating_sub(started);
            let mut state = self.state.borrow_mut();
            state.last_sync_ms = self.clock.now_ms();
            if journaled {
                state.stats.journal_commits += 1;
            } else {
                state.stats.data_syncs += 1;
            }
            state.stats.sync_latency.record(elapsed);
        }
        // Bytes made durable, or acknowledged once written, without the
        // journal while it holds older images of them (a policy change, a
        // failed or refused commit): a replay would write those images back
        // over them. Fenced before any of it is acknowledged.
        if self.journaled.get() && (synced_files || self.unlisted_writes.get()) {
            if !synced_files {
                self.settle_writes().await;
                self.sync_files().await?;
            }
            self.append_fence().await?;
        }
        // Only now: a write acknowledged once written (`write_to`) must not
        // pass before the fence above.
        if target_end.0 > self.written.get() {
            self.written.advance(target_end.0);
        }
        if sync && target_end.0 > self.durable.get() {
            self.durable.advance(target_end.0);
        }
        self.check_invariants();
        Ok(())
    }

    /// Makes every chunk written so far durable through the shard journal,
    /// under `always` with a journal attached: the chunks were handed over
    /// as their writes were submitted (`write_waves`), and this waits for
    /// the journal's answers. False when the files must be synced instead
    /// (no journal, another policy, a chunk written without being handed
    /// over, or the journal failed). Callers hold `io_gate`, and every
    /// write they made has landed.
    async fn commit_to_journal(&self) -> bool {
        let journal = {
            let attached = self.journal.borrow();
            let Some(attached) = attached.as_ref() else {
                return false;
            };
            if !matches!(self.config.borrow().flush_policy, FlushPolicy::Always) {
                return false;
            }
            attached.journal.clone()
        };
        if self.unlisted_writes.get() || journal.is_failed() {
            self.state.borrow_mut().stats.journal_fallbacks += 1;
            return false;
        }
        let answers = std::mem::take(&mut *self.unanswered.borrow_mut());
        if answers.is_empty() {
            // Every chunk landed so far was answered for or synced already.
            return true;
        }
        // If this call is dropped before every answer came, the answers
        // taken above are lost with it: the next commit syncs the files.
        self.unlisted_writes.set(true);
        let mut failure = None;
        for answer in answers {
            if let Err(e) = answer.await {
                failure.get_or_insert(e);
            }
        }
        match failure {
            None => {
                // Only `io_gate` holders set it, and it was clear above.
                self.unlisted_writes.set(false);
                true
            }
            Some(e) => {
                // The chunks landed: syncing their files covers them.
                tracing::warn!(dir = %self.dir.display(), error = %e, "journal commit failed; syncing the segment files instead");
                self.state.borrow_mut().stats.journal_fallbacks += 1;
                false
            }
        }
    }

    /// Syncs every segment file with bytes written since its last sync (the
    /// active one always: a rolled segment not finished yet may hold
    /// unsynced bytes below it, and a crash must not leave a gap before
    /// records this sync vouches for). Callers hold `io_gate`; every chunk
    /// landed so far is then covered.
    async fn sync_files(&self) -> LogResult<()> {
        let files: Vec<DirectFile> = {
            let state = self.state.borrow();
            let last = state.segments.len() - 1;
            state
                .segments
                .iter()
                .enumerate()
                .filter(|(i, s)| *i == last || !segment_synced(s))
                .filter_map(|(_, s)| s.file.clone())
                .collect()
        };
        for file in files {
            file.fdatasync()
                .await
                .map_err(|e| LogError::io(&self.dir, e))?;
        }
        // Handed over or not, every chunk landed is in a synced file now.
        self.unanswered.borrow_mut().clear();
        self.unlisted_writes.set(false);
        Ok(())
    }

    /// Before a change to bytes the journal may still hold records of (a
    /// truncation, a reset, a removal): replay must never write them again.
    /// With `keep`, what the log keeps is synced into its files first, since
    /// the records that held it no longer count. Callers hold `io_gate`.
    async fn fence_journal(&self, keep: bool) -> LogResult<()> {
        if !self.unanswered.borrow().is_empty() {
            // Never awaited now: the change may cut what they carry, and the
            // fence below follows their records in the ring. What they
            // carried and the log keeps is synced by the next commit (or
            // below).
            self.unanswered.borrow_mut().clear();
            self.unlisted_writes.set(true);
        }
        if !self.journaled.get() || self.journal.borrow().is_none() {
            return Ok(());
        }
        assert!(self.io_gate.is_held());
        self.settle_writes().await;
        if keep {
            self.sync_files().await?;
        }
        self.append_fence().await
    }

    /// Writes the fence record `fence_journal` needs, once the log's files
    /// hold whatever it keeps. Callers hold `io_gate`.
    async fn append_fence(&self) -> LogResult<()> {
        if let Err(e) = self.append_to_journal(vec![JournalEntry::Fence]).await {
            // Still owed (`fence_owed`): a sync before it may have cleared
            // the mark, and nothing it covers may be acknowledged unfenced.
            self.unlisted_writes.set(true);
            return Err(e);
        }
        self.journaled.set(false);
        Ok(())
    }

    /// Before the log's directory is removed (whether or not its close
    /// succeeded): a log made again under its name must never get this
    /// one's images from a replay.
    pub async fn fence_for_removal(&self) -> LogResult<()> {
        let has_records = self
            .journal
            .borrow()
            .as_ref()
            .is_some_and(|a| a.journal.has_records_of(&a.name));
        if !has_records {
            return Ok(());
        }
        self.append_fence().await
    }

    /// As `fence_journal` for the segments at `bases` only, whose files a
    /// compaction swap replaces: they are sealed and synced, and nothing is
    /// written to them again, so no sync and no gate is needed.
    async fn fence_journal_segments(&self, bases: &[Offset]) -> LogResult<()> {
        if !self.journaled.get() {
            return Ok(());
        }
        let entries = bases
            .iter()
            .map(|b| JournalEntry::SegmentFence(*b))
            .collect();
        self.append_to_journal(entries).await
    }

    /// Hands `entries` of this log to the attached journal (none attached:
    /// nothing to do) and waits until they are durable.
    async fn append_to_journal(&self, entries: Vec<JournalEntry>) -> LogResult<()> {
        let Some((journal, name)) = self
            .journal
            .borrow()
            .as_ref()
            .map(|a| (a.journal.clone(), a.name.clone()))
        else {
            return Ok(());
        };
        journal
            .append(name, entries)
            .await
            .map_err(|e| LogError::io(journal.path(), e))
    }

    /// The oldest segment after `after` that still has a tail and either holds
    /// offsets below `target_end` or is closing (a rolled segment must be
    /// finished before anything after it counts as written).
    fn next_segment_to_write(&self, after: Option<Offset>, target_end: Offset) -> Option<Offset> {
        let state = self.state.borrow();
        state
            .segments
            .iter()
            .filter(|s| after.is_none_or(|a| s.base > a))
            .find(|s| s.tail.is_some())
            .filter(|s| s.closing || s.base < target_end)
            .map(|s| s.base)
    }

    /// Writes the sealed chunks of segment `base` below `end`, a few at a time
    /// in waves; all of them, whatever `end`, once the segment is closing.
    async fn write_waves(&self, base: Offset, file: &DirectFile, end: u64) -> LogResult<()> {
        loop {
            let (wave, allocated_bytes) = {
                let state = self.state.borrow();
                // Finished (or truncated away) meanwhile: nothing left to write.
                let Some(segment) = state.segments.iter().find(|s| s.base == base) else {
                    return Ok(());
                };
                let Some(tail) = segment.tail.as_ref() else {
                    return Ok(());
                };
                let limit = if segment.closing { u64::MAX } else { end };
                (
                    tail.write_wave(limit, WRITE_BEHIND_CHUNKS_MAX),
                    segment.allocated_bytes,
                )
            };
            if wave.is_empty() {
                return Ok(());
            }
            self.preallocate_for(base, file, &wave, allocated_bytes)
                .await;
            // Each write runs to its end even if this call is dropped; its
            // chunk then stays unwritten here and the next write-out writes
            // it again, once this one has landed.
            let wave_landed = Rc::new(Watermark::new(0));
            let writes: Vec<_> = wave
                .iter()
                .map(|chunk| {
                    let (file, buffer, start) = (file.clone(), chunk.buffer.clone(), chunk.start);
                    let landed = self.writes_landed.clone();
                    let wave_landed = wave_landed.clone();
                    let clock = self.clock.clone();
                    let (done, result) = runtime::oneshot();
                    self.writes_submitted.set(self.writes_submitted.get() + 1);
                    runtime::spawn(async move {
                        let started = clock.monotonic();
                        let written = file.write_at(&buffer, start).await;
                        let elapsed = clock.monotonic().saturating_sub(started);
                        landed.advance(landed.get() + 1);
                        wave_landed.advance(wave_landed.get() + 1);
                        done.send(written.map(|()| elapsed));
                    })
                    .detach();
                    result
                })
                .collect();
            // Under `always` the chunks go to the journal now, beside their
            // writes: an acknowledgement waits for the later of the two, not
            // for one after the other. A checkpoint waits for the writes'
            // landing before it syncs the file and releases the records.
            // A journal that failed or closed takes nothing: the log then
            // syncs its files, and one it holds nothing of owes no fence.
            let journal = self
                .journal
                .borrow()
                .as_ref()
                .filter(|_| matches!(self.config.borrow().flush_policy, FlushPolicy::Always))
                .filter(|attached| attached.journal.takes_appends())
                .map(|attached| (attached.journal.clone(), attached.name.clone()));
            let listed = journal.is_some();
            if let Some((journal, name)) = journal {
                let landing = Landing {
                    mark: wave_landed,
                    count: wave.len() as i64,
                };
                let entries = wave
                    .iter()
                    .map(|chunk| {
                        JournalEntry::Write(JournalChunk {
                            segment_base: base,
                            position: chunk.start,
                            buffer: chunk.buffer.clone(),
                            file: file.clone(),
                            landing: Some(landing.clone()),
                        })
                    })
                    .collect();
                // Set before the record may reach the ring: a fence must
                // follow any record there, even one whose write then fails.
                self.journaled.set(true);
                let answer = journal.submit(name, entries);
                self.unanswered.borrow_mut().push(answer);
            }
            let mut failure = None;
            let mut latency = LatencyHistogram::default();
            for write in writes {
                let written = write
                    .await
                    .unwrap_or_else(|| Err(std::io::Error::other("a tail write was dropped")));
                match written {
                    Ok(elapsed) => latency.record(elapsed),
                    Err(e) => {
                        failure.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = failure {
                return Err(LogError::io(segment_path(&self.dir, base, LOG_SUFFIX), e));
            }
            // Written without a journal record: the next commit syncs the
            // files instead.
            if !listed {
                self.unlisted_writes.set(true);
            }
            let mut state = self.state.borrow_mut();
            let tail = state
                .segment_mut(base)
                .and_then(|s| s.tail.as_mut())
                .expect("tail");
            for chunk in &wave {
                tail.pop_written(chunk.start);
            }
            // Counted with the writes, for whole waves only: a failed wave's
            // chunks are all written again.
            state.stats.chunk_writes += wave.len() as u64;
            state.stats.write_latency += latency;
        }
    }

    /// Extends segment `base`'s file with allocated space when `wave` would
    /// write past `allocated_bytes` (what was allocated so far), so the wave's writes land inside the
    /// file's size and complete inline instead of on io_uring's kernel
    /// workers (`DirectFile::preallocate`). Never past the roll size: a
    /// segment's file is trimmed to its data when it is sealed, and a
    /// recovery cuts the zeros after the last valid batch as it cuts a torn
    /// write. A refusal (a full disk, a file system without `fallocate`)
    /// costs the writes only their speed: they extend the file themselves.
    ///
    /// Counted among the writes `settle_writes` waits for, so an extension
    /// whose write-out was dropped can never land after a seal or a cut.
    async fn preallocate_for(
        &self,
        base: Offset,
        file: &DirectFile,
        wave: &[SealedChunk],
        allocated_bytes: u64,
    ) {
        let from = wave.first().map_or(0, |c| c.start);
        let wave_end = wave
            .iter()
            .map(|c| c.start + c.buffer.len() as u64)
            .max()
            .unwrap_or(0);
        if wave_end <= allocated_bytes {
            return;
        }
        let segment_size_bytes = self.config.borrow().segment_size_bytes;
        let step = wave_end.clamp(PREALLOCATE_BYTES_MIN, PREALLOCATE_BYTES_MAX);
        let limit = segment_size_bytes.next_multiple_of(DIRECT_IO_ALIGNMENT_BYTES);
        let to = (wave_end + step)
            .next_multiple_of(DIRECT_IO_ALIGNMENT_BYTES)
            .min(limit);
        if to <= wave_end {
            // The last stretch before the roll: the writes extend the file.
            return;
        }
        let (done, result) = runtime::oneshot();
        let landed = self.writes_landed.clone();
        self.writes_submitted.set(self.writes_submitted.get() + 1);
        let extended = file.clone();
        runtime::spawn(async move {
            let outcome = extended.preallocate(from, to).await;
            landed.advance(landed.get() + 1);
            done.send(outcome);
        })
        .detach();
        let outcome = result.await;
        let mut state = self.state.borrow_mut();
        match outcome {
            Some(Ok(())) => {
                state.stats.preallocations += 1;
                if let Some(segment) = state.segment_mut(base) {
                    segment.allocated_bytes = segment.allocated_bytes.max(to);
                }
            }
            Some(Err(e)) => {
                state.stats.preallocations_refused += 1;
                tracing::debug!(dir = %self.dir.display(), %base, error = %e, "segment space not allocated ahead");
                if e.kind() == std::io::ErrorKind::Unsupported
                    || e.raw_os_error() == Some(95 /* EOPNOTSUPP */)
                {
                    // Never again for this file: its writes extend it.
                    if let Some(segment) = state.segment_mut(base) {
                        segment.allocated_bytes = u64::MAX;
                    }
                }
            }
            None => {}
        }
    }

    /// Waits until every tail write handed to the kernel has come back,
    /// including those of a write-out whose caller was dropped: a later write
    /// of the same page, or a cut of the file, must not be overtaken by one.
    async fn settle_writes(&self) {
        self.writes_landed
            .wait_at_least(self.writes_submitted.get())
            .await;
    }

    /// Finishes the rolled segments whose every byte is written, oldest
    /// first, stopping at one that is not. Callers hold `segments_gate` (and
    /// may hold `io_gate`): truncation, retention, swaps and close wait, while
    /// appends' write-outs go on, since they never touch a fully written
    /// rolled segment's file except to sync it.
    async fn finish_rolled(&self) -> LogResult<()> {
        assert!(self.segments_gate.is_held());
        loop {
            let next = {
                let state = self.state.borrow();
                state
                    .segments
                    .iter()
                    .find(|s| s.closing)
                    .filter(|s| s.tail.as_ref().is_some_and(|t| t.unwritten_bytes() == 0))
                    .and_then(|s| Some((s.base, s.file.clone()?)))
            };
            let Some((base, file)) = next else {
                return Ok(());
            };
            // Boxed: once per segment, and it would otherwise grow every
            // maintenance future.
            Box::pin(self.finish_closing(base, &file)).await?;
        }
    }

    /// The highest offset a recovery point may vouch for now: durable, not
    /// past a rolled segment still to be finished (its files are not final
    /// yet, so recovery must scan it), and not past a segment whose file
    /// holds bytes not synced (durable through the journal only). Recovery
    /// rescans the segment a point falls in, so stopping at a segment's base
    /// costs nothing the active segment did not already cost.
    fn checkpointable_offset(&self) -> Offset {
        let state = self.state.borrow();
        let unfinished = state
            .segments
            .iter()
            .find(|s| s.closing || !segment_synced(s))
            .map(|s| s.base);
        let durable = Offset(self.durable.get());
        unfinished.map_or(durable, |base| base.min(durable))
    }

    /// A rolled segment, fully written: sync it, cut the alignment padding, write
    /// its index files, and move the recovery point past it.
    async fn finish_closing(&self, base: Offset, file: &DirectFile) -> LogResult<()> {
        {
            let state = self.state.borrow();
            let segment = state
                .segments
                .iter()
                .find(|s| s.base == base)
                .expect("segment");
            let tail = segment.tail.as_ref().expect("a closing segment has a tail");
            assert_eq!(
                tail.unwritten_bytes(),
                0,
                "a closing segment is finished only once every byte is written"
            );
            assert_eq!(tail.end(), segment.size_bytes);
        }
        let next_offset = self.seal_files(base, file).await?;
        // Synced by the seal, which also cut its alignment padding: the
        // ring's images of its pages (every chunk was handed over as it was
        // submitted, so all of them come before the fence) must never be
        // written back over it by a replay; a compaction swap fences the
        // segment without waiting for a commit. Before the segment counts
        // as finished, so a failure leaves it to finish again.
        self.fence_journal_segments(&[base]).await?;
        {
            let mut state = self.state.borrow_mut();
            let segment = state.segment_mut(base).expect("segment");
            segment.tail = None;
            segment.closing = false;
        }
        if next_offset.0 > self.written.get() {
            self.written.advance(next_offset.0);
        }
        if next_offset.0 > self.durable.get() {
            self.durable.advance(next_offset.0);
        }
        let point = self.checkpointable_offset();
        if point > self.recovery_point() {
            self.persist_recovery_point(point).await?;
        }
        let snapshots: Vec<(Offset, Vec<u8>)> = {
            let mut state = self.state.borrow_mut();
            let (due, later) = std::mem::take(&mut state.pending_snapshots)
                .into_iter()
                .partition(|(offset, _)| *offset <= next_offset);
            state.pending_snapshots = later;
            due
        };
        for (offset, bytes) in snapshots {
            self.write_producer_snapshot(offset, &bytes).await?;
        }
        Ok(())
    }

    /// Reads whole batches from `start` while their total stays within
    /// `max_bytes` (the first batch is returned even if larger, so a reader always
    /// progresses) and they end at or below `end_offset` (e.g. the high
    /// watermark). Reads stop at a segment boundary.
    ///
    /// A read that raced a truncation or retention (the segment changed while
    /// its bytes were read) starts over against the log as it is now, so it
    /// answers from the new state rather than from a mix of both.
    pub async fn read(
        &self,
        start: Offset,
        max_bytes: usize,
        end_offset: Offset,
    ) -> LogResult<FetchedBatches> {
        for _ in 1..READ_ATTEMPTS_MAX {
            match self.read_once(start, max_bytes, end_offset).await {
                // Truncation and retention hold the gate: wait for them to end.
                Err(LogError::Changed) => drop(self.io_gate.enter().await),
                other => return other,
            }
        }
        self.read_once(start, max_bytes, end_offset).await
    }

    async fn read_once(
        &self,
        start: Offset,
        max_bytes: usize,
        end_offset: Offset,
    ) -> LogResult<FetchedBatches> {
        let (log_start, log_end) = (self.log_start_offset(), self.log_end_offset());
        if start < log_start || start > log_end {
            return Err(LogError::OffsetOutOfRange {
                requested: start,
                log_start,
                log_end,
            });
        }
        let end_offset = end_offset.min(log_end);
        let mut result = FetchedBatches {
            bytes: Vec::new(),
            next_offset: start,
            batch_count: 0,
        };
        if start >= end_offset {
            return Ok(result);
        }
        let (base, entry_position, size_bytes) = {
            let state = self.state.borrow();
            let mut i = state.segment_index_for(start);
            if state.segments[i].next_offset <= start {
                i += 1;
            }
            let segment = &state.segments[i];
            let entry = segment.offset_index.lookup(relative(segment.base, start));
            (segment.base, u64::from(entry.position), segment.size_bytes)
        };
        // Enough for the scan from the index entry plus `max_bytes`; a batch
        // larger than that is read whole below.
        let window = (max_bytes
            + 2 * self.config().index_interval_bytes as usize
            + BATCH_HEADER_BYTES) as u64;
        let mut window_start = entry_position;
        let mut bytes = self
            .read_range(
                base,
                window_start,
                window.min(size_bytes - window_start) as usize,
            )
            .await?;
        let mut at = 0usize;
        let mut first: Option<usize> = None;
        loop {
            let position = window_start + at as u64;
            if position == size_bytes {
                break;
            }
            let total = match peek_total_bytes(&bytes[at..]) {
                Some(total) => self.check_stored_length(base, position, total, size_bytes)?,
                None if first.is_some() => break,
                None => {
                    // The window ends inside the next header: read on from it.
                    window_start = position;
                    at = 0;
                    bytes = self
                        .read_range(base, position, window.min(size_bytes - position) as usize)
                        .await?;
                    continue;
                }
            };
            if at + total > bytes.len() {
                if first.is_some() {
                    break;
                }
                // A batch before the first one returned, or the first one
                // itself, does not fit the window: read on from it, whole.
                window_start = position;
                at = 0;
                let len = (total as u64).max(window.min(size_bytes - position));
                bytes = self.read_range(base, position, len as usize).await?;
                continue;
            }
            let batch = RecordBatch::parse(&bytes[at..at + total], STORED_BATCH_BYTES_MAX)
                .map_err(|e| self.corrupt(base, position, e.to_string()))?;
            let header = *batch.header();
            if header.next_offset() <= start {
                at += total;
                continue;
            }
            let taken = at - first.unwrap_or(at);
            if header.next_offset() > end_offset || (first.is_some() && taken + total > max_bytes) {
                break;
            }
            first.get_or_insert(at);
            result.next_offset = header.next_offset();
            result.batch_count += 1;
            at += total;
        }
        if let Some(from) = first {
            bytes.truncate(at);
            bytes.drain(..from);
            result.bytes = bytes;
        }
        Ok(result)
    }

    fn corrupt(&self, base: Offset, position: u64, reason: impl Into<String>) -> LogError {
        LogError::Corrupt {
            path: segment_path(&self.dir, base, LOG_SUFFIX),
            position,
            reason: reason.into(),
        }
    }

    /// The length of the stored batch at `position` of segment `base`, once it
    /// is known to be a possible batch length that ends within the segment.
    fn check_stored_length(
        &self,
        base: Offset,
        position: u64,
        total: i64,
        size_bytes: u64,
    ) -> LogResult<usize> {
        if total < BATCH_HEADER_BYTES as i64 || total > STORED_BATCH_BYTES_MAX as i64 {
            return Err(self.corrupt(
                base,
                position,
                format!(
                    "batch length {total} outside {BATCH_HEADER_BYTES}..={STORED_BATCH_BYTES_MAX}"
                ),
            ));
        }
        if position + total as u64 > size_bytes {
            return Err(self.corrupt(
                base,
                position,
                format!("batch of {total} bytes runs past the segment's {size_bytes} bytes"),
            ));
        }
        Ok(total as usize)
    }

    /// Bytes [position, position + len) of a segment, from its staged tail where
    /// they are not yet written and from the file below that. `Changed` when the
    /// segment was truncated or removed before or during the read.
    async fn read_range(&self, base: Offset, position: u64, len: usize) -> LogResult<Vec<u8>> {
        let generation = self.generation.get();
        if generation % 2 == 1 {
            return Err(LogError::Changed);
        }
        let (file, disk_end, staged) = {
            let state = self.state.borrow();
            let Some(segment) = state.segments.iter().find(|s| s.base == base) else {
                return Err(LogError::Changed);
            };
            let floor = segment
                .tail
                .as_ref()
                .map_or(segment.size_bytes, Tail::floor);
            let end = position + len as u64;
            if end > segment.size_bytes {
                return Err(LogError::Changed);
            }
            // Copy the staged part now: once written, it leaves the tail.
            let mut staged = Vec::new();
            if end > floor {
                let from = position.max(floor);
                let tail = segment
                    .tail
                    .as_ref()
                    .expect("tail holds bytes above the floor");
                staged = vec![0u8; (end - from) as usize];
                tail.read(from, &mut staged);
            }
            (segment.file.clone(), floor.min(end), staged)
        };
        // Built by appending, not zeroed first: a read from disk (a catch-up
        // reader's) is copied once, from the read buffer.
        let mut out = Vec::with_capacity(len);
        if disk_end > position {
            let file = file.expect("bytes below the tail floor are in the file");
            let path = segment_path(&self.dir, base, LOG_SUFFIX);
            let want = (disk_end - position) as usize;
            while out.len() < want {
                let at = position + out.len() as u64;
                let piece = (want - out.len()).min(DISK_READ_BYTES_MAX);
                let read = file
                    .read_at(at, piece)
                    .await
                    .map_err(|e| LogError::io(&path, e))?;
                self.state.borrow_mut().stats.read_bytes += piece as u64;
                if self.generation.get() != generation {
                    return Err(LogError::Changed);
                }
                if read.len() < piece {
                    return Err(LogError::Corrupt {
                        path,
                        position: at + read.len() as u64,
                        reason: "segment file shorter than its contents".into(),
                    });
                }
                out.extend_from_slice(&read[..piece]);
            }
        }
        out.extend_from_slice(&staged);
        assert_eq!(out.len(), len, "a range is read whole");
        Ok(out)
    }

    /// The offset of the first record whose timestamp is at or after
    /// `timestamp_ms`, or `None` if every record is older.
    pub async fn offset_for_timestamp(&self, timestamp_ms: i64) -> LogResult<Option<Offset>> {
        for _ in 1..READ_ATTEMPTS_MAX {
            match self.offset_for_timestamp_once(timestamp_ms).await {
                Err(LogError::Changed) => drop(self.io_gate.enter().await),
                other => return other,
            }
        }
        self.offset_for_timestamp_once(timestamp_ms).await
    }

    async fn offset_for_timestamp_once(&self, timestamp_ms: i64) -> LogResult<Option<Offset>> {
        let found = {
            let state = self.state.borrow();
            state
                .segments
                .iter()
                .find(|s| s.max_timestamp_ms >= timestamp_ms)
                .map(|s| {
                    let start = s
                        .time_index
                        .scan_start(timestamp_ms)
                        .map_or(0, |e| e.relative_offset);
                    (
                        s.base,
                        u64::from(s.offset_index.lookup(start).position),
                        s.size_bytes,
                    )
                })
        };
        let Some((base, mut position, size_bytes)) = found else {
            return Ok(None);
        };
        while position < size_bytes {
            let window = (size_bytes - position).min(TIMESTAMP_SCAN_WINDOW_BYTES);
            let mut bytes = self.read_range(base, position, window as usize).await?;
            let mut at = 0usize;
            loop {
                let Some(total) = peek_total_bytes(&bytes[at..]) else {
                    if at == 0 {
                        return Err(self.corrupt(base, position, "truncated batch header"));
                    }
                    break;
                };
                let at_position = position + at as u64;
                let total = self.check_stored_length(base, at_position, total, size_bytes)?;
                if at + total > bytes.len() {
                    if at > 0 {
                        break;
                    }
                    // One batch larger than the window: read it whole.
                    bytes = self.read_range(base, position, total).await?;
                }
                let batch = RecordBatch::parse(&bytes[at..at + total], STORED_BATCH_BYTES_MAX)
                    .map_err(|e| self.corrupt(base, at_position, e.to_string()))?;
                if batch.header().max_timestamp_ms >= timestamp_ms {
                    let section = batch
                        .records_section(self.config().decompressed_bytes_max)
                        .map_err(|e| self.corrupt(base, at_position, e.to_string()))?;
                    for record in section.iter() {
                        let record =
                            record.map_err(|e| self.corrupt(base, at_position, e.to_string()))?;
                        if record.timestamp_ms >= timestamp_ms {
                            return Ok(Some(record.offset));
                        }
                    }
                }
                at += total;
                if at == bytes.len() {
                    break;
                }
            }
            position += at as u64;
            runtime::yield_now().await;
        }
        Ok(None)
    }

    /// Removes every record at or after `offset` (rounded down to the start of the
    /// batch holding it) so the log ends there. Used by replication to cut a
    /// divergent suffix.
    pub async fn truncate_to(self: &Rc<Self>, offset: Offset) -> LogResult<Offset> {
        let cut = self.truncate_to_if(offset, Rc::new(|| true)).await?;
        Ok(cut.expect("an unconditional truncation happens"))
    }

    /// `truncate_to`, if `still_wanted` holds once every write before the
    /// cut is done, just before the first file changes: the caller's reason
    /// (say, being a follower) may have ended while this waited. `None` when
    /// it no longer held and nothing was cut.
    ///
    /// Runs to its end even if the caller stops waiting: a cut dropped
    /// halfway would leave the files, the producer state and the watermarks
    /// disagreeing (the written offset above the log's end).
    pub async fn truncate_to_if(
        self: &Rc<Self>,
        offset: Offset,
        still_wanted: Rc<dyn Fn() -> bool>,
    ) -> LogResult<Option<Offset>> {
        let log = self.clone();
        runtime::run_to_end(async move { log.truncate_now(offset, &*still_wanted).await }).await
    }

    async fn truncate_now(
        &self,
        offset: Offset,
        still_wanted: &dyn Fn() -> bool,
    ) -> LogResult<Option<Offset>> {
        let _gate = self.io_gate.enter().await;
        let _segments = self.segments_gate.enter().await;
        self.refuse_if_closed()?;
        let (log_start, log_end) = (self.log_start_offset(), self.log_end_offset());
        if offset >= log_end {
            return Ok(Some(log_end));
        }
        if offset < log_start {
            return Err(LogError::OffsetOutOfRange {
                requested: offset,
                log_start,
                log_end,
            });
        }
        self.write_out(false).await?;
        // The cut then meets only finished segments and the active one.
        self.finish_rolled().await?;
        let index = self.state.borrow().segment_index_for(offset);
        let (base, file, start_position, size_bytes) = {
            let state = self.state.borrow();
            let s = &state.segments[index];
            (
                s.base,
                s.file.clone().expect("written above"),
                u64::from(s.offset_index.lookup(relative(s.base, offset)).position),
                s.size_bytes,
            )
        };
        // Find the batch holding `offset` by scanning headers from the index entry.
        let mut scanner = super::scan::SegmentScanner::new(
            file.clone(),
            size_bytes,
            start_position,
            None,
            STORED_BATCH_BYTES_MAX,
            super::scan::ScanDepth::Headers,
        );
        let mut cut = (start_position, offset);
        while let Some(batch) = scanner.next().await.map_err(|e| self.scan_error(base, e))? {
            if batch.header.next_offset() > offset {
                cut = (batch.position, batch.header.base_offset);
                break;
            }
        }
        if !still_wanted() {
            return Ok(None);
        }
        self.fence_journal(true).await?;
        // Odd while the files and the state disagree: reads started now retry
        // and appends are refused.
        self.generation.set(self.generation.get() + 1);
        let cut_result = self.cut_at(index, base, &file, cut).await;
        // The producer state must forget the cut batches before any append
        // is checked against it; appends stay refused until it is rebuilt.
        let cut_result = match cut_result {
            Ok(end) => {
                self.state.borrow_mut().pending_snapshots.clear();
                self.rebuild_producers().await.map(|()| end)
            }
            Err(e) => Err(e),
        };
        self.generation.set(self.generation.get() + 1);
        let new_end = cut_result?;
        if self.durable.get() > new_end.0 {
            self.durable.reset(new_end.0);
        }
        if self.written.get() > new_end.0 {
            self.written.reset(new_end.0);
        }
        if self.recovery_point() > new_end {
            self.persist_recovery_point(new_end).await?;
        }
        self.check_invariants();
        Ok(Some(new_end))
    }

    /// The destructive part of `truncate_to`: drops the segments after
    /// `index`, cuts segment `base` at `cut` (position, offset) and makes it
    /// the active segment again. Returns the new log end.
    async fn cut_at(
        &self,
        index: usize,
        base: Offset,
        file: &DirectFile,
        cut: (u64, Offset),
    ) -> LogResult<Offset> {
        self.remove_segments_after(index).await?;
        let path = segment_path(&self.dir, base, LOG_SUFFIX);
        file.truncate(cut.0)
            .await
            .map_err(|e| LogError::io(&path, e))?;
        file.fdatasync().await.map_err(|e| LogError::io(&path, e))?;
        for suffix in [INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
            remove_if_exists(&segment_path(&self.dir, base, suffix))?;
        }
        let rebuilt = recovery::rebuild_segment(
            &self.dir,
            base,
            file,
            cut.0,
            &self.config(),
            self.clock.now_ms(),
        )
        .await?;
        let new_end = rebuilt.segment.next_offset;
        // The end of the batch before the cut: the cut batch's base, or below
        // it when compaction left a hole in between.
        assert!(new_end <= cut.1, "truncation lands on a batch boundary");
        {
            let mut state = self.state.borrow_mut();
            let latest_epoch = rebuilt.segment.latest_epoch;
            *state.segments.back_mut().expect("segment") = rebuilt.segment;
            state.latest_epoch = latest_epoch;
            // Records appended after the cut are dirty, wherever the last
            // pass ended.
            state.cleaned_to = state.cleaned_to.min(new_end);
        }
        Ok(new_end)
    }

    /// Drops every record and starts the log empty at `offset`: a follower
    /// whose leader's log now starts past this log's end. The new segment's
    /// file exists before the old ones go, so a restart at any point finds
    /// either the old log or the new start.
    pub async fn reset_to(self: &Rc<Self>, offset: Offset) -> LogResult<()> {
        let done = self.reset_to_if(offset, Rc::new(|| true)).await?;
        assert!(done, "an unconditional reset happens");
        Ok(())
    }

    /// `reset_to`, if `still_wanted` holds once the gate is held; returns
    /// whether it happened.
    ///
    /// Runs to its end even if the caller stops waiting, as `truncate_to_if`.
    pub async fn reset_to_if(
        self: &Rc<Self>,
        offset: Offset,
        still_wanted: Rc<dyn Fn() -> bool>,
    ) -> LogResult<bool> {
        let log = self.clone();
        runtime::run_to_end(async move { log.reset_now(offset, &*still_wanted).await }).await
    }

    async fn reset_now(&self, offset: Offset, still_wanted: &dyn Fn() -> bool) -> LogResult<bool> {
        let _gate = self.io_gate.enter().await;
        let _segments = self.segments_gate.enter().await;
        self.refuse_if_closed()?;
        self.settle_writes().await;
        if !still_wanted() {
            return Ok(false);
        }
        // Nothing of the log is kept: its records only have to be dropped.
        self.fence_journal(false).await?;
        self.generation.set(self.generation.get() + 1);
        let result = self.replace_all_with_empty(offset).await;
        self.generation.set(self.generation.get() + 1);
        result?;
        self.check_invariants();
        Ok(true)
    }

    async fn replace_all_with_empty(&self, offset: Offset) -> LogResult<()> {
        let path = segment_path(&self.dir, offset, LOG_SUFFIX);
        // A segment of that base left over from before would hold other bytes.
        remove_if_exists(&path)?;
        let file = DirectFile::create_new(&path)
            .await
            .map_err(|e| LogError::io(&path, e))?;
        let removed: Vec<Segment> = {
            let mut state = self.state.borrow_mut();
            let removed = state.segments.drain(..).collect();
            let mut fresh = Segment::new_active(
                offset,
                self.clock.now_ms(),
                self.config().write_chunk_bytes,
                self.config().index_interval_bytes,
            );
            fresh.file = Some(file);
            state.segments.push_back(fresh);
            state.latest_epoch = LeaderEpoch(0);
            // The leader's log starts past everything this one held: its
            // producers' history arrives with its batches from here on.
            state.producers = ProducerStateTable::new();
            state.aborted = AbortedIndex::new();
            state.pending_snapshots.clear();
            removed
        };
        let gone = removed
            .iter()
            .filter(|s| s.base != offset)
            .map(|s| s.base)
            .collect();
        self.remove_and_release(gone).await?;
        // Every snapshot describes the replaced history: none may be loaded
        // for the new one (its producers start empty).
        let (snapshots, _) = self.remove_stale_snapshots(offset, offset).await?;
        let dir = self.dir.clone();
        runtime::blocking(move || {
            for at in snapshots {
                remove_if_exists(&segment_path(&dir, at, SNAPSHOT_SUFFIX))?;
            }
            LogResult::Ok(())
        })
        .await?;
        for mark in [&self.written, &self.durable] {
            mark.set(offset.0);
        }
        {
            let mut state = self.state.borrow_mut();
            state.recovery_point = Offset(state.recovery_point.0.min(offset.0));
        }
        self.persist_recovery_point(offset).await
    }

    fn scan_error(&self, base: Offset, error: super::scan::ScanError) -> LogError {
        let path = segment_path(&self.dir, base, LOG_SUFFIX);
        match error {
            super::scan::ScanError::Io(e) => LogError::io(path, e),
            super::scan::ScanError::Corrupt { position, reason } => LogError::Corrupt {
                path,
                position,
                reason,
            },
        }
    }

    async fn remove_segments_after(&self, index: usize) -> LogResult<()> {
        let removed: Vec<Segment> = self
            .state
            .borrow_mut()
            .segments
            .drain(index + 1..)
            .collect();
        // Newest first: a crash part-way leaves the log a prefix.
        let gone = removed.iter().rev().map(|s| s.base).collect();
        self.remove_files_and_sync(gone, false).await.map(drop)
    }

    /// As `remove_files_and_sync`, with the `.log` files' blocks left to the
    /// shard's releaser when the log has one.
    async fn remove_and_release(&self, bases: Vec<Offset>) -> LogResult<()> {
        let releaser = self.releaser.borrow().clone();
        let held = self
            .remove_files_and_sync(bases, releaser.is_some())
            .await?;
        if let Some(releaser) = releaser {
            releaser.release(held);
        }
        Ok(())
    }

    /// Removes the files of the segments at `bases` (in that order) and
    /// syncs the directory, on the runtime's blocking thread: unlinks and a
    /// directory sync block, and the shard keeps serving meanwhile. With
    /// `hold`, each `.log` file larger than a release step is opened before
    /// its unlink and returned open with its length: its blocks stay taken
    /// until the holder truncates or closes it.
    async fn remove_files_and_sync(
        &self,
        bases: Vec<Offset>,
        hold: bool,
    ) -> LogResult<Vec<(std::fs::File, u64)>> {
        let dir = self.dir.clone();
        runtime::blocking(move || {
            let mut held = Vec::new();
            for base in bases {
                for suffix in [
                    LOG_SUFFIX,
                    INDEX_SUFFIX,
                    TIME_INDEX_SUFFIX,
                    TXN_INDEX_SUFFIX,
                ] {
                    let path = segment_path(&dir, base, suffix);
                    if hold && suffix == LOG_SUFFIX {
                        held.extend(space_release::hold_if_large(&path));
                    }
                    remove_if_exists(&path)?;
                }
            }
            checkpoint::sync_dir(&dir).map_err(|e| LogError::io(&dir, e))?;
            Ok(held)
        })
        .await
    }

    /// Deletes the oldest closed segments that retention no longer keeps, never
    /// past `end_limit`; returns how many went. The log start moves up with them.
    ///
    /// Only the choice and the log start's move hold `io_gate`: removing the
    /// files (unlinks of whole segments and a directory sync, tens of
    /// milliseconds on a busy disk) runs under `segments_gate` alone, so the
    /// writes and syncs acknowledgements wait for go on meanwhile, as during
    /// a compaction swap.
    pub async fn enforce_retention(&self, end_limit: Offset) -> LogResult<usize> {
        let gate = self.io_gate.enter().await;
        let _segments = self.segments_gate.enter().await;
        self.refuse_if_closed()?;
        // The active segment's file must exist before older ones go, or a restart
        // would not know where the log starts.
        let active_base = self.state.borrow().active().base;
        self.ensure_file(active_base).await?;
        let count = {
            let state = self.state.borrow();
            let summaries: Vec<SegmentSummary> = state
                .segments
                .iter()
                .map(|s| SegmentSummary {
                    next_offset: s.next_offset,
                    size_bytes: s.size_bytes,
                    max_timestamp_ms: s.max_timestamp_ms,
                    closed: s.tail.is_none(),
                })
                .collect();
            policy::segments_to_delete(&self.config(), &summaries, end_limit, self.clock.now_ms())
        };
        if count > 0 {
            // Two steps, as in truncation; nothing awaits in between here.
            self.generation.set(self.generation.get() + 2);
        }
        let removed: Vec<Segment> = self.state.borrow_mut().segments.drain(..count).collect();
        // Nothing that holds `io_gate` alone touches closed segments' files
        // (a sync still in flight on one holds its own handle); truncation,
        // reset and close wait for `segments_gate`.
        drop(gate);
        if count > 0 {
            let log_start = self.log_start_offset();
            self.state.borrow_mut().aborted.remove_below(log_start);
            // Oldest first: a crash part-way leaves the log a suffix.
            self.remove_and_release(removed.iter().map(|s| s.base).collect())
                .await?;
            self.remove_stale_snapshots(self.log_start_offset(), self.log_end_offset())
                .await?;
            self.check_invariants();
        }
        Ok(count)
    }

    /// Makes a fully written segment's files final: trims the alignment padding,
    /// syncs, writes its index files. Returns the segment's next offset.
    async fn seal_files(&self, base: Offset, file: &DirectFile) -> LogResult<Offset> {
        let (size, next_offset, index_bytes, time_bytes) = {
            let state = self.state.borrow();
            let s = state
                .segments
                .iter()
                .find(|s| s.base == base)
                .expect("segment");
            (
                s.size_bytes,
                s.next_offset,
                s.offset_index.encode(),
                s.time_index.encode(),
            )
        };
        let path = segment_path(&self.dir, base, LOG_SUFFIX);
        file.truncate(size)
            .await
            .map_err(|e| LogError::io(&path, e))?;
        file.fdatasync().await.map_err(|e| LogError::io(&path, e))?;
        write_small_file(&segment_path(&self.dir, base, INDEX_SUFFIX), &index_bytes).await?;
        write_small_file(
            &segment_path(&self.dir, base, TIME_INDEX_SUFFIX),
            &time_bytes,
        )
        .await?;
        self.write_txn_index(base, next_offset).await?;
        Ok(next_offset)
    }

    /// Writes and syncs everything, trims the active segment's padding, writes
    /// its indexes and a clean-shutdown marker, so the next open skips recovery.
    pub async fn close(&self) -> LogResult<()> {
        self.close_with(true).await.map(|_| ())
    }

    /// As `close` without the marker: for a broker that closes every log
    /// and then records them all in one file of the data dir
    /// (`checkpoint::write_clean_logs`), read back by `open_after`. True
    /// only when this call sealed the log: a log already closed (by an
    /// error, such as a failed compaction swap, or by an earlier close) was
    /// not synced and trimmed here and must not be recorded as clean.
    pub async fn close_unmarked(&self) -> LogResult<bool> {
        self.close_with(false).await
    }

    /// A closed log's files are final (a clean shutdown may already have
    /// recorded them as such): whatever would change them is refused, as
    /// appends are. A task that outlived the log's owner, such as a follower
    /// fetcher answering late at shutdown, gets `LogError::Closed`.
    fn refuse_if_closed(&self) -> LogResult<()> {
        if self.state.borrow().closed {
            return Err(LogError::Closed);
        }
        Ok(())
    }

    async fn close_with(&self, marker: bool) -> LogResult<bool> {
        let _gate = self.io_gate.enter().await;
        let _segments = self.segments_gate.enter().await;
        if self.state.borrow().closed {
            return Ok(false);
        }
        // From here appends are refused, so the files sealed below are the
        // last word; a failure part-way leaves the log closed as well.
        self.state.borrow_mut().closed = true;
        if self.unchanged_since_open() {
            // Most of a broker's partitions, most restarts: five file
            // writes and syncs each saved.
            if marker {
                self.write_clean_marker().await?;
            }
            return Ok(true);
        }
        self.write_out(true).await?;
        self.finish_rolled().await?;
        let base = self.state.borrow().active().base;
        let file = self.ensure_file(base).await?;
        let end = self.seal_files(base, &file).await?;
        self.persist_recovery_point(end).await?;
        // The next open then replays nothing.
        let snapshot = self.state.borrow().producers.encode_snapshot(end);
        self.write_producer_snapshot(end, &snapshot).await?;
        // Everything is synced: a log removed after its close (or made again
        // under the same name) gets nothing written back by a replay.
        self.fence_journal(true).await?;
        if marker {
            self.write_clean_marker().await?;
        }
        Ok(true)
    }

    async fn write_clean_marker(&self) -> LogResult<()> {
        let dir = self.dir.clone();
        runtime::blocking(move || checkpoint::write_clean_shutdown(&dir))
            .await
            .map_err(|e| LogError::io(&self.dir, e))
    }

    /// The files are as the open found them, which was final: no tail
    /// write was submitted, nothing was truncated, removed or swapped
    /// (`generation`), and no append or roll changed the shape.
    fn unchanged_since_open(&self) -> bool {
        let state = self.state.borrow();
        state.sealed_at_open == Some(state.shape())
            && self.writes_submitted.get() == 0
            && self.generation.get() == 0
            && state.pending_snapshots.is_empty()
            && !state.has_unwritten()
    }
}
