//! A task-level mutual exclusion for one executor: serialises operations on one
//! object (for example the writes and truncations of one log) across awaits.
//! It is not a thread lock: everything it guards lives on one core.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

#[derive(Debug, Default)]
pub struct SerialGate {
    held: Cell<bool>,
    waiters: RefCell<VecDeque<Waker>>,
}

/// Holds the gate; releasing it wakes the next waiter.
#[derive(Debug)]
pub struct GateGuard<'a> {
    gate: &'a SerialGate,
}

impl SerialGate {
    pub fn new() -> SerialGate {
        SerialGate::default()
    }

    pub fn enter(&self) -> Enter<'_> {
        Enter { gate: self }
    }

    pub fn is_held(&self) -> bool {
        self.held.get()
    }
}

/// Future returned by [`SerialGate::enter`].
#[derive(Debug)]
pub struct Enter<'a> {
    gate: &'a SerialGate,
}

impl<'a> Future for Enter<'a> {
    type Output = GateGuard<'a>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<GateGuard<'a>> {
        if !self.gate.held.get() {
            self.gate.held.set(true);
            return Poll::Ready(GateGuard { gate: self.gate });
        }
        self.gate.waiters.borrow_mut().push_back(cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for GateGuard<'_> {
    fn drop(&mut self) {
        assert!(self.gate.held.get(), "gate released twice");
        self.gate.held.set(false);
        // Wake everyone: a waiter that was dropped would otherwise swallow the turn.
        let waiters: Vec<Waker> = self.gate.waiters.borrow_mut().drain(..).collect();
        for waker in waiters {
            waker.wake();
        }
    }
}
