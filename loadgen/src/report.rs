//! End-of-run reports: the console latency table, `result.json` with
//! OpenMessaging Benchmark field names, one `.hgrm` percentile distribution
//! per histogram, and `report.html` with inline SVG plots. Rendering is pure
//! (strings out); `report_dir::write_report_dir` writes the files. The HTML
//! must never reference anything outside itself (no scripts, fonts, styles
//! or images fetched from the network).
//!
//! Units: every latency in `result.json`, the `.hgrm` files and the HTML is
//! in milliseconds (histograms hold microseconds; `.hgrm` values are scaled
//! by 1000, the HdrHistogram plotter's convention). OMB itself reports its
//! publish-delay figures in microseconds; we keep one unit and say so in the
//! `latencyUnit` field.

use std::fmt::Write as _;
use std::path::PathBuf;

use hdrhistogram::Histogram;
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};
use thiserror::Error;

use crate::cpu::CpuUse;
use crate::histograms::{
    us_to_ms, Counters, IntervalSummary, LatencyHistograms, LatencyKind, LatencySummary,
    RunRecorder, SIGNIFICANT_VALUE_DIGITS,
};

/// Ticks per half distance for the `.hgrm` output (HdrHistogram's default).
pub const HGRM_TICKS_PER_HALF_DISTANCE: u32 = 5;
/// Ticks per half distance for the JSON quantile curves (what OMB uses).
pub const CURVE_TICKS_PER_HALF_DISTANCE: u32 = 100;
/// `.hgrm` values are printed in milliseconds.
pub const HGRM_VALUE_SCALE_US_PER_MS: f64 = 1_000.0;

/// Why the report could not be written.
#[derive(Debug, Error)]
pub enum ReportError {
    #[error("writing {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("encoding result.json: {0}")]
    Json(#[from] serde_json::Error),
}

/// What was run: echoed into the report so a result explains itself.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadParameters {
    /// OMB's `workload`: a name such as `1m-500b` or `custom`.
    pub workload: String,
    pub driver: String,
    pub topic: String,
    pub topics: u32,
    pub partitions: u32,
    pub replication_factor: u32,
    pub message_size: u64,
    pub target_rate_msgs_per_s: u64,
    pub producers_per_topic: u32,
    /// Consumers of each group (OMB's `consumerPerSubscription`).
    pub consumers_per_topic: u32,
    /// Addition, OMB's workload term: consumer groups each reading the
    /// whole topic (0 when the run only produces).
    pub subscriptions_per_topic: u32,
    /// Addition: the group id (or id prefix) when consuming through
    /// consumer groups; absent for the load generator's own assignment.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consumer_group: Option<String>,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub acks: String,
    pub batch_bytes: u64,
    pub linger_ms: u64,
    pub compression: String,
    pub keys: String,
    pub payload: String,
    pub seed: u64,
    /// Addition: the CPUs the load generator's worker threads were pinned
    /// to (`--cpus`); empty when the scheduler placed them.
    pub loadgen_cpus: Vec<usize>,
}

/// A quantile curve: (percentile, value in ms), serialized as an object
/// `{"50.0": 1.234, ...}` in increasing percentile order, as OMB does.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct QuantileCurve(pub Vec<(f64, f64)>);

impl QuantileCurve {
    pub fn of(histogram: &Histogram<u64>, ticks_per_half_distance: u32) -> QuantileCurve {
        let points = histogram
            .iter_quantiles(ticks_per_half_distance)
            .map(|step| {
                (
                    step.quantile_iterated_to() * 100.0,
                    us_to_ms(step.value_iterated_to()),
                )
            })
            .collect();
        QuantileCurve(points)
    }
}

impl Serialize for QuantileCurve {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (percentile, value_ms) in &self.0 {
            map.serialize_entry(&percentile.to_string(), value_ms)?;
        }
        map.end()
    }
}

