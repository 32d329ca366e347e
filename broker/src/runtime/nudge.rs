//! Wakes every shard's executor at a fixed interval, so a shard never sleeps
//! through its timers and sockets for longer than that.
//!
//! glommio sleeps in `io_uring_enter` on its main ring, relying on a poll of
//! its latency ring to wake it when a timer fires or a socket is accepted.
//! On the kernels Ringlog runs on that wake-up is occasionally missed: a shard
//! then sits idle for tens of seconds with timers due and a request waiting
//! (seen as a 30 s request timeout in the three-broker tests; glommio issues
//! #326, #494 and #547 describe the same). A signal delivered to the shard
//! thread makes `io_uring_enter` return `EINTR`, the executor looks at its
//! rings again, and whatever was due runs. The handler itself does nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sys::pthread::{pthread_kill, pthread_self, Pthread};
use nix::sys::signal::Signal;

/// How often every shard thread is nudged: the longest a missed wake-up can
/// stall a shard. A nudge of an idle shard costs one loop of its executor.
pub const SHARD_NUDGE_MS: u64 = 10;

/// The signal used; its handler only sets a flag nobody reads.
const NUDGE_SIGNAL: Signal = Signal::SIGURG;

/// Shard threads registered for nudging, `None` once a shard has left (its
/// thread may be gone, and a thread id must never be signalled after that).
type Registry = Arc<Mutex<Vec<Option<Pthread>>>>;

/// The nudging thread; stops when dropped.
#[derive(Debug)]
pub struct Nudger {
    registry: Registry,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// A shard's registration: nudged while it lives, never after.
#[derive(Debug)]
pub struct NudgeGuard {
    registry: Registry,
    slot: usize,
}

impl Nudger {
    pub fn start(shard_count: usize) -> std::io::Result<Nudger> {
        signal_hook::flag::register(NUDGE_SIGNAL as i32, Arc::new(AtomicBool::new(false)))?;
        let registry: Registry = Arc::new(Mutex::new(vec![None; shard_count]));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (registry, stop) = (registry.clone(), stop.clone());
            std::thread::Builder::new()
                .name("shard-nudger".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(SHARD_NUDGE_MS));
                        let threads = registry.lock().expect("nudge registry");
                        for thread in threads.iter().flatten() {
                            // Fails only for a thread that already exited,
                            // which the registry rules out.
                            let _ = pthread_kill(*thread, NUDGE_SIGNAL);
                        }
                    }
                })?
        };
        Ok(Nudger {
            registry,
            stop,
            thread: Some(thread),
        })
    }

    /// Registers the calling thread as shard `slot`'s.
    pub fn register_current(registry: &Registry, slot: usize) -> NudgeGuard {
        registry.lock().expect("nudge registry")[slot] = Some(pthread_self());
        NudgeGuard {
            registry: registry.clone(),
            slot,
        }
    }

    pub fn registry(&self) -> Registry {
        self.registry.clone()
    }
}

impl Drop for NudgeGuard {
    fn drop(&mut self) {
        self.registry.lock().expect("nudge registry")[self.slot] = None;
    }
}

impl Drop for Nudger {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
