//! A monotonic value on one executor that tasks can wait on: "wake me when the
//! durable offset reaches N". Moving it backwards is a bug.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

#[derive(Debug, Default)]
pub struct Watermark {
    value: Cell<i64>,
    waiters: RefCell<Vec<(i64, Waker)>>,
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
            let (ready, pending): (Vec<_>, Vec<_>) =
                waiters.drain(..).partition(|(at, _)| *at <= value);
            *waiters = pending;
            ready.into_iter().map(|(_, w)| w).collect()
        };
        for waker in ready {
            waker.wake();
        }
    }

    /// Lowers the value: only for a log truncated below it, never on a hot path.
    pub fn reset(&self, value: i64) {
        self.value.set(value);
    }

    pub fn wait_at_least(&self, target: i64) -> WaitAtLeast<'_> {
        WaitAtLeast { mark: self, target }
    }
}

/// Future returned by [`Watermark::wait_at_least`].
#[derive(Debug)]
pub struct WaitAtLeast<'a> {
    mark: &'a Watermark,
    target: i64,
}

impl Future for WaitAtLeast<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.mark.value.get() >= self.target {
            return Poll::Ready(());
        }
        self.mark
            .waiters
            .borrow_mut()
            .push((self.target, cx.waker().clone()));
        Poll::Pending
    }
}