/// `result.json`. Field names follow OMB's `TestResult`; additions are
/// marked. Arrays hold one entry per measured interval (one second).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TestResult {
    #[serde(flatten)]
    pub workload: WorkloadParameters,
    /// Addition: the unit of every latency below.
    pub latency_unit: &'static str,
    /// Addition: seconds since start at the end of each interval.
    pub elapsed_seconds: Vec<f64>,
    pub publish_rate: Vec<f64>,
    pub publish_error_rate: Vec<f64>,
    pub consume_rate: Vec<f64>,
    pub backlog: Vec<u64>,
    pub publish_latency_avg: Vec<f64>,
    pub publish_latency_50pct: Vec<f64>,
    pub publish_latency_75pct: Vec<f64>,
    pub publish_latency_95pct: Vec<f64>,
    pub publish_latency_99pct: Vec<f64>,
    pub publish_latency_999pct: Vec<f64>,
    pub publish_latency_9999pct: Vec<f64>,
    pub publish_latency_max: Vec<f64>,
    pub publish_delay_latency_avg: Vec<f64>,
    pub publish_delay_latency_50pct: Vec<f64>,
    pub publish_delay_latency_99pct: Vec<f64>,
    pub publish_delay_latency_999pct: Vec<f64>,
    pub publish_delay_latency_max: Vec<f64>,
    pub end_to_end_latency_avg: Vec<f64>,
    pub end_to_end_latency_50pct: Vec<f64>,
    pub end_to_end_latency_99pct: Vec<f64>,
    pub end_to_end_latency_999pct: Vec<f64>,
    pub end_to_end_latency_max: Vec<f64>,
    pub aggregated_publish_latency_avg: f64,
    pub aggregated_publish_latency_50pct: f64,
    pub aggregated_publish_latency_75pct: f64,
    pub aggregated_publish_latency_95pct: f64,
    pub aggregated_publish_latency_99pct: f64,
    pub aggregated_publish_latency_999pct: f64,
    pub aggregated_publish_latency_9999pct: f64,
    pub aggregated_publish_latency_max: f64,
    pub aggregated_publish_delay_latency_avg: f64,
    pub aggregated_publish_delay_latency_50pct: f64,
    pub aggregated_publish_delay_latency_75pct: f64,
    pub aggregated_publish_delay_latency_95pct: f64,
    pub aggregated_publish_delay_latency_99pct: f64,
    pub aggregated_publish_delay_latency_999pct: f64,
    pub aggregated_publish_delay_latency_9999pct: f64,
    pub aggregated_publish_delay_latency_max: f64,
    pub aggregated_end_to_end_latency_avg: f64,
    pub aggregated_end_to_end_latency_50pct: f64,
    pub aggregated_end_to_end_latency_75pct: f64,
    pub aggregated_end_to_end_latency_95pct: f64,
    pub aggregated_end_to_end_latency_99pct: f64,
    pub aggregated_end_to_end_latency_999pct: f64,
    pub aggregated_end_to_end_latency_9999pct: f64,
    pub aggregated_end_to_end_latency_max: f64,
    pub aggregated_publish_latency_quantiles: QuantileCurve,
    pub aggregated_publish_delay_latency_quantiles: QuantileCurve,
    pub aggregated_end_to_end_latency_quantiles: QuantileCurve,
    pub published_messages: u64,
    pub acked_messages: u64,
    /// Addition.
    pub consumed_messages: u64,
    pub errors: u64,
    /// Addition: messages the schedule asked for that the generator never
    /// sent before the end (counted in publish delay with their lateness).
    pub unsent_messages: u64,
    /// Addition: intervals beyond `INTERVALS_MAX` left out of the arrays.
    pub intervals_dropped: u64,
    /// Addition: cores the load generator and everything else on the host
    /// used over the measured seconds (null where `/proc` could not tell).
    pub cpu: Option<CpuUse>,
}

fn column<T>(series: &[IntervalSummary], pick: impl Fn(&IntervalSummary) -> T) -> Vec<T> {
    series.iter().map(pick).collect()
}

