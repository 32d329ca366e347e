//! Time behind a trait: wall-clock time for retention, segment age and record
//! timestamps, and a monotonic clock for deadlines and intervals, so tests and
//! a simulation can drive both. This module and `runtime` are the only places
//! that read the system's clocks (`tests/clock_boundary.rs` checks it).

use std::cell::Cell;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub trait Clock: std::fmt::Debug {
    /// Milliseconds since the Unix epoch. May jump either way.
    fn now_ms(&self) -> i64;

    /// Time since an arbitrary origin that never goes back: for deadlines,
    /// timeouts and intervals.
    fn monotonic(&self) -> Duration;
}

#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }

    fn monotonic(&self) -> Duration {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        ORIGIN.get_or_init(Instant::now).elapsed()
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_ms: Cell<i64>,
    monotonic: Cell<Duration>,
}

impl ManualClock {
    pub fn new(now_ms: i64) -> ManualClock {
        ManualClock {
            now_ms: Cell::new(now_ms),
            monotonic: Cell::new(Duration::ZERO),
        }
    }

    /// Sets the wall clock, which may go back; the monotonic clock stays.
    pub fn set(&self, now_ms: i64) {
        self.now_ms.set(now_ms);
    }

    /// Moves both clocks; the monotonic one only forwards.
    pub fn advance(&self, delta_ms: i64) {
        self.now_ms.set(self.now_ms.get() + delta_ms);
        if let Ok(forward) = u64::try_from(delta_ms) {
            self.monotonic
                .set(self.monotonic.get() + Duration::from_millis(forward));
        }
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now_ms.get()
    }

    fn monotonic(&self) -> Duration {
        self.monotonic.get()
    }
}
