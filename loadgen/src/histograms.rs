//! Latency histograms and counters: the three HDR histograms OMB records
//! (publish latency = ack − send, publish delay = send − intended send,
//! end-to-end = consume time − record timestamp), all in microseconds,
//! per worker; merged across workers once per interval into a snapshot for
//! the progress line and time series, and into run totals for the report.
//! No clocks and no I/O: callers pass durations in.

use crate::cpu::CpuUse;
use hdrhistogram::Histogram;
use serde::Serialize;

/// Largest latency recorded exactly; larger values are clamped to it (one
/// hour is far beyond any timeout the run uses).
pub const LATENCY_US_MAX: u64 = 3_600_000_000;
/// Three significant digits: 0.1 % value resolution, as OMB uses.
pub const SIGNIFICANT_VALUE_DIGITS: u8 = 3;
/// Bound on stored per-interval summaries (24 h of one-second intervals).
pub const INTERVALS_MAX: usize = 86_400;

/// Which of the three latencies a histogram holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatencyKind {
    Publish,
    PublishDelay,
    EndToEnd,
}

impl LatencyKind {
    pub const ALL: [LatencyKind; 3] = [
        LatencyKind::Publish,
        LatencyKind::PublishDelay,
        LatencyKind::EndToEnd,
    ];

    /// File-name and label form: `publish-latency`, `publish-delay`, `end-to-end-latency`.
    pub fn slug(self) -> &'static str {
        match self {
            LatencyKind::Publish => "publish-latency",
            LatencyKind::PublishDelay => "publish-delay",
            LatencyKind::EndToEnd => "end-to-end-latency",
        }
    }
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, SIGNIFICANT_VALUE_DIGITS)
        .expect("static histogram bounds are valid")
}

/// The three latency histograms, values in microseconds.
#[derive(Debug, Clone)]
pub struct LatencyHistograms {
    publish_us: Histogram<u64>,
    publish_delay_us: Histogram<u64>,
    end_to_end_us: Histogram<u64>,
}

impl Default for LatencyHistograms {
    fn default() -> Self {
        LatencyHistograms::new()
    }
}

impl LatencyHistograms {
    pub fn new() -> LatencyHistograms {
        LatencyHistograms {
            publish_us: new_histogram(),
            publish_delay_us: new_histogram(),
            end_to_end_us: new_histogram(),
        }
    }

    pub fn get(&self, kind: LatencyKind) -> &Histogram<u64> {
        match kind {
            LatencyKind::Publish => &self.publish_us,
            LatencyKind::PublishDelay => &self.publish_delay_us,
            LatencyKind::EndToEnd => &self.end_to_end_us,
        }
    }

    fn get_mut(&mut self, kind: LatencyKind) -> &mut Histogram<u64> {
        match kind {
            LatencyKind::Publish => &mut self.publish_us,
            LatencyKind::PublishDelay => &mut self.publish_delay_us,
            LatencyKind::EndToEnd => &mut self.end_to_end_us,
        }
    }

    /// Records one value, clamped to `LATENCY_US_MAX`.
    pub fn record_us(&mut self, kind: LatencyKind, value_us: u64) {
        self.get_mut(kind)
            .saturating_record(value_us.min(LATENCY_US_MAX));
    }

    /// Adds every count of `other` into `self`.
    pub fn add(&mut self, other: &LatencyHistograms) {
        for kind in LatencyKind::ALL {
            self.get_mut(kind)
                .add(other.get(kind))
                .expect("histograms share bounds, so addition cannot fail");
        }
    }

    pub fn reset(&mut self) {
        for kind in LatencyKind::ALL {
            self.get_mut(kind).reset();
        }
    }

    pub fn summary(&self, kind: LatencyKind) -> LatencySummary {
        LatencySummary::of(self.get(kind))
    }
}

/// Nanoseconds to whole microseconds, rounding down.
pub fn ns_to_us(duration_ns: u64) -> u64 {
    duration_ns / 1_000
}

/// The standard latency figures of one histogram, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct LatencySummary {
    pub count: u64,
    pub avg_ms: f64,
    pub p50_ms: f64,
    pub p75_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub p9999_ms: f64,
    pub max_ms: f64,
}

impl LatencySummary {
    /// Zeros for an empty histogram (there is no latency to report).
    pub fn of(histogram: &Histogram<u64>) -> LatencySummary {
        if histogram.is_empty() {
            return LatencySummary::default();
        }
        let at = |quantile: f64| us_to_ms(histogram.value_at_quantile(quantile));
        LatencySummary {
            count: histogram.len(),
            avg_ms: histogram.mean() / 1_000.0,
            p50_ms: at(0.5),
            p75_ms: at(0.75),
            p95_ms: at(0.95),
            p99_ms: at(0.99),
            p999_ms: at(0.999),
            p9999_ms: at(0.9999),
            max_ms: us_to_ms(histogram.max()),
        }
    }
}

