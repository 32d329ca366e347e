//! A latency histogram of fixed buckets, in the Prometheus histogram shape:
//! what the shard's request metrics and a partition log's disk timings
//! (`log::LogStats`) both count in, and how it is rendered.

use std::fmt::Write;
use std::time::Duration;

/// Upper bounds of the buckets, in microseconds. Fine at the low end, where
/// a direct write or an `fdatasync` lands on a fast disk (tens of µs), and
/// wide enough for a request that waited on a slow one.
pub const LATENCY_BUCKETS_US: [u64; 16] = [
    25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
    1_000_000, 10_000_000, 60_000_000,
];

/// Counts per bucket (each value in the first bucket whose bound is at least
/// it; beyond the last bound only in `count`), their number and their sum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyHistogram {
    buckets: [u64; LATENCY_BUCKETS_US.len()],
    count: u64,
    sum_us: u64,
}

impl LatencyHistogram {
    pub fn record(&mut self, elapsed: Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.count += 1;
        self.sum_us = self.sum_us.saturating_add(us);
        if let Some(i) = LATENCY_BUCKETS_US.iter().position(|b| us <= *b) {
            self.buckets[i] += 1;
        }
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// Values at most `bound_us`, which must be one of the bounds.
    pub fn count_at_most(&self, bound_us: u64) -> u64 {
        let last = LATENCY_BUCKETS_US
            .iter()
            .position(|b| *b == bound_us)
            .expect("a bucket bound");
        self.buckets[..=last].iter().sum()
    }

    /// Appends `name_bucket`, `name_sum` and `name_count` lines, in seconds,
    /// with `labels` (already formatted, `key="value",...`) on each.
    pub fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (bound, n) in LATENCY_BUCKETS_US.iter().zip(self.buckets) {
            cumulative += n;
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels},le=\"{}\"}} {cumulative}",
                *bound as f64 / 1e6
            );
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum_us as f64 / 1e6);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

impl std::ops::AddAssign for LatencyHistogram {
    fn add_assign(&mut self, other: LatencyHistogram) {
        for (mine, theirs) in self.buckets.iter_mut().zip(other.buckets) {
            *mine += theirs;
        }
        self.count += other.count;
        self.sum_us = self.sum_us.saturating_add(other.sum_us);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_land_in_the_first_bucket_that_holds_them_and_render_cumulatively() {
        let mut h = LatencyHistogram::default();
        h.record(Duration::from_micros(25));
        h.record(Duration::from_micros(26));
        h.record(Duration::from_micros(1_000));
        h.record(Duration::from_secs(120));
        assert_eq!(h.count(), 4);
        assert_eq!(h.count_at_most(25), 1);
        assert_eq!(h.count_at_most(50), 2);
        assert_eq!(h.count_at_most(1_000), 3);
        assert_eq!(h.count_at_most(60_000_000), 3);
        let mut out = String::new();
        h.render(&mut out, "x_seconds", "shard=\"0\"");
        assert!(out.contains("x_seconds_bucket{shard=\"0\",le=\"0.000025\"} 1\n"));
        assert!(out.contains("x_seconds_bucket{shard=\"0\",le=\"0.00005\"} 2\n"));
        assert!(out.contains("x_seconds_bucket{shard=\"0\",le=\"0.001\"} 3\n"));
        assert!(out.contains("x_seconds_bucket{shard=\"0\",le=\"+Inf\"} 4\n"));
        assert!(out.contains("x_seconds_count{shard=\"0\"} 4\n"));
        assert!(out.contains("x_seconds_sum{shard=\"0\"} 120.001051\n"));
    }

    #[test]
    fn sums_add_bucket_by_bucket() {
        let (mut a, mut b) = (LatencyHistogram::default(), LatencyHistogram::default());
        a.record(Duration::from_micros(40));
        b.record(Duration::from_micros(40));
        b.record(Duration::from_millis(3));
        a += b;
        assert_eq!(a.count(), 3);
        assert_eq!(a.count_at_most(50), 2);
        assert_eq!(a.count_at_most(5_000), 3);
    }
}
