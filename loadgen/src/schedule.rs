//! The open-loop send schedule: every message gets an intended send time
//! from a uniform rate limiter, fixed before the run starts, so a slow
//! broker shows up as publish delay (actual − intended send time) instead of
//! silently lowering the offered load (coordinated omission). Pure: time
//! comes in through `Clock`; it never sleeps.
//!
//! Workers share one global sequence of slots, `start + k × 1e9 / rate` for
//! k = 0, 1, 2, …; worker w of W takes the slots k = i × W + w. Each worker
//! therefore runs at rate / W and the workers are staggered by one global
//! period, so the merged stream is uniform. Integer arithmetic on the slot
//! number means there is no drift over long runs.

use std::time::Instant;

use thiserror::Error;

/// Upper bound on the total offered rate.
pub const RATE_MSGS_PER_S_MAX: u64 = 1_000_000_000;
/// Upper bound on workers sharing one schedule.
pub const WORKERS_MAX: u32 = 4_096;

const NANOS_PER_S: u128 = 1_000_000_000;

/// Monotonic time in nanoseconds since an arbitrary origin.
pub trait Clock {
    fn now_ns(&self) -> u64;
}

/// The real clock: nanoseconds since the clock was created.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    pub fn new() -> MonotonicClock {
        MonotonicClock {
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        MonotonicClock::new()
    }
}

impl Clock for MonotonicClock {
    fn now_ns(&self) -> u64 {
        // u64 nanoseconds last 584 years.
        u64::try_from(self.origin.elapsed().as_nanos()).expect("clock overflow")
    }
}

/// A clock the test moves by hand.
#[derive(Debug, Default)]
pub struct FakeClock {
    now_ns: std::cell::Cell<u64>,
}

impl FakeClock {
    pub fn new(now_ns: u64) -> FakeClock {
        FakeClock {
            now_ns: std::cell::Cell::new(now_ns),
        }
    }

    pub fn advance_ns(&self, delta_ns: u64) {
        self.now_ns.set(self.now_ns.get() + delta_ns);
    }

    pub fn set_ns(&self, now_ns: u64) {
        assert!(
            now_ns >= self.now_ns.get(),
            "a monotonic clock never goes back"
        );
        self.now_ns.set(now_ns);
    }
}

impl Clock for FakeClock {
    fn now_ns(&self) -> u64 {
        self.now_ns.get()
    }
}

/// Why a schedule could not be built.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ScheduleError {
    #[error("worker count must be 1..={WORKERS_MAX}, got {0}")]
    WorkerCount(u32),
    #[error("worker index {index} out of range for {count} workers")]
    WorkerIndex { index: u32, count: u32 },
    #[error("rate must be at most {RATE_MSGS_PER_S_MAX} msg/s, got {0}")]
    Rate(u64),
}

/// One message's place in the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendSlot {
    /// Index of this message within its worker, from 0.
    pub message_index: u64,
    /// When it should be sent; `None` when running as fast as possible.
    pub intended_send_ns: Option<u64>,
}

impl SendSlot {
    /// How long the worker should still wait before sending (0 if late).
    pub fn wait_ns(&self, now_ns: u64) -> u64 {
        self.intended_send_ns
            .map_or(0, |intended_ns| intended_ns.saturating_sub(now_ns))
    }

    /// Publish delay: actual send time − intended send time. Zero when
    /// unscheduled, and never negative (a send is never issued early).
    pub fn publish_delay_ns(&self, actual_send_ns: u64) -> u64 {
        self.intended_send_ns
            .map_or(0, |intended_ns| actual_send_ns.saturating_sub(intended_ns))
    }
}

/// One worker's share of the open-loop schedule.
#[derive(Debug, Clone)]
pub struct WorkerSchedule {
    start_ns: u64,
    /// Total rate across all workers; 0 means as fast as possible.
    total_rate_msgs_per_s: u64,
    worker_index: u32,
    worker_count: u32,
    next_message_index: u64,
}