pub fn us_to_ms(value_us: u64) -> f64 {
    value_us as f64 / 1_000.0
}

/// Message and byte counts. Plain sums, so merging is addition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Counters {
    pub published_messages: u64,
    pub published_bytes: u64,
    pub acked_messages: u64,
    pub consumed_messages: u64,
    pub consumed_bytes: u64,
    pub errors: u64,
    /// Messages the schedule asked for before the end that the generator
    /// never sent (it was stalled, its buffer full).
    pub unsent_messages: u64,
}

impl Counters {
    pub fn add(&mut self, other: &Counters) {
        self.published_messages += other.published_messages;
        self.published_bytes += other.published_bytes;
        self.acked_messages += other.acked_messages;
        self.consumed_messages += other.consumed_messages;
        self.consumed_bytes += other.consumed_bytes;
        self.errors += other.errors;
        self.unsent_messages += other.unsent_messages;
    }
}

/// What one producer or consumer worker accumulates between snapshots.
#[derive(Debug, Clone, Default)]
pub struct WorkerStats {
    pub histograms: LatencyHistograms,
    pub counters: Counters,
}

impl WorkerStats {
    pub fn new() -> WorkerStats {
        WorkerStats::default()
    }

    /// A send left at `send_ns`, scheduled for `send_ns - publish_delay_ns`.
    pub fn record_send(&mut self, payload_bytes: u64, publish_delay_ns: u64) {
        self.counters.published_messages += 1;
        self.counters.published_bytes += payload_bytes;
        self.histograms
            .record_us(LatencyKind::PublishDelay, ns_to_us(publish_delay_ns));
    }

    /// A message the schedule asked for was never sent: by the end of the
    /// run it was `publish_delay_ns` late, which its publish delay counts
    /// (a lower bound: it would have left later still), so a generator
    /// stalled to the end does not leave the histogram empty.
    pub fn record_unsent(&mut self, publish_delay_ns: u64) {
        self.counters.unsent_messages += 1;
        self.histograms
            .record_us(LatencyKind::PublishDelay, ns_to_us(publish_delay_ns));
    }

    /// The broker acknowledged a send after `publish_latency_ns`.
    pub fn record_ack(&mut self, publish_latency_ns: u64) {
        self.counters.acked_messages += 1;
        self.histograms
            .record_us(LatencyKind::Publish, ns_to_us(publish_latency_ns));
    }

    /// A send failed (error response or timeout).
    pub fn record_error(&mut self) {
        self.counters.errors += 1;
    }

    /// A consumer received a record. Times are wall-clock microseconds
    /// because the timestamp was written by another process; a negative
    /// difference (clock step) is recorded as 0.
    pub fn record_consume(
        &mut self,
        payload_bytes: u64,
        consume_time_us: u64,
        record_timestamp_us: u64,
    ) {
        self.counters.consumed_messages += 1;
        self.counters.consumed_bytes += payload_bytes;
        self.histograms.record_us(
            LatencyKind::EndToEnd,
            consume_time_us.saturating_sub(record_timestamp_us),
        );
    }

    /// Adds this worker's interval into `sink` and starts a new interval,
    /// reusing the allocation (histograms are sized once, at start-up).
    pub fn drain_into(&mut self, sink: &mut WorkerStats) {
        sink.histograms.add(&self.histograms);
        sink.counters.add(&self.counters);
        self.histograms.reset();
        self.counters = Counters::default();
    }
}

/// Whether an interval counts toward the final report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Warmup,
    Measure,
}

/// One interval's rates and latencies: a point of the time series.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct IntervalSummary {
    /// Seconds since the run started, at the end of the interval.
    pub elapsed_s: f64,
    pub duration_s: f64,
    pub publish_rate_msgs_per_s: f64,
    pub publish_rate_bytes_per_s: f64,
    pub consume_rate_msgs_per_s: f64,
    pub consume_rate_bytes_per_s: f64,
    pub error_rate_per_s: f64,
    /// Messages published × consumer groups − messages consumed, at the end.
    pub backlog_messages: u64,
    pub errors_total: u64,
    pub publish_latency: LatencySummary,
    pub publish_delay: LatencySummary,
    pub end_to_end_latency: LatencySummary,
}

