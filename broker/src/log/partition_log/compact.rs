//! One compaction pass over a partition log: plan it, build the key map from
//! the dirty part, rewrite groups of closed segments keeping each key's latest
//! record, and swap each group in crash-safely. Offsets never change: kept
//! records keep their offsets, kept batches their offset range, and the last
//! batch of every group is kept (empty if need be) so the log's segments stay
//! contiguous. The active segment and anything past the caller's limit (the
//! high watermark) are never touched. Reads and writes run off the append
//! path; a swap holds only the segments gate, so appends, writes and syncs of
//! the active segment go on while it renames and syncs.

use protocol::record_batch::{retain_records, Retained};
use protocol::{Offset, RecordBatch};

use super::PartitionLog;
use crate::log::compaction::{
    self, AbortedRanges, CleanPlan, KeepRule, KeyHash, OffsetMap, RecordView, SegmentView,
};
use crate::log::config::STORED_BATCH_BYTES_MAX;
use crate::log::error::{LogError, LogResult};
use crate::log::scan::{ScanDepth, SegmentScanner};
use crate::log::segment::{
    remove_if_exists, segment_path, write_small_file, Segment, INDEX_SUFFIX, LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
};
use crate::log::space_release;
use crate::log::swap::{self, staged_path, SwapStep, CLEANED_SUFFIX};
use crate::runtime::{self, AlignedBuffer, DirectFile, DIRECT_IO_ALIGNMENT_BYTES};

/// How a pass decides each record's fate: the key map, the keep rule and
/// the aborted transactions to drop.
struct Decisions<'a> {
    map: &'a OffsetMap,
    keep: KeepRule,
    aborted: &'a AbortedRanges,
}

/// What a pass may do.
#[derive(Clone, Copy, Debug)]
pub struct CleanRequest {
    /// Nothing at or past this offset is cleaned: the high watermark, so no
    /// record is dropped in favour of one that may still be truncated away.
    pub end_limit: Offset,
    /// Memory for the key map.
    pub map_memory_bytes: usize,
    /// Bytes read plus written per second; 0 for no bound.
    pub io_bytes_per_sec_max: u64,
    /// zstd level for rewritten compressed batches.
    pub zstd_level: i32,
    /// Stops the first swap after this step, as a crash would, and closes the
    /// log (for crash tests).
    pub stop_swap_after: Option<SwapStep>,
}

/// What a pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CleanReport {
    pub plan: Option<CleanPlan>,
    /// Where the key map ended: the dirty part cleaned by this pass.
    pub map_end: Offset,
    pub segments_rewritten: usize,
    pub segments_written: usize,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub records_removed: u64,
    /// A truncation or retention changed the segments under the pass; it
    /// stopped and left them as they were.
    pub abandoned: bool,
    /// The swap step `stop_swap_after` stopped at; the log is closed.
    pub stopped_at: Option<SwapStep>,
}

enum GroupOutcome {
    Swapped,
    /// Nothing to remove: the group stays as it is.
    Unchanged,
    /// The group's segments changed under the pass; nothing was swapped.
    Abandoned,
}

/// Paces the pass's I/O to a byte rate.
struct Throttle {
    bytes_per_sec_max: u64,
    /// Monotonic: a wall-clock jump must not stall or unleash the cleaner.
    started: std::time::Duration,
    bytes: u64,
}

impl Throttle {
    async fn charge(&mut self, log: &PartitionLog, bytes: u64) {
        self.bytes += bytes;
        if self.bytes_per_sec_max == 0 {
            runtime::yield_now().await;
            return;
        }
        let due_ms = (self.bytes.saturating_mul(1000) / self.bytes_per_sec_max) as i64;
        let elapsed_ms = log
            .clock
            .monotonic()
            .saturating_sub(self.started)
            .as_millis() as i64;
        if due_ms > elapsed_ms {
            runtime::sleep(std::time::Duration::from_millis(
                (due_ms - elapsed_ms) as u64,
            ))
            .await;
        } else {
            runtime::yield_now().await;
        }
    }
}

/// Streams a new segment file with aligned direct writes.
struct SegmentWriter {
    file: DirectFile,
    buffer: AlignedBuffer,
    filled: usize,
    position: u64,
}