impl WorkerSchedule {
    /// `total_rate_msgs_per_s = 0` disables pacing (no intended times).
    pub fn new(
        start_ns: u64,
        total_rate_msgs_per_s: u64,
        worker_index: u32,
        worker_count: u32,
    ) -> Result<WorkerSchedule, ScheduleError> {
        if worker_count == 0 || worker_count > WORKERS_MAX {
            return Err(ScheduleError::WorkerCount(worker_count));
        }
        if worker_index >= worker_count {
            return Err(ScheduleError::WorkerIndex {
                index: worker_index,
                count: worker_count,
            });
        }
        if total_rate_msgs_per_s > RATE_MSGS_PER_S_MAX {
            return Err(ScheduleError::Rate(total_rate_msgs_per_s));
        }
        Ok(WorkerSchedule {
            start_ns,
            total_rate_msgs_per_s,
            worker_index,
            worker_count,
            next_message_index: 0,
        })
    }

    pub fn is_paced(&self) -> bool {
        self.total_rate_msgs_per_s > 0
    }

    /// This worker's share of the rate (may be fractional).
    pub fn worker_rate_msgs_per_s(&self) -> f64 {
        self.total_rate_msgs_per_s as f64 / f64::from(self.worker_count)
    }

    /// `start + (i × W + w) × 1e9 / rate`; `None` when unpaced.
    pub fn intended_send_ns(&self, message_index: u64) -> Option<u64> {
        if !self.is_paced() {
            return None;
        }
        let global_slot = u128::from(message_index) * u128::from(self.worker_count)
            + u128::from(self.worker_index);
        let offset_ns = global_slot * NANOS_PER_S / u128::from(self.total_rate_msgs_per_s);
        let intended_ns = u128::from(self.start_ns) + offset_ns;
        Some(u64::try_from(intended_ns).expect("schedule beyond u64 nanoseconds"))
    }

    /// Takes the next slot. The caller waits `slot.wait_ns(now)`, sends, and
    /// records `slot.publish_delay_ns(actual_send_ns)`.
    pub fn next_slot(&mut self) -> SendSlot {
        let message_index = self.next_message_index;
        self.next_message_index += 1;
        SendSlot {
            message_index,
            intended_send_ns: self.intended_send_ns(message_index),
        }
    }

    /// Slots taken so far.
    pub fn messages_scheduled(&self) -> u64 {
        self.next_message_index
    }

    /// Takes every slot due before `end_ns` that was not taken yet, for a
    /// run that ends with the generator behind; their intended times.
    pub fn take_slots_before(&mut self, end_ns: u64) -> Vec<u64> {
        let mut intended = Vec::new();
        while let Some(at) = self.intended_send_ns(self.next_message_index) {
            if at >= end_ns {
                break;
            }
            intended.push(at);
            self.next_message_index += 1;
        }
        intended
    }