impl TestResult {
    pub fn build(workload: &WorkloadParameters, recorder: &RunRecorder) -> TestResult {
        let s = recorder.series();
        let aggregate = recorder.aggregate();
        let publish = aggregate.summary(LatencyKind::Publish);
        let delay = aggregate.summary(LatencyKind::PublishDelay);
        let e2e = aggregate.summary(LatencyKind::EndToEnd);
        let counters: &Counters = recorder.measured_counters();
        let curve = |kind| QuantileCurve::of(aggregate.get(kind), CURVE_TICKS_PER_HALF_DISTANCE);
        TestResult {
            workload: workload.clone(),
            latency_unit: "ms",
            elapsed_seconds: column(s, |i| i.elapsed_s),
            publish_rate: column(s, |i| i.publish_rate_msgs_per_s),
            publish_error_rate: column(s, |i| i.error_rate_per_s),
            consume_rate: column(s, |i| i.consume_rate_msgs_per_s),
            backlog: column(s, |i| i.backlog_messages),
            publish_latency_avg: column(s, |i| i.publish_latency.avg_ms),
            publish_latency_50pct: column(s, |i| i.publish_latency.p50_ms),
            publish_latency_75pct: column(s, |i| i.publish_latency.p75_ms),
            publish_latency_95pct: column(s, |i| i.publish_latency.p95_ms),
            publish_latency_99pct: column(s, |i| i.publish_latency.p99_ms),
            publish_latency_999pct: column(s, |i| i.publish_latency.p999_ms),
            publish_latency_9999pct: column(s, |i| i.publish_latency.p9999_ms),
            publish_latency_max: column(s, |i| i.publish_latency.max_ms),
            publish_delay_latency_avg: column(s, |i| i.publish_delay.avg_ms),
            publish_delay_latency_50pct: column(s, |i| i.publish_delay.p50_ms),
            publish_delay_latency_99pct: column(s, |i| i.publish_delay.p99_ms),
            publish_delay_latency_999pct: column(s, |i| i.publish_delay.p999_ms),
            publish_delay_latency_max: column(s, |i| i.publish_delay.max_ms),
            end_to_end_latency_avg: column(s, |i| i.end_to_end_latency.avg_ms),
            end_to_end_latency_50pct: column(s, |i| i.end_to_end_latency.p50_ms),
            end_to_end_latency_99pct: column(s, |i| i.end_to_end_latency.p99_ms),
            end_to_end_latency_999pct: column(s, |i| i.end_to_end_latency.p999_ms),
            end_to_end_latency_max: column(s, |i| i.end_to_end_latency.max_ms),
            aggregated_publish_latency_avg: publish.avg_ms,
            aggregated_publish_latency_50pct: publish.p50_ms,
            aggregated_publish_latency_75pct: publish.p75_ms,
            aggregated_publish_latency_95pct: publish.p95_ms,
            aggregated_publish_latency_99pct: publish.p99_ms,
            aggregated_publish_latency_999pct: publish.p999_ms,
            aggregated_publish_latency_9999pct: publish.p9999_ms,
            aggregated_publish_latency_max: publish.max_ms,
            aggregated_publish_delay_latency_avg: delay.avg_ms,
            aggregated_publish_delay_latency_50pct: delay.p50_ms,
            aggregated_publish_delay_latency_75pct: delay.p75_ms,
            aggregated_publish_delay_latency_95pct: delay.p95_ms,
            aggregated_publish_delay_latency_99pct: delay.p99_ms,
            aggregated_publish_delay_latency_999pct: delay.p999_ms,
            aggregated_publish_delay_latency_9999pct: delay.p9999_ms,
            aggregated_publish_delay_latency_max: delay.max_ms,
            aggregated_end_to_end_latency_avg: e2e.avg_ms,
            aggregated_end_to_end_latency_50pct: e2e.p50_ms,
            aggregated_end_to_end_latency_75pct: e2e.p75_ms,
            aggregated_end_to_end_latency_95pct: e2e.p95_ms,
            aggregated_end_to_end_latency_99pct: e2e.p99_ms,
            aggregated_end_to_end_latency_999pct: e2e.p999_ms,
            aggregated_end_to_end_latency_9999pct: e2e.p9999_ms,
            aggregated_end_to_end_latency_max: e2e.max_ms,
            aggregated_publish_latency_quantiles: curve(LatencyKind::Publish),
            aggregated_publish_delay_latency_quantiles: curve(LatencyKind::PublishDelay),
            aggregated_end_to_end_latency_quantiles: curve(LatencyKind::EndToEnd),
            published_messages: counters.published_messages,
            acked_messages: counters.acked_messages,
            consumed_messages: counters.consumed_messages,
            errors: counters.errors,
            unsent_messages: counters.unsent_messages,
            intervals_dropped: recorder.intervals_dropped(),
            cpu: recorder.cpu(),
        }
    }
}