impl SegmentWriter {
    async fn push(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        while !bytes.is_empty() {
            let room = self.buffer.len() - self.filled;
            let n = room.min(bytes.len());
            self.buffer.as_mut_slice()[self.filled..self.filled + n].copy_from_slice(&bytes[..n]);
            self.filled += n;
            bytes = &bytes[n..];
            if self.filled == self.buffer.len() {
                self.flush_buffer().await?;
            }
        }
        Ok(())
    }

    async fn flush_buffer(&mut self) -> std::io::Result<()> {
        if self.filled == 0 {
            return Ok(());
        }
        let padded =
            (self.filled as u64).div_ceil(DIRECT_IO_ALIGNMENT_BYTES) * DIRECT_IO_ALIGNMENT_BYTES;
        let capacity = self.buffer.len();
        let mut full = std::mem::replace(&mut self.buffer, AlignedBuffer::new(capacity));
        full.as_mut_slice()[self.filled..padded as usize].fill(0);
        let shared = full.seal(padded as usize);
        self.file.write_at(&shared, self.position).await?;
        self.position += self.filled as u64;
        self.filled = 0;
        Ok(())
    }

    /// Writes the rest, cuts the padding and syncs; returns the file size.
    async fn finish(mut self) -> std::io::Result<u64> {
        let size = self.position + self.filled as u64;
        self.flush_buffer().await?;
        self.file.truncate(size).await?;
        self.file.fdatasync().await?;
        Ok(size)
    }
}

impl PartitionLog {
    fn segment_views(&self) -> Vec<SegmentView> {
        self.state
            .borrow()
            .segments
            .iter()
            .map(|s| SegmentView {
                base: s.base,
                next_offset: s.next_offset,
                size_bytes: s.size_bytes,
                max_timestamp_ms: s.max_timestamp_ms,
                closed: s.tail.is_none(),
            })
            .collect()
    }

    /// The share of the cleanable log written since the last pass, in
    /// thousandths (0 for a log that is not compacted).
    pub fn dirty_ratio_permille(&self, end_limit: Offset) -> u32 {
        if !self.config().cleanup_policy.compact {
            return 0;
        }
        let cleaned_to = self.state.borrow().cleaned_to;
        compaction::dirty_ratio(
            &self.config(),
            &self.segment_views(),
            cleaned_to,
            end_limit,
            self.clock.now_ms(),
        )
        .0
    }

    /// Runs one compaction pass if the log is worth cleaning now.
    pub async fn clean(&self, request: &CleanRequest) -> LogResult<CleanReport> {
        // Records of a transaction not yet stably ended are never cleaned:
        // whether they count is not decided yet.
        let request = &CleanRequest {
            end_limit: self.last_stable_offset(request.end_limit),
            ..*request
        };
        let aborted =
            AbortedRanges::new(&self.aborted_transactions(Offset::ZERO, request.end_limit));
        let now_ms = self.clock.now_ms();
        let views = self.segment_views();
        let cleaned_to = self.state.borrow().cleaned_to;
        let mut report = CleanReport::default();
        let Some(plan) = compaction::plan(
            &self.config(),
            &views,
            cleaned_to,
            request.end_limit,
            now_ms,
        ) else {
            return Ok(report);
        };
        report.plan = Some(plan);
        let mut throttle = Throttle {
            bytes_per_sec_max: request.io_bytes_per_sec_max,
            started: self.clock.monotonic(),
            bytes: 0,
        };
        let mut map = OffsetMap::with_memory_bytes(request.map_memory_bytes);
        let Some(map_end) = self
            .build_map(
                &views,
                &plan,
                &aborted,
                &mut map,
                &mut throttle,
                &mut report,
            )
            .await?
        else {
            report.abandoned = true;
            return Ok(report);
        };
        report.map_end = map_end;
        let rule = Decisions {
            map: &map,
            keep: KeepRule {
                map_end,
                dirty_start: plan.dirty_start,
                delete_retention_ms: self.config().delete_retention_ms,
                now_ms,
            },
            aborted: &aborted,
        };
        let rewritten: Vec<SegmentView> = views
            .iter()
            .copied()
            .take_while(|v| v.closed && v.next_offset <= plan.cleanable_end && v.base < map_end)
            .collect();
        for group in compaction::group_segments(&rewritten, self.config().segment_size_bytes) {
            let sources = &rewritten[group];
            let outcome = self
                .clean_group(sources, &rule, request, &mut throttle, &mut report)
                .await?;
            match outcome {
                GroupOutcome::Unchanged => {}
                GroupOutcome::Swapped if request.stop_swap_after.is_some() => return Ok(report),
                GroupOutcome::Swapped => {}
                GroupOutcome::Abandoned => {
                    report.abandoned = true;
                    return Ok(report);
                }
            }
        }
        let mut state = self.state.borrow_mut();
        state.cleaned_to = state.cleaned_to.max(map_end);
        Ok(report)
    }

