//! `--scenario max-rate`: the search for the highest offered rate a cluster
//! sustains, as OpenMessaging Benchmark's max-rate mode looks for it. Each
//! step is a whole open-loop run at one rate; a step holds when the run
//! sent and acknowledged what it offered, without errors, and the publish delay (how
//! late the generator sent against the schedule, which grows as soon as the
//! producers' buffers fill) stayed bounded. The rate doubles while steps
//! hold, then the gap between the highest held and the lowest failed rate is
//! halved until it is narrow. A rate fails only when two steps at it fail,
//! so one hiccup of the host does not end the climb. This module decides;
//! `main` runs the steps.

use serde::Serialize;

/// A step holds only if its publish delay p99 stays within this. A cluster
/// that keeps up sends on schedule, its delay near the generator's own
/// millisecond of pacing plus the host's hiccups (a slow `fdatasync` stalls
/// a shard for tens of ms on a small virtual machine); one that does not
/// fills the producers' buffers, and the delay climbs to seconds within a
/// step.
pub const STEP_PUBLISH_DELAY_P99_MS_MAX: f64 = 100.0;
/// ... and it sent at least this share of the rate it offered over the
/// measured window (a generator whose buffers are full stops sending), all
/// of it acknowledged by the end of the run.
pub const STEP_ACKED_FRACTION_MIN: f64 = 0.99;
/// Steps a search runs at most, repeats included.
pub const STEPS_MAX: u32 = 16;
/// The highest rate a search offers.
pub const STEP_RATE_MSGS_PER_S_MAX: u64 = 8_000_000;
/// The search stops once the gap between held and failed is this narrow,
/// relative to the held rate.
const RESOLUTION_FRACTION: f64 = 0.05;

/// What one step measured.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StepResult {
    pub rate_msgs_per_s: u64,
    pub sent_msgs_per_s: f64,
    pub publish_p99_ms: f64,
    pub publish_delay_p99_ms: f64,
    pub errors: u64,
    pub held: bool,
}

impl StepResult {
    /// Judges a step by the bounds above.
    pub fn judge(
        rate_msgs_per_s: u64,
        sent_msgs_per_s: f64,
        publish_p99_ms: f64,
        publish_delay_p99_ms: f64,
        errors: u64,
    ) -> StepResult {
        let held = errors == 0
            && sent_msgs_per_s >= rate_msgs_per_s as f64 * STEP_ACKED_FRACTION_MIN
            && publish_delay_p99_ms <= STEP_PUBLISH_DELAY_P99_MS_MAX;
        StepResult {
            rate_msgs_per_s,
            sent_msgs_per_s,
            publish_p99_ms,
            publish_delay_p99_ms,
            errors,
            held,
        }
    }
}

/// The search's state: the highest rate that held, the lowest that failed.
#[derive(Debug, Clone)]
pub struct Search {
    start_msgs_per_s: u64,
    rate_msgs_per_s_max: u64,
    held_max: Option<u64>,
    failed_min: Option<u64>,
    /// A rate whose first step failed, to be run once more.
    repeat: Option<u64>,
    steps: Vec<StepResult>,
}

impl Search {
    /// Starts at `start_msgs_per_s` and never offers more than
    /// `rate_msgs_per_s_max`.
    pub fn new(start_msgs_per_s: u64, rate_msgs_per_s_max: u64) -> Search {
        assert!(start_msgs_per_s > 0 && start_msgs_per_s <= rate_msgs_per_s_max);
        Search {
            start_msgs_per_s,
            rate_msgs_per_s_max,
            held_max: None,
            failed_min: None,
            repeat: None,
            steps: Vec::new(),
        }
    }

    /// The rate of the next step, or `None` when the search is over.
    pub fn next_rate(&self) -> Option<u64> {
        if self.steps.len() as u32 >= STEPS_MAX {
            return None;
        }
        self.next_rate_unbounded()
    }

    /// Whether `STEPS_MAX` ended the search before the gap was narrow: its
    /// result is then only a lower bound.
    pub fn truncated(&self) -> bool {
        self.next_rate().is_none() && self.next_rate_unbounded().is_some()
    }

    fn next_rate_unbounded(&self) -> Option<u64> {
        if let Some(rate) = self.repeat {
            return Some(rate);
        }
        let rate = match (self.held_max, self.failed_min) {
            (None, None) => self.start_msgs_per_s,
            (Some(held), None) => {
                if held >= self.rate_msgs_per_s_max {
                    return None;
                }
                held.saturating_mul(2).min(self.rate_msgs_per_s_max)
            }
            (held, Some(failed)) => {
                let held = held.unwrap_or(0);
                let gap = failed.saturating_sub(held);
                if gap as f64 <= held as f64 * RESOLUTION_FRACTION || gap <= 1 {
                    return None;
                }
                held + gap / 2
            }
        };
        Some(rate)
    }

