//! A monotonic value on one executor that tasks can wait on: "wake me when the
//! durable offset reaches N". Moving it backwards is a bug.
//!
//! Each waiting future owns one slot in the waiter list for its whole life and
//! only refreshes the waker in it when polled again, so a future polled many
//! times (inside a select or a timeout) never piles up waker clones, and a
//! dropped future leaves the list.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

#[derive(Debug)]
struct Slot {
    target: i64,
    waker: RefCell<Option<Waker>>,
}

#[derive(Debug, Default)]
pub struct Watermark {
    value: Cell<i64>,
    waiters: RefCell<Vec<Rc<Slot>>>,
}

impl Watermark {
    pub fn new(value: i64) -> Watermark {
        Watermark {
            value: Cell::new(value),
            waiters: RefCell::new(Vec::new()),
        }
    }

    pub fn get(&self) -> i64 {
        self.value.get()
    }

    /// Raises the value and wakes the waiters it satisfies.
    pub fn advance(&self, value: i64) {
        assert!(value >= self.value.get(), "watermark moved backwards");
        self.value.set(value);
        let ready: Vec<Waker> = {
            let mut waiters = self.waiters.borrow_mut();
            let mut ready = Vec::new();
            waiters.retain(|slot| {
                if slot.target <= value {
                    ready.extend(slot.waker.borrow_mut().take());
                    false
                } else {
                    true
                }
            });
            ready
        };
        for waker in ready {
            waker.wake();
        }
    }

    /// Lowers the value: only for a log truncated below it, never on a hot path.
    pub fn reset(&self, value: i64) {
        self.value.set(value);
    }

    /// Moves the value to `value`, up (waking waiters) or down: for a value
    /// that is allowed to go back, such as a follower's high watermark.
    pub fn set(&self, value: i64) {
        if value >= self.value.get() {
            self.advance(value);
        } else {
            self.reset(value);
        }
    }

    /// Futures currently waiting (for tests and assertions).
    pub fn waiter_count(&self) -> usize {
        self.waiters.borrow().len()
    }

    pub fn wait_at_least(&self, target: i64) -> WaitAtLeast<'_> {
        WaitAtLeast {
            mark: self,
            target,
            slot: None,
        }
    }
}

/// Future returned by [`Watermark::wait_at_least`].
#[derive(Debug)]
pub struct WaitAtLeast<'a> {
    mark: &'a Watermark,
    target: i64,
    slot: Option<Rc<Slot>>,
}

impl Future for WaitAtLeast<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.mark.value.get() >= self.target {
            self.unregister();
            return Poll::Ready(());
        }
        match &self.slot {
            Some(slot) => {
                let mut waker = slot.waker.borrow_mut();
                if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    *waker = Some(cx.waker().clone());
                }
                if slot.target > self.mark.value.get()
                    && !self
                        .mark
                        .waiters
                        .borrow()
                        .iter()
                        .any(|s| Rc::ptr_eq(s, slot))
                {
                    // Woken by an advance that did not reach the target yet: register again.
                    self.mark.waiters.borrow_mut().push(slot.clone());
                }
            }
            None => {
                let slot = Rc::new(Slot {
                    target: self.target,
                    waker: RefCell::new(Some(cx.waker().clone())),
                });
                self.mark.waiters.borrow_mut().push(slot.clone());
                self.slot = Some(slot);
            }
        }
        Poll::Pending
    }
}

impl WaitAtLeast<'_> {
    fn unregister(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.mark
                .waiters
                .borrow_mut()
                .retain(|s| !Rc::ptr_eq(s, &slot));
        }
    }
}

impl Drop for WaitAtLeast<'_> {
    fn drop(&mut self) {
        self.unregister();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polling a waiting future many times keeps one registration; dropping it
    /// removes it; an advance wakes only the waiters it satisfies.
    #[test]
    fn repeated_polls_do_not_accumulate_waiters() {
        let mark = Watermark::new(0);
        let mut waiting = Box::pin(mark.wait_at_least(5));
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..100_000 {
            assert!(waiting.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(mark.waiter_count(), 1);
        mark.advance(3);
        assert!(waiting.as_mut().poll(&mut cx).is_pending());
        assert_eq!(mark.waiter_count(), 1, "still waiting for 5");
        mark.advance(5);
        assert!(waiting.as_mut().poll(&mut cx).is_ready());
        assert_eq!(mark.waiter_count(), 0);
        let dropped = Box::pin(mark.wait_at_least(9));
        let mut dropped = dropped;
        assert!(dropped.as_mut().poll(&mut cx).is_pending());
        drop(dropped);
        assert_eq!(mark.waiter_count(), 0, "a dropped waiter leaves the list");
    }
}