    /// Whether the next slot is due at or after `end_ns` (the run is over
    /// for a paced worker). An unpaced worker never ends by schedule.
    pub fn next_slot_at_or_after(&self, end_ns: u64) -> bool {
        self.intended_send_ns(self.next_message_index)
            .is_some_and(|intended_ns| intended_ns >= end_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A worker behind at the end hands over exactly the slots due before it.
    #[test]
    fn slots_left_behind_are_those_due_before_the_end() {
        let mut schedule = WorkerSchedule::new(0, 1_000, 0, 1).unwrap();
        schedule.next_slot();
        schedule.next_slot();
        let left = schedule.take_slots_before(5_000_000);
        assert_eq!(left, vec![2_000_000, 3_000_000, 4_000_000]);
        assert!(schedule.next_slot_at_or_after(5_000_000));
        assert!(schedule.take_slots_before(5_000_000).is_empty());
        let mut unpaced = WorkerSchedule::new(0, 0, 0, 1).unwrap();
        assert!(unpaced.take_slots_before(u64::MAX).is_empty());
    }

    // Intended times follow start + i × 1e9 / rate for a single worker.
    #[test]
    fn single_worker_uniform() {
        let schedule = WorkerSchedule::new(1_000, 1_000, 0, 1).unwrap();
        assert_eq!(schedule.intended_send_ns(0), Some(1_000));
        assert_eq!(schedule.intended_send_ns(1), Some(1_001_000));
        assert_eq!(schedule.intended_send_ns(1_000), Some(1_000_001_000));
    }

    // Workers split the rate and interleave: the merged stream is uniform.
    #[test]
    fn workers_are_staggered_and_merge_uniformly() {
        let worker_count = 4;
        let mut merged: Vec<u64> = Vec::new();
        for worker in 0..worker_count {
            let schedule = WorkerSchedule::new(0, 1_000_000, worker, worker_count).unwrap();
            assert_eq!(schedule.worker_rate_msgs_per_s(), 250_000.0);
            assert_eq!(
                schedule.intended_send_ns(0),
                Some(u64::from(worker) * 1_000)
            );
            merged.extend((0..100).map(|i| schedule.intended_send_ns(i).unwrap()));
        }
        merged.sort_unstable();
        for (k, intended_ns) in merged.iter().enumerate() {
            assert_eq!(*intended_ns, k as u64 * 1_000);
        }
    }

    // A rate that does not divide 1e9 does not drift: slot k is floor(k × 1e9 / rate).
    #[test]
    fn no_drift_over_long_runs() {
        let schedule = WorkerSchedule::new(0, 3, 0, 1).unwrap();
        assert_eq!(
            schedule.intended_send_ns(3 * 86_400),
            Some(86_400 * 1_000_000_000)
        );
        assert_eq!(schedule.intended_send_ns(1), Some(333_333_333));
    }

    // With a fake clock: a sender that keeps up has zero delay; one stalled
    // for 10 ms accumulates delay on every queued message (coordinated
    // omission exposed), then catches up.
    #[test]
    fn publish_delay_with_fake_clock() {
        let clock = FakeClock::new(0);
        let mut schedule = WorkerSchedule::new(0, 1_000, 0, 1).unwrap(); // 1 ms period
        let mut delays_ns = Vec::new();
        for index in 0..20u64 {
            let slot = schedule.next_slot();
            clock.advance_ns(slot.wait_ns(clock.now_ns()));
            let send_ns = clock.now_ns();
            delays_ns.push(slot.publish_delay_ns(send_ns));
            // Each send costs 0.1 ms, except message 5 which stalls 10 ms.
            clock.advance_ns(if index == 5 { 10_000_000 } else { 100_000 });
        }
        assert!(delays_ns[..6].iter().all(|&delay_ns| delay_ns == 0));
        // Message 5 went out on time at 5 ms and stalled until 15 ms;
        // message 6, due at 6 ms, went out at 15 ms, message 7 at 15.1 ms.
        assert_eq!(delays_ns[6], 9_000_000);
        assert_eq!(delays_ns[7], 8_100_000);
        assert!(delays_ns.windows(2).skip(6).all(|w| w[1] <= w[0]));
        assert_eq!(*delays_ns.last().unwrap(), 0);
    }

    // Rate 0 means as fast as possible: no intended time, no wait, delay 0.
    #[test]
    fn unpaced_has_no_schedule() {
        let mut schedule = WorkerSchedule::new(0, 0, 0, 2).unwrap();
        let slot = schedule.next_slot();
        assert_eq!(slot.intended_send_ns, None);
        assert_eq!(slot.wait_ns(5), 0);
        assert_eq!(slot.publish_delay_ns(1_000_000), 0);
        assert!(!schedule.next_slot_at_or_after(0));
    }

    // The run ends when the next slot falls at or after the end time.
    #[test]
    fn end_of_run_by_schedule() {
        let mut schedule = WorkerSchedule::new(0, 10, 0, 1).unwrap();
        let mut sent = 0;
        while !schedule.next_slot_at_or_after(1_000_000_000) {
            schedule.next_slot();
            sent += 1;
        }
        assert_eq!(sent, 10);
        assert_eq!(schedule.messages_scheduled(), 10);
    }

    // Construction rejects impossible worker layouts and rates.
    #[test]
    fn rejects_bad_layouts() {
        assert_eq!(
            WorkerSchedule::new(0, 1, 0, 0).unwrap_err(),
            ScheduleError::WorkerCount(0)
        );
        assert!(WorkerSchedule::new(0, 1, 2, 2).is_err());
        assert!(WorkerSchedule::new(0, RATE_MSGS_PER_S_MAX + 1, 0, 1).is_err());
    }
}