    /// A full, CRC-checking scan of the closed segment `view` describes;
    /// `None` when it is no longer a closed segment of this log.
    fn closed_segment_scanner(&self, view: &SegmentView) -> Option<SegmentScanner> {
        let file = self
            .state
            .borrow()
            .segments
            .iter()
            .find(|s| s.base == view.base && s.tail.is_none())
            .and_then(|s| s.file.clone())?;
        Some(SegmentScanner::new(
            file,
            view.size_bytes,
            0,
            Some(view.base),
            STORED_BATCH_BYTES_MAX,
            ScanDepth::Crc,
        ))
    }

    /// Fills `map` from the dirty part, in offset order, until it is full.
    /// Returns where the map ends (`None` when a segment went meanwhile).
    async fn build_map(
        &self,
        views: &[SegmentView],
        plan: &CleanPlan,
        aborted: &AbortedRanges,
        map: &mut OffsetMap,
        throttle: &mut Throttle,
        report: &mut CleanReport,
    ) -> LogResult<Option<Offset>> {
        let dirty = views
            .iter()
            .filter(|v| v.next_offset > plan.dirty_start && v.next_offset <= plan.cleanable_end);
        for view in dirty {
            let Some(mut scanner) = self.closed_segment_scanner(view) else {
                return Ok(None);
            };
            while let Some(batch) = scanner
                .next()
                .await
                .map_err(|e| self.scan_error(view.base, e))?
            {
                let header = batch.header;
                report.bytes_read += header.total_bytes() as u64;
                if header.next_offset() <= plan.dirty_start
                    || header.is_control()
                    || aborted.is_aborted(&header)
                {
                    continue;
                }
                let parsed = RecordBatch::parse(scanner.last_bytes(), STORED_BATCH_BYTES_MAX)
                    .map_err(|e| self.corrupt(view.base, batch.position, e.to_string()))?;
                let section = parsed
                    .records_section(self.config().decompressed_bytes_max)
                    .map_err(|e| self.corrupt(view.base, batch.position, e.to_string()))?;
                for record in section.iter() {
                    let record = record
                        .map_err(|e| self.corrupt(view.base, batch.position, e.to_string()))?;
                    let Some(key) = record.key else { continue };
                    if record.offset < plan.dirty_start {
                        continue;
                    }
                    if !map.insert(KeyHash::of(key), record.offset) {
                        return Ok(Some(record.offset));
                    }
                }
                throttle.charge(self, header.total_bytes() as u64).await;
            }
        }
        Ok(Some(plan.cleanable_end))
    }

