//! A task-level mutual exclusion for one executor: serialises operations on one
//! object (for example the writes and syncs of one log) across awaits. It is
//! not a thread lock: everything it guards lives on one core.
//!
//! The gate is handed over in arrival order. A task that releases it and asks
//! again at once queues behind the waiters, which is what makes group commit
//! work: the next holder's sync covers everything appended meanwhile.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

#[derive(Debug, Default)]
struct Slot {
    granted: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

#[derive(Debug, Default)]
pub struct SerialGate {
    held: Cell<bool>,
    waiters: RefCell<VecDeque<Rc<Slot>>>,
}

/// Holds the gate; dropping it hands the gate to the longest waiter.
#[derive(Debug)]
pub struct GateGuard<'a> {
    gate: &'a SerialGate,
}

impl SerialGate {
    pub fn new() -> SerialGate {
        SerialGate::default()
    }

    pub fn enter(&self) -> Enter<'_> {
        Enter {
            gate: self,
            slot: None,
            done: false,
        }
    }

    pub fn is_held(&self) -> bool {
        self.held.get()
    }

    fn release(&self) {
        assert!(self.held.get(), "gate released while not held");
        let next = self.waiters.borrow_mut().pop_front();
        match next {
            Some(slot) => {
                // Ownership passes directly: `held` stays true.
                slot.granted.set(true);
                if let Some(waker) = slot.waker.borrow_mut().take() {
                    waker.wake();
                }
            }
            None => self.held.set(false),
        }
    }
}

/// Future returned by [`SerialGate::enter`].
#[derive(Debug)]
pub struct Enter<'a> {
    gate: &'a SerialGate,
    slot: Option<Rc<Slot>>,
    done: bool,
}

impl<'a> Future for Enter<'a> {
    type Output = GateGuard<'a>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<GateGuard<'a>> {
        let gate = self.gate;
        match &self.slot {
            None if !gate.held.get() => {
                gate.held.set(true);
                self.done = true;
                Poll::Ready(GateGuard { gate })
            }
            None => {
                let slot = Rc::new(Slot::default());
                *slot.waker.borrow_mut() = Some(cx.waker().clone());
                gate.waiters.borrow_mut().push_back(slot.clone());
                self.slot = Some(slot);
                Poll::Pending
            }
            Some(slot) if slot.granted.get() => {
                self.done = true;
                Poll::Ready(GateGuard { gate })
            }
            Some(slot) => {
                *slot.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Drop for Enter<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Some(slot) = &self.slot {
            if slot.granted.get() {
                // Granted but abandoned: pass the gate on.
                self.gate.release();
            } else {
                self.gate
                    .waiters
                    .borrow_mut()
                    .retain(|s| !Rc::ptr_eq(s, slot));
            }
        }
    }
}

impl Drop for GateGuard<'_> {
    fn drop(&mut self) {
        self.gate.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{run_local, spawn};

    /// Waiters get the gate in arrival order, and a holder that asks again queues
    /// behind them.
    #[test]
    fn gate_is_handed_over_in_arrival_order() {
        run_local(async {
            let gate = Rc::new(SerialGate::new());
            let order = Rc::new(RefCell::new(Vec::new()));
            let first = gate.enter().await;
            let tasks: Vec<_> = (0..3)
                .map(|i| {
                    let (gate, order) = (gate.clone(), order.clone());
                    spawn(async move {
                        let _guard = gate.enter().await;
                        order.borrow_mut().push(i);
                    })
                })
                .collect();
            crate::runtime::yield_now().await;
            crate::runtime::sleep(std::time::Duration::from_millis(1)).await;
            drop(first);
            let again = gate.enter().await;
            order.borrow_mut().push(99);
            drop(again);
            for task in tasks {
                task.await;
            }
            assert_eq!(*order.borrow(), vec![0, 1, 2, 99]);
            assert!(!gate.is_held());
        });
    }

    /// A waiter that gives up (its future dropped) neither blocks nor loses the gate.
    #[test]
    fn abandoned_waiter_passes_the_gate_on() {
        run_local(async {
            let gate = SerialGate::new();
            let guard = gate.enter().await;
            let mut abandoned = Box::pin(gate.enter());
            assert!(abandoned
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()))
                .is_pending());
            drop(guard);
            drop(abandoned);
            assert!(!gate.is_held());
            let _again = gate.enter().await;
        });
    }
}