/// Merges worker intervals, keeps the time series and the run totals.
#[derive(Debug)]
pub struct RunRecorder {
    consumer_groups: u32,
    interval: WorkerStats,
    /// Measured phase only: what the final report aggregates.
    measured: WorkerStats,
    /// Everything including warmup: for backlog.
    all_counters: Counters,
    series: Vec<IntervalSummary>,
    intervals_dropped: u64,
    /// CPU use over the measured seconds, where `/proc` could tell.
    cpu: Option<CpuUse>,
}

impl RunRecorder {
    pub fn new(consumer_groups: u32) -> RunRecorder {
        RunRecorder {
            consumer_groups,
            interval: WorkerStats::new(),
            measured: WorkerStats::new(),
            all_counters: Counters::default(),
            series: Vec::new(),
            intervals_dropped: 0,
            cpu: None,
        }
    }

    pub fn set_cpu(&mut self, cpu: Option<CpuUse>) {
        self.cpu = cpu;
    }

    pub fn cpu(&self) -> Option<CpuUse> {
        self.cpu
    }

    /// Drains every worker, summarises the interval that ended at
    /// `elapsed_ns` after lasting `duration_ns`, and (in the measure phase)
    /// adds it to the run totals and the time series.
    pub fn record_interval(
        &mut self,
        elapsed_ns: u64,
        duration_ns: u64,
        workers: &mut [WorkerStats],
        phase: Phase,
    ) -> IntervalSummary {
        assert!(duration_ns > 0, "an interval has a length");
        for worker in workers.iter_mut() {
            worker.drain_into(&mut self.interval);
        }
        self.all_counters.add(&self.interval.counters);
        let summary = self.summarise(elapsed_ns, duration_ns);
        if phase == Phase::Measure {
            self.measured.histograms.add(&self.interval.histograms);
            self.measured.counters.add(&self.interval.counters);
            if self.series.len() < INTERVALS_MAX {
                self.series.push(summary);
            } else {
                self.intervals_dropped += 1;
            }
        }
        self.interval.histograms.reset();
        self.interval.counters = Counters::default();
        summary
    }

    fn summarise(&self, elapsed_ns: u64, duration_ns: u64) -> IntervalSummary {
        let duration_s = duration_ns as f64 / 1e9;
        let counters = &self.interval.counters;
        let histograms = &self.interval.histograms;
        let expected_reads = self.all_counters.published_messages * u64::from(self.consumer_groups);
        IntervalSummary {
            elapsed_s: elapsed_ns as f64 / 1e9,
            duration_s,
            publish_rate_msgs_per_s: counters.published_messages as f64 / duration_s,
            publish_rate_bytes_per_s: counters.published_bytes as f64 / duration_s,
            consume_rate_msgs_per_s: counters.consumed_messages as f64 / duration_s,
            consume_rate_bytes_per_s: counters.consumed_bytes as f64 / duration_s,
            error_rate_per_s: counters.errors as f64 / duration_s,
            backlog_messages: expected_reads.saturating_sub(self.all_counters.consumed_messages),
            errors_total: self.all_counters.errors,
            publish_latency: histograms.summary(LatencyKind::Publish),
            publish_delay: histograms.summary(LatencyKind::PublishDelay),
            end_to_end_latency: histograms.summary(LatencyKind::EndToEnd),
        }
    }

    /// Counters over every interval so far, warmup included.
    pub fn all_counters(&self) -> &Counters {
        &self.all_counters
    }

    /// Measured-phase histograms, merged over all workers and intervals.
    pub fn aggregate(&self) -> &LatencyHistograms {
        &self.measured.histograms
    }

    /// Measured-phase counters.
    pub fn measured_counters(&self) -> &Counters {
        &self.measured.counters
    }

    pub fn series(&self) -> &[IntervalSummary] {
        &self.series
    }

