//! The once-per-second progress line, as a pure function of an interval
//! summary: what an operator watches during a run. It never reads clocks
//! or prints; the driver does.

use crate::histograms::IntervalSummary;
use crate::units::format_thousands;

/// One line, for example:
/// `[   12.0s] pub 1,000,000 msg/s 500.0 MB/s | cons 999,800 msg/s | backlog 1,234 | pub lat ms p50 1.20 p99 3.40 p99.9 8.00 max 12.30 | pub delay p99 0.050 ms | errors 0`
pub fn format_progress_line(interval: &IntervalSummary, warmup: bool) -> String {
    let p = &interval.publish_latency;
    format!(
        "[{elapsed:>8.1}s]{phase} pub {pub_rate} msg/s {pub_mb:.1} MB/s | cons {cons_rate} msg/s | backlog {backlog} | pub lat ms p50 {p50:.2} p99 {p99:.2} p99.9 {p999:.2} max {max:.2} | pub delay p99 {delay:.3} ms | errors {errors}",
        elapsed = interval.elapsed_s,
        phase = if warmup { " warmup" } else { "" },
        pub_rate = format_thousands(interval.publish_rate_msgs_per_s.round() as u64),
        pub_mb = interval.publish_rate_bytes_per_s / 1e6,
        cons_rate = format_thousands(interval.consume_rate_msgs_per_s.round() as u64),
        backlog = format_thousands(interval.backlog_messages),
        p50 = p.p50_ms,
        p99 = p.p99_ms,
        p999 = p.p999_ms,
        max = p.max_ms,
        delay = interval.publish_delay.p99_ms,
        errors = format_thousands(interval.errors_total),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::histograms::LatencySummary;

    fn interval() -> IntervalSummary {
        IntervalSummary {
            elapsed_s: 12.0,
            duration_s: 1.0,
            publish_rate_msgs_per_s: 1_000_000.4,
            publish_rate_bytes_per_s: 500_000_200.0,
            consume_rate_msgs_per_s: 999_800.0,
            consume_rate_bytes_per_s: 499_900_000.0,
            error_rate_per_s: 0.0,
            backlog_messages: 1_234,
            errors_total: 3,
            publish_latency: LatencySummary {
                count: 1_000_000,
                avg_ms: 1.5,
                p50_ms: 1.2,
                p75_ms: 1.6,
                p95_ms: 2.5,
                p99_ms: 3.4,
                p999_ms: 8.0,
                p9999_ms: 11.0,
                max_ms: 12.3,
            },
            publish_delay: LatencySummary {
                p99_ms: 0.05,
                ..LatencySummary::default()
            },
            end_to_end_latency: LatencySummary::default(),
        }
    }

    // Every field the operator needs is on the line, with its unit.
    #[test]
    fn line_has_all_figures() {
        let line = format_progress_line(&interval(), false);
        assert_eq!(
            line,
            "[    12.0s] pub 1,000,000 msg/s 500.0 MB/s | cons 999,800 msg/s | backlog 1,234 | pub lat ms p50 1.20 p99 3.40 p99.9 8.00 max 12.30 | pub delay p99 0.050 ms | errors 3"
        );
        assert!(!line.contains('\n'));
    }

    // Warmup intervals are marked so they are not mistaken for measurements.
    #[test]
    fn warmup_is_marked() {
        assert!(format_progress_line(&interval(), true).starts_with("[    12.0s] warmup pub "));
    }
}
