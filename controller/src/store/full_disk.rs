//! Waiting out a full disk. A storage write that failed for want of space
//! (ENOSPC, EDQUOT) left nothing behind (the log file is cut back to where it
//! was, a half-written replacement file is removed), so it is tried again
//! with backoff instead of being reported to openraft, which stops the Raft
//! node for good on any storage error. Metadata changes stall while the disk
//! is full and go on once it has room; nothing is lost or written twice. A
//! process that stops gives up the wait (`RoomWait::give_up`), so a full disk
//! never holds up a shutdown.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::store::StoreError;

/// First pause before a write refused for want of space is tried again;
/// doubled on each refusal up to `FULL_DISK_RETRY_MS_MAX`.
pub const FULL_DISK_RETRY_MS_MIN: u64 = 10;
pub const FULL_DISK_RETRY_MS_MAX: u64 = 1_000;
/// A full disk is warned about at once, then at most this often.
pub const FULL_DISK_WARN_INTERVAL_MS: u64 = 10_000;
/// How soon a waiting write notices that the process stops.
const GIVE_UP_CHECK_MS: u64 = 20;

/// Shared by a node's stores: set once the process stops, after which a
/// write refused for want of space fails instead of waiting.
#[derive(Clone, Debug, Default)]
pub struct RoomWait {
    given_up: Arc<AtomicBool>,
}

impl RoomWait {
    pub fn give_up(&self) {
        self.given_up.store(true, Ordering::Release);
    }

    fn given_up(&self) -> bool {
        self.given_up.load(Ordering::Acquire)
    }
}

/// Runs `attempt` until it succeeds or fails for another reason than a full
/// disk, or the wait is given up. `attempt` must leave nothing behind when it
/// fails for want of space.
pub(crate) async fn retry_while_full<T>(
    what: &str,
    room: &RoomWait,
    mut attempt: impl FnMut() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let mut delay_ms = FULL_DISK_RETRY_MS_MIN;
    let mut refusals: u64 = 0;
    let mut warned_at: Option<Instant> = None;
    loop {
        match attempt() {
            Err(error) if error.is_no_space() && !room.given_up() => {
                refusals += 1;
                let warn_due = warned_at.is_none_or(|at| {
                    at.elapsed() >= Duration::from_millis(FULL_DISK_WARN_INTERVAL_MS)
                });
                if warn_due {
                    tracing::warn!(
                        %error,
                        refusals,
                        "controller storage is full: the {what} waits for room and is tried again"
                    );
                    warned_at = Some(Instant::now());
                }
                let until = Instant::now() + Duration::from_millis(delay_ms);
                while Instant::now() < until && !room.given_up() {
                    let slice = until
                        .saturating_duration_since(Instant::now())
                        .min(Duration::from_millis(GIVE_UP_CHECK_MS));
                    tokio::time::sleep(slice).await;
                }
                delay_ms = (delay_ms * 2).min(FULL_DISK_RETRY_MS_MAX);
            }
            outcome => {
                if refusals > 0 && outcome.is_ok() {
                    tracing::info!(
                        refusals,
                        "controller storage has room again: the {what} is written"
                    );
                }
                return outcome;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::io;

    use super::*;

    fn run<T>(future: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(future)
    }

    fn failure(kind: io::ErrorKind) -> StoreError {
        StoreError::io("append", std::path::Path::new("raft-log.bin"))(io::Error::from(kind))
    }

    #[test]
    fn a_write_refused_for_space_is_tried_again_until_it_lands() {
        let attempts = Cell::new(0);
        let written = run(retry_while_full("log append", &RoomWait::default(), || {
            attempts.set(attempts.get() + 1);
            match attempts.get() {
                1 => Err(failure(io::ErrorKind::StorageFull)),
                2 => Err(failure(io::ErrorKind::QuotaExceeded)),
                _ => Ok(7),
            }
        }));
        assert_eq!(written.unwrap(), 7);
        assert_eq!(attempts.get(), 3);
    }

    #[test]
    fn any_other_failure_is_returned_at_once() {
        let attempts = Cell::new(0);
        let written: Result<(), StoreError> =
            run(retry_while_full("log append", &RoomWait::default(), || {
                attempts.set(attempts.get() + 1);
                Err(failure(io::ErrorKind::Other))
            }));
        assert!(matches!(written, Err(StoreError::Io { .. })));
        assert_eq!(attempts.get(), 1);
        assert!(!failure(io::ErrorKind::Other).is_no_space());
        assert!(!StoreError::Failed.is_no_space());
    }

    #[test]
    fn a_wait_given_up_returns_the_refusal() {
        let room = RoomWait::default();
        let attempts = Cell::new(0);
        let written: Result<(), StoreError> = run(retry_while_full("vote", &room, || {
            attempts.set(attempts.get() + 1);
            if attempts.get() == 2 {
                room.give_up();
            }
            Err(failure(io::ErrorKind::StorageFull))
        }));
        assert!(written.unwrap_err().is_no_space());
        assert_eq!(attempts.get(), 2);
    }
}