    pub fn intervals_dropped(&self) -> u64 {
        self.intervals_dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A message never sent counts as unsent, not as published, and its
    // lateness lands in publish delay.
    #[test]
    fn unsent_messages_count_their_delay() {
        let mut stats = WorkerStats::new();
        stats.record_send(500, 1_000_000);
        stats.record_unsent(3_000_000_000);
        assert_eq!(stats.counters.published_messages, 1);
        assert_eq!(stats.counters.unsent_messages, 1);
        let delay = stats.histograms.summary(LatencyKind::PublishDelay);
        assert!(delay.max_ms >= 2_990.0, "{delay:?}");
    }

    // Merging two workers gives the quantiles of the union of their samples.
    #[test]
    fn merge_gives_union_quantiles() {
        let mut low = LatencyHistograms::new();
        let mut high = LatencyHistograms::new();
        for value_us in 1..=500 {
            low.record_us(LatencyKind::Publish, value_us);
            high.record_us(LatencyKind::Publish, value_us + 500);
        }
        let mut merged = LatencyHistograms::new();
        merged.add(&low);
        merged.add(&high);
        let histogram = merged.get(LatencyKind::Publish);
        assert_eq!(histogram.len(), 1_000);
        assert_eq!(histogram.value_at_quantile(0.5), 500);
        assert!(histogram.equivalent(histogram.value_at_quantile(0.99), 990));
        assert!(histogram.equivalent(histogram.max(), 1_000));
        assert!(merged.get(LatencyKind::EndToEnd).is_empty());
    }

    // Summaries convert microseconds to milliseconds and respect 3 significant digits.
    #[test]
    fn summary_in_ms() {
        let mut histograms = LatencyHistograms::new();
        for value_us in 1..=10_000 {
            histograms.record_us(LatencyKind::EndToEnd, value_us);
        }
        let summary = histograms.summary(LatencyKind::EndToEnd);
        assert_eq!(summary.count, 10_000);
        assert!((summary.p50_ms - 5.0).abs() <= 0.005);
        assert!((summary.p99_ms - 9.9).abs() <= 0.01);
        assert!((summary.avg_ms - 5.0005).abs() <= 0.01);
        assert!((summary.max_ms - 10.0).abs() <= 0.01);
        assert!(summary.p50_ms <= summary.p75_ms && summary.p75_ms <= summary.p95_ms);
        assert!(summary.p99_ms <= summary.p999_ms && summary.p9999_ms <= summary.max_ms);
        assert_eq!(
            LatencySummary::of(histograms.get(LatencyKind::Publish)),
            LatencySummary::default()
        );
    }

    // Values beyond the bound are clamped, not dropped or panicking.
    #[test]
    fn clamps_huge_values() {
        let mut histograms = LatencyHistograms::new();
        histograms.record_us(LatencyKind::Publish, u64::MAX);
        let histogram = histograms.get(LatencyKind::Publish);
        assert_eq!(histogram.len(), 1);
        assert!(histogram.equivalent(histogram.max(), LATENCY_US_MAX));
    }

    // Per-second snapshots: rates per interval, warmup excluded from totals,
    // backlog from all published × groups − consumed, worker state reset.
    #[test]
    fn interval_snapshots_and_totals() {
        let mut recorder = RunRecorder::new(2);
        let mut workers = vec![WorkerStats::new(), WorkerStats::new()];
        for worker in workers.iter_mut() {
            for _ in 0..100 {
                worker.record_send(500, 2_000);
                worker.record_ack(1_500_000);
                worker.record_consume(500, 10_000, 7_000);
            }
        }
        let warmup =
            recorder.record_interval(1_000_000_000, 1_000_000_000, &mut workers, Phase::Warmup);
        assert_eq!(warmup.publish_rate_msgs_per_s, 200.0);
        assert_eq!(warmup.publish_rate_bytes_per_s, 100_000.0);
        assert_eq!(warmup.backlog_messages, 200);
        assert!(recorder.series().is_empty());
        assert_eq!(recorder.aggregate().get(LatencyKind::Publish).len(), 0);
        assert!(workers.iter().all(|w| w.counters == Counters::default()));

        workers[0].record_send(500, 0);
        workers[0].record_error();
        for _ in 0..3 {
            workers[1].record_consume(500, 10_000, 9_000);
        }
        let measured =
            recorder.record_interval(1_500_000_000, 500_000_000, &mut workers, Phase::Measure);
        assert_eq!(measured.publish_rate_msgs_per_s, 2.0);
        assert_eq!(measured.consume_rate_msgs_per_s, 6.0);
        assert_eq!(measured.error_rate_per_s, 2.0);
        assert_eq!(measured.errors_total, 1);
        assert_eq!(measured.backlog_messages, 402 - 203);
        assert!((measured.end_to_end_latency.p50_ms - 1.0).abs() < 0.001);
        assert_eq!(recorder.series().len(), 1);
        assert_eq!(recorder.measured_counters().published_messages, 1);
        assert_eq!(recorder.aggregate().get(LatencyKind::EndToEnd).len(), 3);
    }

    // A consumer clock behind the producer's records 0, not a wrapped huge value.
    #[test]
    fn negative_end_to_end_is_zero() {
        let mut worker = WorkerStats::new();
        worker.record_consume(1, 5, 10);
        assert_eq!(worker.histograms.get(LatencyKind::EndToEnd).max(), 0);
    }
}
