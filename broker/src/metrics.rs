//! Per-shard counters and latency histograms, rendered in the Prometheus text
//! format by the admin endpoint. Plain cells: each shard owns its own.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use protocol::ApiKey;

use crate::latency::LatencyHistogram;
use crate::partition::PartitionKey;

#[derive(Debug, Default)]
pub struct ShardMetrics {
    requests: RefCell<BTreeMap<&'static str, u64>>,
    latency: RefCell<BTreeMap<&'static str, LatencyHistogram>>,
    request_bytes: Cell<u64>,
    response_bytes: Cell<u64>,
    appended_records: Cell<u64>,
    /// Idempotent producers' retries answered from the producer state.
    duplicate_batches: Cell<u64>,
    connections_open: Cell<u64>,
    connections_total: Cell<u64>,
    connections_refused: Cell<u64>,
    bad_frames: Cell<u64>,
    storage_errors: Cell<u64>,
    fetch_waiters: std::rc::Rc<Cell<u64>>,
    cleaner_passes: Cell<u64>,
    cleaner_bytes_read: Cell<u64>,
    cleaner_bytes_written: Cell<u64>,
    cleaner_records_removed: Cell<u64>,
    cleaner_errors: Cell<u64>,
    group_records_written: Cell<u64>,
    group_offset_commits: Cell<u64>,
    group_epoch_bumps: Cell<u64>,
}

/// What this shard's group coordinators report: groups by state, and per
/// group and partition the committed offset and the lag in records and in
/// seconds from the last probe.
#[derive(Clone, Debug, Default)]
pub struct GroupGauges {
    pub groups_by_state: BTreeMap<&'static str, u64>,
    pub committed: Vec<CommittedGauge>,
}

#[derive(Clone, Debug)]
pub struct CommittedGauge {
    pub group: String,
    pub topic: String,
    pub partition: u32,
    pub offset: i64,
    /// High watermark minus committed offset, as last probed.
    pub lag_records: Option<i64>,
    /// Age of the oldest record the group has not consumed, as last probed
    /// (0 when caught up).
    pub lag_seconds: Option<f64>,
}

/// A compacted partition's cleaning state, for the metrics.
#[derive(Clone, Copy, Debug)]
pub struct CleanerGauges {
    pub dirty_ratio_permille: u32,
    /// Seconds since the last pass; `None` before the first.
    pub since_last_pass_seconds: Option<f64>,
    pub uncleanable: bool,
}

/// Counts one waiting fetch long poll while it lives.
#[derive(Debug)]
pub struct FetchWaiter(std::rc::Rc<Cell<u64>>);

impl Drop for FetchWaiter {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

/// A shard's disk counters: its logs' (summed), its journal's and its
/// space releaser's.
#[derive(Clone, Copy, Debug, Default)]
pub struct StorageStats {
    pub log: crate::log::LogStats,
    pub journal: crate::log::shard_journal::JournalStats,
    pub release: crate::log::space_release::ReleaseStats,
}

impl ShardMetrics {
    pub fn on_request(
        &self,
        api: Option<ApiKey>,
        request_bytes: usize,
        response_bytes: usize,
        elapsed: Duration,
    ) {
        let name = api.map_or("unknown", ApiKey::name);
        *self.requests.borrow_mut().entry(name).or_default() += 1;
        self.request_bytes
            .set(self.request_bytes.get() + request_bytes as u64);
        self.response_bytes
            .set(self.response_bytes.get() + response_bytes as u64);
        self.latency
            .borrow_mut()
            .entry(name)
            .or_default()
            .record(elapsed);
    }

    /// A fetch long poll starts waiting; the gauge drops when it stops.
    pub fn fetch_waiter(&self) -> FetchWaiter {
        self.fetch_waiters.set(self.fetch_waiters.get() + 1);
        FetchWaiter(self.fetch_waiters.clone())
    }

    pub fn fetch_waiters(&self) -> u64 {
        self.fetch_waiters.get()
    }

    pub fn on_append(&self, records: i64) {
        self.appended_records
            .set(self.appended_records.get() + records as u64);
    }

    pub fn on_duplicate_batch(&self) {
        self.duplicate_batches.set(self.duplicate_batches.get() + 1);
    }