    pub fn record(&mut self, step: StepResult) {
        let rate = step.rate_msgs_per_s;
        let repeated = self.repeat.take() == Some(rate);
        if !step.held && !repeated {
            self.repeat = Some(rate);
        } else if step.held {
            assert!(
                self.failed_min.is_none_or(|f| rate < f),
                "a held rate above a failed one is not searched"
            );
            self.held_max = Some(self.held_max.map_or(rate, |h| h.max(rate)));
        } else {
            self.failed_min = Some(self.failed_min.map_or(rate, |f| f.min(rate)));
        }
        self.steps.push(step);
    }

    /// The highest rate that held, if any did.
    pub fn best(&self) -> Option<u64> {
        self.held_max
    }

    pub fn steps(&self) -> &[StepResult] {
        &self.steps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(rate: u64, held: bool) -> StepResult {
        StepResult {
            rate_msgs_per_s: rate,
            sent_msgs_per_s: rate as f64,
            publish_p99_ms: 1.0,
            publish_delay_p99_ms: 1.0,
            errors: 0,
            held,
        }
    }

    /// A cluster that holds up to `capacity`: the search ends within the
    /// resolution below it and never reports a rate that failed.
    fn search_against(capacity: u64, start: u64, rate_max: u64) -> Search {
        let mut search = Search::new(start, rate_max);
        while let Some(rate) = search.next_rate() {
            search.record(step(rate, rate <= capacity));
        }
        search
    }

    #[test]
    fn one_failed_step_is_run_again_and_a_held_repeat_counts() {
        let mut search = Search::new(100_000, 8_000_000);
        search.record(step(100_000, true));
        assert_eq!(search.next_rate(), Some(200_000));
        // A hiccup at 200k: the same rate once more, which holds.
        search.record(step(200_000, false));
        assert_eq!(search.next_rate(), Some(200_000));
        search.record(step(200_000, true));
        assert_eq!(search.best(), Some(200_000));
        assert_eq!(search.next_rate(), Some(400_000));
        // Twice failed: failed.
        search.record(step(400_000, false));
        assert_eq!(search.next_rate(), Some(400_000));
        search.record(step(400_000, false));
        assert_eq!(search.next_rate(), Some(300_000));
    }

    #[test]
    fn doubles_then_bisects_to_within_the_resolution() {
        for capacity in [150_000, 999_999, 1_000_000, 1_234_567, 1_900_000] {
            let search = search_against(capacity, 100_000, 8_000_000);
            let best = search.best().expect("the start held");
            assert!(best <= capacity, "{best} above the capacity {capacity}");
            assert!(
                (capacity - best) as f64 <= best as f64 * RESOLUTION_FRACTION,
                "{best} too far below {capacity} after {:?}",
                search.steps()
            );
            assert!(search.steps().len() as u32 <= STEPS_MAX);
            assert!(!search.truncated(), "{capacity}: {:?}", search.steps());
        }
    }

    #[test]
    fn a_failed_start_searches_below_it() {
        let search = search_against(30_000, 100_000, 8_000_000);
        let best = search.best().expect("a rate below the start held");
        assert!((28_000..=30_000).contains(&best), "{best}");
    }

    #[test]
    fn stops_at_the_ceiling() {
        let search = search_against(10_000_000, 100_000, 1_000_000);
        assert_eq!(search.best(), Some(1_000_000));
        assert!(search
            .steps()
            .iter()
            .all(|s| s.rate_msgs_per_s <= 1_000_000));
    }

    #[test]
    fn nothing_holds() {
        let search = search_against(0, 100_000, 1_000_000);
        assert_eq!(search.best(), None);
        assert_eq!(search.steps().len() as u32, STEPS_MAX);
        assert!(search.truncated());
    }

    #[test]
    fn a_climb_cut_short_by_the_step_bound_says_so() {
        // From 1 msg/s, doubling alone takes more steps than allowed.
        let search = search_against(1_000_000, 1, STEP_RATE_MSGS_PER_S_MAX);
        assert!(search.truncated());
        assert!(search.best().is_some_and(|b| b < 1_000_000));
    }

    #[test]
    fn judging_needs_rate_delay_and_no_errors() {
        assert!(StepResult::judge(100_000, 99_500.0, 3.0, 2.0, 0).held);
        assert!(!StepResult::judge(100_000, 98_000.0, 3.0, 2.0, 0).held);
        assert!(!StepResult::judge(100_000, 100_000.0, 3.0, 101.0, 0).held);
        assert!(!StepResult::judge(100_000, 100_000.0, 3.0, 2.0, 1).held);
    }
}
