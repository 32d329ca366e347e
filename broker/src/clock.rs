//! Wall-clock time behind a trait, so retention and segment-age decisions can be
//! driven by a test clock.

use std::cell::Cell;
use std::time::{SystemTime, UNIX_EPOCH};

pub trait Clock: std::fmt::Debug {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
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
}

/// A clock that moves only when told to.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_ms: Cell<i64>,
}

impl ManualClock {
    pub fn new(now_ms: i64) -> ManualClock {
        ManualClock {
            now_ms: Cell::new(now_ms),
        }
    }

    pub fn set(&self, now_ms: i64) {
        self.now_ms.set(now_ms);
    }

    pub fn advance(&self, delta_ms: i64) {
        self.now_ms.set(self.now_ms.get() + delta_ms);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now_ms.get()
    }
}