    pub fn on_connection_open(&self) {
        self.connections_open.set(self.connections_open.get() + 1);
        self.connections_total.set(self.connections_total.get() + 1);
    }

    pub fn on_connection_close(&self) {
        self.connections_open.set(self.connections_open.get() - 1);
    }

    pub fn on_connection_refused(&self) {
        self.connections_refused
            .set(self.connections_refused.get() + 1);
    }

    pub fn connections_open(&self) -> u64 {
        self.connections_open.get()
    }

    pub fn on_bad_frame(&self) {
        self.bad_frames.set(self.bad_frames.get() + 1);
    }

    pub fn on_storage_error(&self) {
        self.storage_errors.set(self.storage_errors.get() + 1);
    }

    /// One compaction pass that ran.
    pub fn on_clean(&self, report: &crate::log::CleanReport) {
        let add = |cell: &Cell<u64>, n: u64| cell.set(cell.get() + n);
        add(&self.cleaner_passes, 1);
        add(&self.cleaner_bytes_read, report.bytes_read);
        add(&self.cleaner_bytes_written, report.bytes_written);
        add(&self.cleaner_records_removed, report.records_removed);
    }

    pub fn on_cleaner_error(&self) {
        self.cleaner_errors.set(self.cleaner_errors.get() + 1);
    }

    /// Group records a coordinator wrote: all of them, the offset commits
    /// among them and the new group epochs (each a rebalance).
    pub fn on_group_records(&self, records: &[crate::group::records::GroupRecord]) {
        use crate::group::records::GroupRecord;
        let commits = records
            .iter()
            .filter(|r| matches!(r, GroupRecord::Offset { value: Some(_), .. }))
            .count();
        let bumps = records
            .iter()
            .filter(|r| matches!(r, GroupRecord::Group { value: Some(_), .. }))
            .count();
        self.group_records_written
            .set(self.group_records_written.get() + records.len() as u64);
        self.group_offset_commits
            .set(self.group_offset_commits.get() + commits as u64);
        self.group_epoch_bumps
            .set(self.group_epoch_bumps.get() + bumps as u64);
    }