    /// Rewrites one group of segments into one and swaps it in.
    async fn clean_group(
        &self,
        sources: &[SegmentView],
        rule: &Decisions<'_>,
        request: &CleanRequest,
        throttle: &mut Throttle,
        report: &mut CleanReport,
    ) -> LogResult<GroupOutcome> {
        let base = sources[0].base;
        let cleaned_log = staged_path(&self.dir, base, LOG_SUFFIX, CLEANED_SUFFIX);
        let result = self
            .write_group(sources, rule, request, throttle, report, &cleaned_log)
            .await;
        let segment = match result {
            Ok(Some(segment)) => segment,
            Ok(None) => {
                self.remove_cleaned(base)?;
                return Ok(GroupOutcome::Unchanged);
            }
            Err(e) => {
                self.remove_cleaned(base)?;
                return Err(e);
            }
        };
        // Only the closed segments change: appends, writes and syncs of the
        // active segment go on meanwhile (they hold `io_gate`, not this).
        let _segments = self.segments_gate.enter().await;
        let unchanged = {
            let state = self.state.borrow();
            let at = state.segments.iter().position(|s| s.base == base);
            !state.closed
                && at.is_some_and(|at| {
                    sources.iter().enumerate().all(|(i, v)| {
                        state.segments.get(at + i).is_some_and(|s| {
                            s.base == v.base && s.size_bytes == v.size_bytes && s.tail.is_none()
                        })
                    })
                })
        };
        if !unchanged {
            self.remove_cleaned(base)?;
            return Ok(GroupOutcome::Abandoned);
        }
        let replaced: Vec<Offset> = sources.iter().map(|v| v.base).collect();
        // Journaled images of the old files must never be written into the new.
        if let Err(e) = self.fence_journal_segments(&replaced).await {
            self.remove_cleaned(base)?;
            return Err(e);
        }
        let dir = self.dir.clone();
        let stop = request.stop_swap_after;
        let releaser = self.releaser.borrow().clone();
        let hold = releaser.is_some();
        // Until the state changes below, readers keep the old segments' open
        // files, whose bytes stay readable whatever happens to their names.
        // With a releaser, the replaced `.log` files are also held open past
        // the swap, so their blocks are freed in paced steps and not all at
        // the next file-system commit (see `space_release`).
        let (swapped, held) = runtime::blocking(move || {
            let held: Vec<_> = if hold {
                replaced
                    .iter()
                    .filter_map(|&b| {
                        space_release::hold_if_large(&segment_path(&dir, b, LOG_SUFFIX))
                    })
                    .collect()
            } else {
                Vec::new()
            };
            (swap::swap_in(&dir, base, &replaced, stop), held)
        })
        .await;
        let opened = match (&swapped, stop) {
            (Ok(()), None) => {
                let path = segment_path(&self.dir, base, LOG_SUFFIX);
                Some(
                    DirectFile::open_read_write(&path)
                        .await
                        .map_err(|e| LogError::io(&path, e)),
                )
            }
            _ => None,
        };
        // One synchronous step from here: reads that began before it see a
        // new generation and start over on the new segments.
        self.generation.set(self.generation.get() + 2);
        // Only a finished swap took the held files' names away: truncating
        // one still named (a stopped or failed swap's, closed here instead)
        // would destroy records the log keeps. Reads of the old files that
        // began before see the new generation whatever their bytes.
        if let (Ok(()), None, Some(releaser)) = (&swapped, stop, releaser) {
            releaser.release(held);
        }
        let file = match (swapped, opened) {
            (Ok(()), Some(Ok(file))) => file,
            (Ok(()), None) => {
                // A test's crash point: only a reopen knows the log again.
                self.state.borrow_mut().closed = true;
                report.stopped_at = stop;
                return Ok(GroupOutcome::Swapped);
            }
            (Err(e), _) | (Ok(()), Some(Err(e))) => {
                // The directory may be part-way through the swap: only a
                // reopen (which finishes or undoes it) knows the log again.
                self.state.borrow_mut().closed = true;
                return Err(e);
            }
        };
        {
            let mut segment = segment;
            segment.file = Some(file);
            let mut state = self.state.borrow_mut();
            let at = state
                .segments
                .iter()
                .position(|s| s.base == base)
                .expect("checked under the segments gate");
            state.segments.drain(at..at + sources.len());
            state.segments.insert(at, segment);
        }
        report.segments_rewritten += sources.len();
        report.segments_written += 1;
        self.check_invariants();
        Ok(GroupOutcome::Swapped)
    }

    fn remove_cleaned(&self, base: Offset) -> LogResult<()> {
        for suffix in [LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
            remove_if_exists(&staged_path(&self.dir, base, suffix, CLEANED_SUFFIX))?;
        }
        Ok(())
    }