/// The console table: one row per histogram, latencies in ms.
pub fn render_latency_table(histograms: &LatencyHistograms) -> String {
    let mut out = format!(
        "{:<20} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
        "latency (ms)", "count", "avg", "p50", "p75", "p95", "p99", "p99.9", "p99.99", "max"
    );
    for kind in LatencyKind::ALL {
        let s: LatencySummary = histograms.summary(kind);
        let _ = writeln!(
            out,
            "{:<20} {:>10} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
            kind.slug(),
            s.count,
            s.avg_ms,
            s.p50_ms,
            s.p75_ms,
            s.p95_ms,
            s.p99_ms,
            s.p999_ms,
            s.p9999_ms,
            s.max_ms
        );
    }
    out
}

/// HdrHistogram's sub-bucket count for a precision (the field is private
/// in the crate): 2^ceil(log2(2 × 10^digits)).
fn sub_bucket_count(significant_value_digits: u8) -> u64 {
    let single_unit_resolution_max = 2 * 10u64.pow(u32::from(significant_value_digits));
    single_unit_resolution_max.next_power_of_two()
}

/// The `.hgrm` text, byte-compatible with Java's
/// `outputPercentileDistribution(out, ticks, scale)`: a header, one row per
/// percentile step (`Value Percentile TotalCount 1/(1-Percentile)`, the last
/// row at 100 % without the last column) and a `#[...]` footer.
pub fn render_hgrm(
    histogram: &Histogram<u64>,
    ticks_per_half_distance: u32,
    value_scale: f64,
) -> String {
    let digits = usize::from(SIGNIFICANT_VALUE_DIGITS);
    let mut out = format!(
        "{:>12} {:>14} {:>10} {:>14}\n\n",
        "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
    );
    let mut total_count: u64 = 0;
    for step in histogram.iter_quantiles(ticks_per_half_distance) {
        total_count += step.count_since_last_iteration();
        let value = step.value_iterated_to() as f64 / value_scale;
        let quantile = step.quantile_iterated_to();
        if quantile < 1.0 {
            let _ = writeln!(
                out,
                "{value:12.digits$} {quantile:2.12} {total_count:10} {:14.2}",
                1.0 / (1.0 - quantile)
            );
        } else {
            let _ = writeln!(out, "{value:12.digits$} {quantile:2.12} {total_count:10}");
        }
    }
    let (mean, stdev, max) = if histogram.is_empty() {
        (0.0, 0.0, 0.0)
    } else {
        (
            histogram.mean() / value_scale,
            histogram.stdev() / value_scale,
            histogram.max() as f64 / value_scale,
        )
    };
    let _ = writeln!(
        out,
        "#[Mean    = {mean:12.digits$}, StdDeviation   = {stdev:12.digits$}]"
    );
    let _ = writeln!(
        out,
        "#[Max     = {max:12.digits$}, Total count    = {:12}]",
        histogram.len()
    );
    let _ = writeln!(
        out,
        "#[Buckets = {:12}, SubBuckets     = {:12}]",
        histogram.buckets(),
        sub_bucket_count(SIGNIFICANT_VALUE_DIGITS)
    );
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::histograms::{Phase, WorkerStats};

    pub(crate) fn sample_workload() -> WorkloadParameters {
        WorkloadParameters {
            workload: "1m-500b".to_string(),
            driver: "ringlog".to_string(),
            topic: "bench".to_string(),
            topics: 1,
            partitions: 100,
            replication_factor: 3,
            message_size: 500,
            target_rate_msgs_per_s: 1_000,
            producers_per_topic: 2,
            consumers_per_topic: 2,
            subscriptions_per_topic: 1,
            consumer_group: None,
            duration_s: 3.0,
            warmup_s: 0.0,
            acks: "all".to_string(),
            batch_bytes: 65_536,
            linger_ms: 10,
            compression: "none".to_string(),
            keys: "none".to_string(),
            payload: "random".to_string(),
            seed: 7,
            loadgen_cpus: Vec::new(),
        }
    }

    /// Three one-second intervals of synthetic samples (no network).
    pub(crate) fn sample_recorder() -> RunRecorder {
        let mut recorder = RunRecorder::new(1);
        let mut workers = vec![WorkerStats::new(), WorkerStats::new()];
        for second in 1..=3u64 {
            for (index, worker) in workers.iter_mut().enumerate() {
                for message in 0..1_000u64 {
                    worker.record_send(500, message * 10);
                    worker.record_ack(1_000_000 + message * 1_000 * second + index as u64);
                    worker.record_consume(500, 5_000 + message, 1_000);
                }
            }
            recorder.record_interval(
                second * 1_000_000_000,
                1_000_000_000,
                &mut workers,
                Phase::Measure,
            );
        }
        recorder
    }

    // result.json carries OMB's field names with the right shapes.
    #[test]
    fn json_has_omb_field_names() {
        let result = TestResult::build(&sample_workload(), &sample_recorder());
        let value = serde_json::to_value(&result).unwrap();
        for array in [
            "publishRate",
            "consumeRate",
            "backlog",
            "publishLatency50pct",
            "publishLatency99pct",
            "publishLatency999pct",
            "publishLatencyMax",
        ] {
            assert_eq!(value[array].as_array().map(Vec::len), Some(3), "{array}");
        }
        for prefix in [
            "aggregatedPublishLatency",
            "aggregatedPublishDelayLatency",
            "aggregatedEndToEndLatency",
        ] {
            for suffix in [
                "Avg", "50pct", "75pct", "95pct", "99pct", "999pct", "9999pct", "Max",
            ] {
                let name = format!("{prefix}{suffix}");
                assert!(value[&name].is_f64(), "{name}");
            }
            let curve = value[format!("{prefix}Quantiles")].as_object().unwrap();
            assert!(curve.len() > 10, "{prefix}Quantiles");
            assert!(curve.contains_key("100"), "{prefix}Quantiles ends at 100");
        }
        assert_eq!(value["publishedMessages"], 6_000);
        assert_eq!(value["ackedMessages"], 6_000);
        assert_eq!(value["errors"], 0);
        assert_eq!(value["messageSize"], 500);
        assert_eq!(value["partitions"], 100);
        assert_eq!(value["workload"], "1m-500b");
        assert_eq!(value["latencyUnit"], "ms");
        assert_eq!(value["publishRate"][0], 2_000.0);
        // Publish latency is 1 ms plus up to 3 ms: the aggregate p50 sits in between.
        let p50 = value["aggregatedPublishLatency50pct"].as_f64().unwrap();
        assert!((1.0..4.0).contains(&p50), "{p50}");
    }

    // The CPU split is in result.json and report.html when read, null and
    // absent when `/proc` could not tell.
    #[test]
    fn cpu_use_is_reported_when_known() {
        let mut recorder = sample_recorder();
        let unknown =
            serde_json::to_value(TestResult::build(&sample_workload(), &recorder)).unwrap();
        assert!(unknown["cpu"].is_null());
        recorder.set_cpu(Some(CpuUse {
            loadgen_cores: 0.75,
            other_cores: 1.125,
            stolen_cores: 0.25,
            machine_cores: 2,
        }));
        let result = TestResult::build(&sample_workload(), &recorder);
        let value = serde_json::to_value(&result).unwrap();
        assert_eq!(value["cpu"]["loadgenCores"], 0.75);
        assert_eq!(value["cpu"]["otherCores"], 1.125);
        assert_eq!(value["cpu"]["stolenCores"], 0.25);
        assert_eq!(value["cpu"]["machineCores"], 2);
        let html = crate::report_html::render_html(&result);
        assert!(html.contains("load generator 0.75 cores"), "{html}");
        assert!(html.contains("everything else 1.12"), "{html}");
        assert!(html.contains("taken by the hypervisor 0.25"), "{html}");
    }

    // Quantile curves come out in increasing percentile order, values non-decreasing.
    #[test]
    fn quantile_curve_is_monotonic() {
        let recorder = sample_recorder();
        let curve = QuantileCurve::of(recorder.aggregate().get(LatencyKind::Publish), 100);
        assert!(curve
            .0
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
        assert_eq!(curve.0.last().unwrap().0, 100.0);
    }

    /// Parses .hgrm rows back: (value, percentile, total count, inverse).
    fn parse_hgrm_rows(text: &str) -> Vec<Vec<f64>> {
        text.lines()
            .skip(2)
            .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
            .map(|line| {
                line.split_whitespace()
                    .map(|f| f.parse().unwrap())
                    .collect()
            })
            .collect()
    }

    // The .hgrm text parses back: 4 columns (3 on the 100 % row), monotonic
    // percentiles, values and counts, and the footer's totals.
    #[test]
    fn hgrm_parses_back() {
        let recorder = sample_recorder();
        let histogram = recorder.aggregate().get(LatencyKind::Publish);
        let text = render_hgrm(histogram, 5, 1_000.0);
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
        assert_eq!(
            header,
            ["Value", "Percentile", "TotalCount", "1/(1-Percentile)"]
        );
        assert_eq!(lines.next(), Some(""));
        let rows = parse_hgrm_rows(&text);
        assert!(rows.len() > 20);
        let (last, body) = rows.split_last().unwrap();
        assert!(body.iter().all(|row| row.len() == 4));
        assert_eq!(last.len(), 3);
        assert_eq!(last[1], 1.0);
        assert_eq!(last[2], 6_000.0);
        for pair in rows.windows(2) {
            assert!(pair[0][0] <= pair[1][0], "values non-decreasing");
            assert!(pair[0][1] < pair[1][1], "percentiles increasing");
            assert!(pair[0][2] <= pair[1][2], "counts non-decreasing");
        }
        for row in body {
            assert!((row[3] - 1.0 / (1.0 - row[1])).abs() / row[3] < 0.01);
        }
        let footer: Vec<&str> = text.lines().filter(|l| l.starts_with("#[")).collect();
        assert_eq!(footer.len(), 3);
        assert!(footer[0].starts_with("#[Mean    = ") && footer[0].contains("StdDeviation   = "));
        assert!(footer[1].contains("Total count    =         6000]"));
        assert!(footer[2].contains("SubBuckets     =         2048]"));
        // Values are printed in ms with 3 decimals: the first is about 1 ms.
        assert!((rows[0][0] - 1.0).abs() < 0.01, "{}", rows[0][0]);
    }

    // An empty histogram still yields a well-formed file.
    #[test]
    fn hgrm_empty_histogram() {
        let text = render_hgrm(
            &LatencyHistograms::new().get(LatencyKind::EndToEnd).clone(),
            5,
            1_000.0,
        );
        assert!(parse_hgrm_rows(&text).is_empty());
        assert!(text.contains("Total count    =            0]"));
    }

    // The table lists the three histograms with all eight figures.
    #[test]
    fn table_lists_three_histograms() {
        let table = render_latency_table(sample_recorder().aggregate());
        assert_eq!(table.lines().count(), 4);
        for needle in [
            "publish-latency",
            "publish-delay",
            "end-to-end-latency",
            "p99.99",
            "max",
        ] {
            assert!(table.contains(needle), "{needle}");
        }
    }
}