    /// This shard's metrics in Prometheus text format (without HELP/TYPE
    /// headers, which the endpoint writes once for all shards).
    pub fn render(
        &self,
        shard: usize,
        log_end_offsets: &BTreeMap<PartitionKey, i64>,
        storage: StorageStats,
        cleaning: &BTreeMap<PartitionKey, CleanerGauges>,
        groups: &GroupGauges,
        cache_bytes: usize,
    ) -> String {
        let StorageStats {
            log,
            journal,
            release,
        } = storage;
        let mut out = String::new();
        for (api, count) in self.requests.borrow().iter() {
            let _ = writeln!(
                out,
                "ringlog_requests_total{{shard=\"{shard}\",api=\"{api}\"}} {count}"
            );
        }
        for (api, h) in self.latency.borrow().iter() {
            h.render(
                &mut out,
                "ringlog_request_latency_seconds",
                &format!("shard=\"{shard}\",api=\"{api}\""),
            );
        }
        log.write_latency.render(
            &mut out,
            "ringlog_log_write_seconds",
            &format!("shard=\"{shard}\""),
        );
        log.sync_latency.render(
            &mut out,
            "ringlog_log_sync_seconds",
            &format!("shard=\"{shard}\""),
        );
        let counters = [
            ("ringlog_request_bytes_total", self.request_bytes.get()),
            ("ringlog_response_bytes_total", self.response_bytes.get()),
            (
                "ringlog_appended_records_total",
                self.appended_records.get(),
            ),
            (
                "ringlog_produce_duplicate_batches_total",
                self.duplicate_batches.get(),
            ),
            ("ringlog_connections_open", self.connections_open.get()),
            ("ringlog_connections_total", self.connections_total.get()),
            (
                "ringlog_connections_refused_total",
                self.connections_refused.get(),
            ),
            ("ringlog_bad_frames_total", self.bad_frames.get()),
            ("ringlog_storage_errors_total", self.storage_errors.get()),
            ("ringlog_batch_cache_bytes", cache_bytes as u64),
            ("ringlog_log_appended_batches_total", log.appended_batches),
            ("ringlog_log_appended_bytes_total", log.appended_bytes),
            ("ringlog_log_chunk_writes_total", log.chunk_writes),
            ("ringlog_log_read_bytes_total", log.read_bytes),
            (
                "ringlog_log_rescanned_segments_total",
                log.rescanned_segments,
            ),
            ("ringlog_log_data_syncs_total", log.data_syncs),
            ("ringlog_log_journal_commits_total", log.journal_commits),
            ("ringlog_log_journal_fallbacks_total", log.journal_fallbacks),
            ("ringlog_journal_rounds_total", journal.rounds),
            ("ringlog_journal_records_total", journal.records),
            ("ringlog_journal_written_bytes_total", journal.round_bytes),
            ("ringlog_journal_checkpoints_total", journal.checkpoints),
            (
                "ringlog_journal_checkpoint_waits_total",
                journal.checkpoint_waits,
            ),
            ("ringlog_log_released_bytes_total", release.released_bytes),
            ("ringlog_log_released_files_total", release.released_files),
            ("ringlog_log_release_pending_bytes", release.pending_bytes),
            ("ringlog_log_release_failures_total", release.failures),
            ("ringlog_log_preallocations_total", log.preallocations),
            (
                "ringlog_log_preallocations_refused_total",
                log.preallocations_refused,
            ),
            ("ringlog_fetch_waiters", self.fetch_waiters.get()),
            ("ringlog_cleaner_passes_total", self.cleaner_passes.get()),
            (
                "ringlog_cleaner_read_bytes_total",
                self.cleaner_bytes_read.get(),
            ),
            (
                "ringlog_cleaner_written_bytes_total",
                self.cleaner_bytes_written.get(),
            ),
            (
                "ringlog_cleaner_removed_records_total",
                self.cleaner_records_removed.get(),
            ),
            ("ringlog_cleaner_errors_total", self.cleaner_errors.get()),
            (
                "ringlog_group_records_written_total",
                self.group_records_written.get(),
            ),
            (
                "ringlog_group_offset_commits_total",
                self.group_offset_commits.get(),
            ),
            (
                "ringlog_group_rebalances_total",
                self.group_epoch_bumps.get(),
            ),
        ];
        for (name, value) in counters {
            let _ = writeln!(out, "{name}{{shard=\"{shard}\"}} {value}");
        }
        for (key, end) in log_end_offsets {
            let _ = writeln!(
                out,
                "ringlog_log_end_offset{{shard=\"{shard}\",topic=\"{}\",partition=\"{}\"}} {end}",
                key.topic, key.partition
            );
        }
        for (state, count) in &groups.groups_by_state {
            let _ = writeln!(
                out,
                "ringlog_groups{{shard=\"{shard}\",state=\"{state}\"}} {count}"
            );
        }
        for g in &groups.committed {
            let labels = format!(
                "shard=\"{shard}\",group=\"{}\",topic=\"{}\",partition=\"{}\"",
                g.group, g.topic, g.partition
            );
            let _ = writeln!(
                out,
                "ringlog_group_committed_offset{{{labels}}} {}",
                g.offset
            );
            if let Some(lag) = g.lag_records {
                let _ = writeln!(out, "ringlog_group_lag_records{{{labels}}} {lag}");
            }
            if let Some(seconds) = g.lag_seconds {
                let _ = writeln!(out, "ringlog_group_lag_seconds{{{labels}}} {seconds}");
            }
        }
        for (key, gauges) in cleaning {
            let labels = format!(
                "shard=\"{shard}\",topic=\"{}\",partition=\"{}\"",
                key.topic, key.partition
            );
            let _ = writeln!(
                out,
                "ringlog_cleaner_dirty_ratio{{{labels}}} {}",
                f64::from(gauges.dirty_ratio_permille) / 1000.0
            );
            if let Some(seconds) = gauges.since_last_pass_seconds {
                let _ = writeln!(
                    out,
                    "ringlog_cleaner_seconds_since_last_pass{{{labels}}} {seconds}"
                );
            }
            let _ = writeln!(
                out,
                "ringlog_cleaner_uncleanable{{{labels}}} {}",
                u8::from(gauges.uncleanable)
            );
        }
        out
    }
}