    /// Writes the cleaned version of `sources` as `.cleaned` files, synced.
    /// `None` when nothing would change (one segment, every record kept).
    #[allow(clippy::too_many_arguments)]
    async fn write_group(
        &self,
        sources: &[SegmentView],
        rule: &Decisions<'_>,
        request: &CleanRequest,
        throttle: &mut Throttle,
        report: &mut CleanReport,
        cleaned_log: &std::path::Path,
    ) -> LogResult<Option<Segment>> {
        let base = sources[0].base;
        let io = |e| LogError::io(cleaned_log, e);
        remove_if_exists(cleaned_log)?;
        let file = DirectFile::create_new(cleaned_log).await.map_err(io)?;
        let mut writer = SegmentWriter {
            file,
            buffer: AlignedBuffer::new(self.config().write_chunk_bytes),
            filled: 0,
            position: 0,
        };
        let mut segment = Segment::new_active(
            base,
            self.clock.now_ms(),
            self.config().write_chunk_bytes,
            self.config().index_interval_bytes,
        );
        segment.tail = None;
        let mut changed = sources.len() > 1;
        // An emptied batch is stored only if it turns out to be the group's
        // last, which keeps the group's end where it was.
        let mut pending_empty: Option<(Vec<u8>, protocol::BatchHeader)> = None;
        let mut removed = 0u64;
        for view in sources {
            let Some(mut scanner) = self.closed_segment_scanner(view) else {
                return Ok(None);
            };
            while let Some(batch) = scanner
                .next()
                .await
                .map_err(|e| self.scan_error(view.base, e))?
            {
                let header = batch.header;
                let bytes = scanner.last_bytes();
                report.bytes_read += bytes.len() as u64;
                let aborted = rule.aborted.is_aborted(&header);
                let retained = if header.is_control() {
                    Retained::All
                } else {
                    let parsed = RecordBatch::parse(bytes, STORED_BATCH_BYTES_MAX)
                        .map_err(|e| self.corrupt(view.base, batch.position, e.to_string()))?;
                    retain_records(
                        &parsed,
                        self.config().decompressed_bytes_max,
                        request.zstd_level,
                        |r| {
                            !aborted
                                && rule.keep.keep(
                                    rule.map,
                                    &RecordView {
                                        offset: r.offset,
                                        key: r.key.map(KeyHash::of),
                                        tombstone: r.value.is_none(),
                                        timestamp_ms: r.timestamp_ms,
                                    },
                                )
                        },
                    )
                    .map_err(|e| self.corrupt(view.base, batch.position, e.to_string()))?
                };
                let (out, out_header) = match retained {
                    Retained::All => (bytes.to_vec(), header),
                    Retained::Rewritten(out) => {
                        changed = true;
                        let out_header = *RecordBatch::parse(&out, STORED_BATCH_BYTES_MAX)
                            .expect("a rewritten batch is valid")
                            .header();
                        removed += (header.record_count - out_header.record_count) as u64;
                        (out, out_header)
                    }
                };
                let charged = (bytes.len() + out.len()) as u64;
                if out_header.record_count == 0 && !header.is_control() {
                    pending_empty = Some((out, out_header));
                } else {
                    pending_empty = None;
                    report.bytes_written += out.len() as u64;
                    writer.push(&out).await.map_err(io)?;
                    segment.account_batch(&out_header, self.config().index_interval_bytes);
                }
                throttle.charge(self, charged).await;
            }
        }
        if let Some((out, out_header)) = pending_empty {
            report.bytes_written += out.len() as u64;
            writer.push(&out).await.map_err(io)?;
            segment.account_batch(&out_header, self.config().index_interval_bytes);
        }
        let last = sources.last().expect("a group has a segment");
        assert_eq!(
            segment.next_offset, last.next_offset,
            "a cleaned group ends where its last segment did"
        );
        if !changed {
            drop(writer);
            return Ok(None);
        }
        let size = writer.finish().await.map_err(io)?;
        assert_eq!(size, segment.size_bytes);
        write_small_file(
            &staged_path(&self.dir, base, INDEX_SUFFIX, CLEANED_SUFFIX),
            &segment.offset_index.encode(),
        )
        .await?;
        write_small_file(
            &staged_path(&self.dir, base, TIME_INDEX_SUFFIX, CLEANED_SUFFIX),
            &segment.time_index.encode(),
        )
        .await?;
        report.records_removed += removed;
        Ok(Some(segment))
    }
}
