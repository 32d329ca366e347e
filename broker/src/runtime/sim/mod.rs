//! The runtime's deterministic stand-in for glommio. While a simulation runs on
//! a thread, the runtime's functions (spawn, sleep, timeout, yield, blocking
//! work) and its direct-I/O files turn here: one thread polls every task on
//! simulated time, picks among ready tasks in an order a seed decides, and
//! files become plain files whose writes since their last sync a simulated
//! power loss undoes or tears. So the log's async code, and above it anything
//! built only on the runtime, runs unchanged under a seeded simulation, where
//! a hang is a stall the executor reports and a waker pile-up an assertion.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use crate::clock::Clock;

mod disk;
pub mod net;

pub use disk::{directory_synced, PowerLoss, SimDisk, SimFile};

type LocalFuture = Pin<Box<dyn Future<Output = ()>>>;

/// Live clones of one task's waker beyond which the executor calls it a pile-up:
/// glommio's task reference count is 16 bits, and a future that adds a waker per
/// poll overflows it long before anything else notices.
pub const WAKER_CLONES_MAX: usize = 4_096;

/// Wall-clock time one poll may take before the watchdog calls it a spin: a
/// task looping without ever awaiting anything pending never returns to the
/// executor, so no simulated deadline can catch it (on a shard it would
/// freeze the core the same way).
pub const POLL_WALL_MS_MAX: u64 = 20_000;

/// How a simulation is driven.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub seed: u64,
    /// Names the run in the watchdog's message (the seed to replay).
    pub label: String,
    /// Wall-clock milliseconds at simulated time zero.
    pub start_wall_ms: i64,
    /// Each file read, write and sync takes up to this long, drawn per call.
    pub io_latency_us_max: u64,
    /// Each network write and connect takes up to this long, drawn per call.
    pub net_latency_us_max: u64,
}

impl SimConfig {
    pub fn new(seed: u64) -> SimConfig {
        SimConfig {
            seed,
            label: format!("seed {seed}"),
            start_wall_ms: 1_700_000_000_000,
            io_latency_us_max: 500,
            net_latency_us_max: 200,
        }
    }
}

/// Why a simulation ended before its future finished.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimStop {
    /// Nothing can run and no timer is pending: every task waits for
    /// something that will never happen.
    #[error("stalled at {now_ms} ms: {tasks} tasks wait and nothing can wake them")]
    Stalled { now_ms: u64, tasks: usize },
    /// Simulated time reached the run's limit (a crash point or a deadline).
    #[error("simulated time reached {now_ms} ms with {tasks} tasks still running")]
    TimeUp { now_ms: u64, tasks: usize },
}

struct ReadyQueue(Mutex<Vec<usize>>);

struct TaskWaker {
    id: usize,
    queue: Arc<ReadyQueue>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.queue.0.lock().expect("one thread").push(self.id);
    }
}

struct TaskSlot {
    future: Option<LocalFuture>,
    waker: Arc<TaskWaker>,
    /// The simulated process the task belongs to (`spawn_process`): the
    /// group of the task that spawned it, so a kill takes all of them.
    process: u32,
    /// Cancelled while being polled: dropped once the poll returns.
    cancelled: bool,
}

struct Executor {
    /// Polls finished so far, for the watchdog thread.
    polls: Arc<std::sync::atomic::AtomicU64>,
    tasks: RefCell<BTreeMap<usize, TaskSlot>>,
    next_id: Cell<usize>,
    queue: Arc<ReadyQueue>,
    ready: RefCell<Vec<usize>>,
    /// The process of the task being polled (0 outside any).
    polling_process: Cell<u32>,
    /// Processes stopped (`pause_process`), and their tasks woken meanwhile.
    paused: RefCell<std::collections::BTreeSet<u32>>,
    parked: RefCell<Vec<usize>>,
    /// Processes whose disk is slow (`set_disk_latency`): the extra
    /// microseconds each of their file operations takes.
    disk_latency_extra_us: RefCell<BTreeMap<u32, u64>>,
    tearing_down: Cell<bool>,
    now_ns: Cell<u64>,
    timers: RefCell<BTreeMap<(u64, u64), Waker>>,
    timer_seq: Cell<u64>,
    rng: Cell<u64>,
    config: SimConfig,
    disk: SimDisk,
    net: net::SimNet,
}

thread_local! {
    static CURRENT: RefCell<Option<Rc<Executor>>> = const { RefCell::new(None) };
}

fn current() -> Rc<Executor> {
    CURRENT.with(|c| {
        c.borrow()
            .clone()
            .expect("called inside a simulation (runtime::sim::run)")
    })
}

/// Whether a simulation is running on this thread.
pub fn is_active() -> bool {
    CURRENT.with(|c| c.borrow().is_some())
}

/// Simulated time since the simulation started.
pub fn now() -> Duration {
    Duration::from_nanos(current().now_ns.get())
}

/// A number from the simulation's seeded generator, below `bound`.
pub fn random_below(bound: u64) -> u64 {
    current().random_below(bound)
}

impl Executor {
    fn random_below(&self, bound: u64) -> u64 {
        // xorshift64*: small, fast, and the same on every machine.
        let mut x = self.rng.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        if bound == 0 {
            0
        } else {
            x.wrapping_mul(0x2545_f491_4f6c_dd1d) % bound
        }
    }

    fn spawn(&self, future: LocalFuture) -> usize {
        self.spawn_in_process(self.polling_process.get(), future)
    }

    fn spawn_in_process(&self, process: u32, future: LocalFuture) -> usize {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        let waker = Arc::new(TaskWaker {
            id,
            queue: self.queue.clone(),
        });
        self.tasks.borrow_mut().insert(
            id,
            TaskSlot {
                future: Some(future),
                waker,
                process,
                cancelled: false,
            },
        );
        self.ready.borrow_mut().push(id);
        id
    }

    fn cancel(&self, id: usize) {
        let removed = {
            let mut tasks = self.tasks.borrow_mut();
            match tasks.get_mut(&id) {
                Some(slot) if slot.future.is_none() => {
                    // Being polled right now: dropped when the poll returns.
                    slot.cancelled = true;
                    None
                }
                Some(_) => tasks.remove(&id),
                None => None,
            }
        };
        // Dropped outside the borrow (a future's drop may cancel other
        // tasks), as its own process: what the drop spawns belongs to it.
        if let Some(slot) = removed {
            let caller = self.polling_process.replace(slot.process);
            drop(slot);
            self.polling_process.set(caller);
        }
    }

    fn take_woken(&self) {
        let woken: Vec<usize> = std::mem::take(&mut *self.queue.0.lock().expect("one thread"));
        let mut ready = self.ready.borrow_mut();
        for id in woken {
            if !ready.contains(&id) {
                ready.push(id);
            }
        }
    }

    /// Polls one ready task; false when none is ready.
    fn step(&self) -> bool {
        self.take_woken();
        let id = {
            let mut ready = self.ready.borrow_mut();
            if ready.is_empty() {
                return false;
            }
            let index = self.random_below(ready.len() as u64) as usize;
            ready.swap_remove(index)
        };
        let paused = {
            let tasks = self.tasks.borrow();
            tasks
                .get(&id)
                .is_some_and(|slot| self.paused.borrow().contains(&slot.process))
        };
        if paused {
            // Stopped, as by SIGSTOP: it runs once its process resumes.
            self.parked.borrow_mut().push(id);
            return true;
        }
        let taken = {
            let mut tasks = self.tasks.borrow_mut();
            tasks.get_mut(&id).and_then(|slot| {
                slot.future
                    .take()
                    .map(|f| (f, slot.waker.clone(), slot.process))
            })
        };
        let Some((mut future, task_waker, process)) = taken else {
            return true; // finished or cancelled since it was woken
        };
        let waker = Waker::from(task_waker.clone());
        self.polling_process.set(process);
        let done = future
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_ready();
        drop(waker);
        self.polls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Our own handles: the slot's, the clone taken above.
        let clones = Arc::strong_count(&task_waker).saturating_sub(2);
        assert!(
            clones <= WAKER_CLONES_MAX,
            "waker pile-up: task {id} has {clones} live waker clones after a poll"
        );
        {
            let mut tasks = self.tasks.borrow_mut();
            let slot = tasks.get_mut(&id).expect("a polled task keeps its slot");
            if !done && !slot.cancelled {
                slot.future = Some(future);
                self.polling_process.set(0);
                return true;
            }
            tasks.remove(&id);
        }
        // Dropped outside the borrow (its drop may touch other tasks), still
        // as its own process.
        drop(future);
        self.polling_process.set(0);
        true
    }

    /// Moves time to the earliest timer and wakes everything due then.
    fn advance(&self) -> bool {
        let first = self.timers.borrow().keys().next().copied();
        let Some((due, _)) = first else {
            return false;
        };
        if due > self.now_ns.get() {
            self.now_ns.set(due);
        }
        loop {
            let next = {
                let mut timers = self.timers.borrow_mut();
                match timers.first_key_value() {
                    Some((&(at, seq), _)) if at <= self.now_ns.get() => timers.remove(&(at, seq)),
                    _ => None,
                }
            };
            match next {
                Some(waker) => waker.wake(),
                None => return true,
            }
        }
    }
}

/// Runs `future` on a fresh simulated executor over `disk` until it finishes,
/// until nothing can run (`Stalled`), or until simulated time reaches
/// `until` (`TimeUp`). Every task still alive when it returns is dropped, as
/// a killed process's would be; the disk keeps what was written.
pub fn run<T: 'static>(
    config: &SimConfig,
    disk: &SimDisk,
    until: Option<Duration>,
    future: impl Future<Output = T> + 'static,
) -> Result<T, SimStop> {
    assert!(!is_active(), "one simulation per thread at a time");
    let polls = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let watchdog = Watchdog::start(polls.clone(), config.label.clone());
    let executor = Rc::new(Executor {
        polls,
        tasks: RefCell::new(BTreeMap::new()),
        next_id: Cell::new(0),
        queue: Arc::new(ReadyQueue(Mutex::new(Vec::new()))),
        ready: RefCell::new(Vec::new()),
        polling_process: Cell::new(0),
        paused: RefCell::new(std::collections::BTreeSet::new()),
        parked: RefCell::new(Vec::new()),
        disk_latency_extra_us: RefCell::new(BTreeMap::new()),
        tearing_down: Cell::new(false),
        now_ns: Cell::new(0),
        timers: RefCell::new(BTreeMap::new()),
        timer_seq: Cell::new(0),
        rng: Cell::new(config.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1),
        config: config.clone(),
        disk: disk.clone(),
        net: net::SimNet::default(),
    });
    CURRENT.with(|c| *c.borrow_mut() = Some(executor.clone()));
    // Dropped last, so the thread leaves the simulation even when a task's
    // drop panics during the teardown.
    let _leave = LeaveSimulation;
    // Also on a panic (an assertion of the code under test, or the
    // executor's own), so the tasks' drops still find their executor.
    let _teardown = Teardown {
        executor: executor.clone(),
        _watchdog: watchdog,
    };
    let output: Rc<RefCell<Option<T>>> = Rc::default();
    let slot = output.clone();
    executor.spawn(Box::pin(async move {
        let value = future.await;
        *slot.borrow_mut() = Some(value);
    }));
    let limit_ns = until.map(|u| u.as_nanos() as u64);
    loop {
        if let Some(value) = output.borrow_mut().take() {
            break Ok(value);
        }
        if executor.step() {
            continue;
        }
        let next_due = executor.timers.borrow().keys().next().map(|(at, _)| *at);
        let tasks = executor.tasks.borrow().len();
        match (next_due, limit_ns) {
            (Some(due), Some(limit)) if due > limit => {
                executor.now_ns.set(limit);
                break Err(SimStop::TimeUp {
                    now_ms: limit / 1_000_000,
                    tasks,
                });
            }
            (Some(_), _) => {
                executor.advance();
            }
            (None, _) => {
                break Err(SimStop::Stalled {
                    now_ms: executor.now_ns.get() / 1_000_000,
                    tasks,
                });
            }
        }
    }
}

/// Ends a run like a killed process: every task dropped (in id order, so the
/// same seed drops them the same way), timers forgotten, then the thread
/// leaves the simulation.
struct Teardown {
    executor: Rc<Executor>,
    _watchdog: Watchdog,
}

impl Drop for Teardown {
    fn drop(&mut self) {
        self.executor.tearing_down.set(true);
        loop {
            let first = self.executor.tasks.borrow().keys().next().copied();
            match first {
                Some(id) => {
                    let slot = self.executor.tasks.borrow_mut().remove(&id);
                    drop(slot);
                }
                None => break,
            }
        }
        self.executor.timers.borrow_mut().clear();
    }
}

struct LeaveSimulation;

impl Drop for LeaveSimulation {
    fn drop(&mut self) {
        CURRENT.with(|c| *c.borrow_mut() = None);
    }
}

/// Whether the run is being torn down (its tasks dropped as by a kill):
/// nothing dropped then may start new work.
pub(crate) fn is_tearing_down() -> bool {
    CURRENT.with(|c| c.borrow().as_ref().is_some_and(|e| e.tearing_down.get()))
}

/// Aborts the process, naming the seed, when one poll runs longer than
/// `POLL_WALL_MS_MAX`.
struct Watchdog {
    stop: Arc<(Mutex<bool>, std::sync::Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn start(polls: Arc<std::sync::atomic::AtomicU64>, label: String) -> Watchdog {
        let stop = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let seen = stop.clone();
        let thread = std::thread::spawn(move || {
            let (lock, wake) = &*seen;
            let mut last = polls.load(std::sync::atomic::Ordering::Relaxed);
            let mut still_ms = 0;
            let mut stopped = lock.lock().expect("watchdog lock");
            while !*stopped {
                let (guard, _) = wake
                    .wait_timeout(stopped, Duration::from_millis(250))
                    .expect("watchdog lock");
                stopped = guard;
                let now = polls.load(std::sync::atomic::Ordering::Relaxed);
                if now != last {
                    (last, still_ms) = (now, 0);
                    continue;
                }
                still_ms += 250;
                if still_ms >= POLL_WALL_MS_MAX && !*stopped {
                    eprintln!(
                        "runtime::sim: {label}: one poll has run for {} s without returning: a task spins without ever awaiting anything pending",
                        still_ms / 1_000
                    );
                    std::process::abort();
                }
            }
        });
        Watchdog {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let (lock, wake) = &*self.stop;
        *lock.lock().expect("watchdog lock") = true;
        wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A spawned simulated task. Dropping it cancels the task, as glommio's does.
pub struct SimTask<T> {
    id: usize,
    join: Rc<RefCell<Join<T>>>,
    detached: bool,
}

struct Join<T> {
    output: Option<T>,
    finished: bool,
    waiter: Option<Waker>,
}

impl<T> std::fmt::Debug for SimTask<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimTask").field("id", &self.id).finish()
    }
}

pub(crate) fn spawn<T: 'static>(future: impl Future<Output = T> + 'static) -> SimTask<T> {
    spawn_with(future, |executor, task| executor.spawn(task))
}

/// Starts a simulated process: `future` and every task it spawns belong to
/// `process` (not 0), which `kill_process` ends at once, as kill -9 ends a
/// process's threads. Several processes (brokers) then share one simulation.
pub fn spawn_process<T: 'static>(
    process: u32,
    future: impl Future<Output = T> + 'static,
) -> SimTask<T> {
    assert_ne!(process, 0, "process 0 is the simulation itself");
    spawn_with(future, |executor, task| {
        executor.spawn_in_process(process, task)
    })
}

/// Drops every task of `process` (in id order), with whatever it holds:
/// files, listeners, connections (their peers see them close). Returns how
/// many tasks it ended. Never called from a task of that process.
pub fn kill_process(process: u32) -> usize {
    assert_ne!(process, 0, "process 0 is the simulation itself");
    let executor = current();
    assert_ne!(
        executor.polling_process.get(),
        process,
        "a process does not kill itself"
    );
    let ids: Vec<usize> = executor
        .tasks
        .borrow()
        .iter()
        .filter(|(_, slot)| slot.process == process)
        .map(|(&id, _)| id)
        .collect();
    for &id in &ids {
        executor.cancel(id);
    }
    executor.paused.borrow_mut().remove(&process);
    executor.parked.borrow_mut().retain(|id| !ids.contains(id));
    ids.len()
}

/// Stops every task of `process` from running, as SIGSTOP does: its timers
/// and sockets go on receiving, but nothing of it runs until
/// `resume_process`.
pub fn pause_process(process: u32) {
    assert_ne!(process, 0, "process 0 is the simulation itself");
    current().paused.borrow_mut().insert(process);
}

/// Lets a paused process run again: everything of it woken meanwhile is
/// ready at once.
pub fn resume_process(process: u32) {
    let executor = current();
    executor.paused.borrow_mut().remove(&process);
    let parked = std::mem::take(&mut *executor.parked.borrow_mut());
    let owner = |id: &usize| executor.tasks.borrow().get(id).map(|slot| slot.process);
    // Tasks gone since they were parked (finished, cancelled) are forgotten.
    let (mine, others): (Vec<usize>, Vec<usize>) = parked
        .into_iter()
        .filter(|id| owner(id).is_some())
        .partition(|id| owner(id) == Some(process));
    *executor.parked.borrow_mut() = others;
    let mut ready = executor.ready.borrow_mut();
    for id in mine {
        if !ready.contains(&id) {
            ready.push(id);
        }
    }
}

/// Runs `future` in the simulation itself (process 0), whoever spawns it:
/// for the network's deliveries, which outlive the process that wrote.
pub(crate) fn spawn_detached_in_simulation(future: impl Future<Output = ()> + 'static) {
    current().spawn_in_process(0, Box::pin(future));
}

fn spawn_with<T: 'static>(
    future: impl Future<Output = T> + 'static,
    start: impl FnOnce(&Executor, LocalFuture) -> usize,
) -> SimTask<T> {
    let join = Rc::new(RefCell::new(Join {
        output: None,
        finished: false,
        waiter: None,
    }));
    let slot = join.clone();
    let executor = current();
    let id = start(
        &executor,
        Box::pin(async move {
            let value = future.await;
            let waiter = {
                let mut join = slot.borrow_mut();
                join.output = Some(value);
                join.finished = true;
                join.waiter.take()
            };
            if let Some(waiter) = waiter {
                waiter.wake();
            }
        }),
    );
    SimTask {
        id,
        join,
        detached: false,
    }
}

impl<T> SimTask<T> {
    pub fn detach(mut self) {
        self.detached = true;
    }

    pub fn cancel(mut self) -> Option<T> {
        self.detached = true;
        current().cancel(self.id);
        self.join.borrow_mut().output.take()
    }
}

impl<T> Drop for SimTask<T> {
    fn drop(&mut self) {
        if !self.detached {
            if let Some(executor) = CURRENT.with(|c| c.borrow().clone()) {
                executor.cancel(self.id);
            }
        }
    }
}

impl<T> Future for SimTask<T> {
    type Output = T;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let mut join = self.join.borrow_mut();
        if let Some(value) = join.output.take() {
            return Poll::Ready(value);
        }
        assert!(!join.finished, "a task's output is taken once");
        match &mut join.waiter {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            waiter => *waiter = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

/// Simulated sleep: due at a point of simulated time.
pub(crate) struct Sleep {
    due_ns: u64,
    key: Option<(u64, u64)>,
}

pub(crate) fn sleep(duration: Duration) -> Sleep {
    Sleep {
        due_ns: current().now_ns.get() + duration.as_nanos() as u64,
        key: None,
    }
}

impl Future for Sleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let executor = current();
        if executor.now_ns.get() >= self.due_ns {
            if let Some(key) = self.key.take() {
                executor.timers.borrow_mut().remove(&key);
            }
            return Poll::Ready(());
        }
        let key = match self.key {
            Some(key) => key,
            None => {
                let seq = executor.timer_seq.get();
                executor.timer_seq.set(seq + 1);
                (self.due_ns, seq)
            }
        };
        self.key = Some(key);
        executor.timers.borrow_mut().insert(key, cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            if let Some(executor) = CURRENT.with(|c| c.borrow().clone()) {
                executor.timers.borrow_mut().remove(&key);
            }
        }
    }
}

/// Gives every other ready task a chance to run first.
pub(crate) async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}

/// Makes every direct-I/O file operation of `process` (open, read, write,
/// sync, truncate; not the blocking `std::fs` work) take `extra_us` longer,
/// as a disk that turned slow or a device queue that filled up; 0 makes it
/// normal again.
pub fn set_disk_latency(process: u32, extra_us: u64) {
    let executor = current();
    let mut slow = executor.disk_latency_extra_us.borrow_mut();
    if extra_us == 0 {
        slow.remove(&process);
    } else {
        slow.insert(process, extra_us);
    }
}

/// Waits a drawn I/O latency, plus the polling process's extra one.
async fn io_delay() {
    let executor = current();
    let max_ns = executor.config.io_latency_us_max * 1_000;
    let extra_ns = executor
        .disk_latency_extra_us
        .borrow()
        .get(&executor.polling_process.get())
        .map_or(0, |us| us * 1_000);
    let ns = executor.random_below(max_ns + 1) + extra_ns;
    drop(executor);
    if ns > 0 {
        sleep(Duration::from_nanos(ns)).await;
    } else {
        yield_now().await;
    }
}

/// The simulation's clock: wall time starts at the configuration's
/// `start_wall_ms` and may be jumped; monotonic time is simulated time.
#[derive(Debug, Default)]
pub struct SimClock {
    wall_offset_ms: Cell<i64>,
}

impl SimClock {
    pub fn new() -> SimClock {
        SimClock::default()
    }

    /// Moves the wall clock by `delta_ms` (either way); monotonic time stays.
    pub fn jump(&self, delta_ms: i64) {
        self.wall_offset_ms
            .set(self.wall_offset_ms.get() + delta_ms);
    }
}

impl Clock for SimClock {
    fn now_ms(&self) -> i64 {
        let executor = current();
        executor.config.start_wall_ms
            + (executor.now_ns.get() / 1_000_000) as i64
            + self.wall_offset_ms.get()
    }

    fn monotonic(&self) -> Duration {
        now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_runs_the_same_way() {
        let trace = |seed| {
            let log = Rc::new(RefCell::new(Vec::new()));
            let out = log.clone();
            run(&SimConfig::new(seed), &SimDisk::new(), None, async move {
                let tasks: Vec<_> = (0..8)
                    .map(|i| {
                        let log = log.clone();
                        spawn(async move {
                            for step in 0..3 {
                                log.borrow_mut().push((i, step, now()));
                                sleep(Duration::from_micros(random_below(100))).await;
                            }
                        })
                    })
                    .collect();
                for task in tasks {
                    task.await;
                }
            })
            .unwrap();
            Rc::try_unwrap(out).unwrap().into_inner()
        };
        assert_eq!(trace(7), trace(7));
        assert_ne!(trace(7), trace(8));
    }

    #[test]
    fn a_killed_process_loses_every_task_it_spawned_and_no_other() {
        let ticks = Rc::new(RefCell::new(BTreeMap::<u32, u32>::new()));
        let seen = ticks.clone();
        run(&SimConfig::new(3), &SimDisk::new(), None, async move {
            for process in [1u32, 2] {
                let ticks = ticks.clone();
                spawn_process(process, async move {
                    // A child of the process's root: killed with it.
                    spawn(async move {
                        loop {
                            *ticks.borrow_mut().entry(process).or_default() += 1;
                            sleep(Duration::from_millis(10)).await;
                        }
                    })
                    .detach();
                    std::future::pending::<()>().await;
                })
                .detach();
            }
            sleep(Duration::from_millis(100)).await;
            assert_eq!(kill_process(1), 2, "the root and its child");
            sleep(Duration::from_millis(100)).await;
        })
        .unwrap();
        let ticks = seen.borrow();
        assert!((9..=11).contains(&ticks[&1]), "{ticks:?}");
        assert!((19..=21).contains(&ticks[&2]), "{ticks:?}");
    }

    #[test]
    fn a_paused_process_runs_nothing_until_it_resumes() {
        let ticks = Rc::new(Cell::new(0u32));
        let seen = ticks.clone();
        run(&SimConfig::new(4), &SimDisk::new(), None, async move {
            let counter = ticks.clone();
            spawn_process(1, async move {
                loop {
                    counter.set(counter.get() + 1);
                    sleep(Duration::from_millis(10)).await;
                }
            })
            .detach();
            sleep(Duration::from_millis(55)).await;
            pause_process(1);
            let before = ticks.get();
            sleep(Duration::from_millis(200)).await;
            assert_eq!(ticks.get(), before, "nothing ran while paused");
            resume_process(1);
            sleep(Duration::from_millis(55)).await;
            assert!(ticks.get() > before, "it runs again");
        })
        .unwrap();
        assert!(seen.get() >= 12);
    }

    #[test]
    fn a_task_waiting_for_nothing_is_a_stall() {
        let stop = run(&SimConfig::new(1), &SimDisk::new(), None, async {
            std::future::pending::<()>().await;
        })
        .unwrap_err();
        assert!(
            matches!(stop, SimStop::Stalled { tasks: 1, .. }),
            "{stop:?}"
        );
    }

    #[test]
    fn time_runs_out_at_the_limit() {
        let stop = run(
            &SimConfig::new(1),
            &SimDisk::new(),
            Some(Duration::from_secs(2)),
            async {
                loop {
                    sleep(Duration::from_millis(300)).await;
                }
            },
        )
        .unwrap_err();
        assert_eq!(
            stop,
            SimStop::TimeUp {
                now_ms: 2_000,
                tasks: 1
            }
        );
    }

    #[test]
    fn a_waker_clone_per_poll_is_a_pile_up() {
        let caught = std::panic::catch_unwind(|| {
            run(&SimConfig::new(1), &SimDisk::new(), None, async {
                // Keeps every waker it is polled with, as the waiter list of
                // the old watermark did.
                let mut kept = Vec::new();
                std::future::poll_fn(|cx| {
                    kept.push(cx.waker().clone());
                    cx.waker().wake_by_ref();
                    Poll::Pending::<()>
                })
                .await;
            })
        });
        let message = caught.expect_err("the pile-up is caught");
        let text = message
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(text.contains("waker pile-up"), "{text}");
        assert!(!is_active(), "a panicking run leaves the thread");
        // The next run on this thread starts clean.
        let value = run(&SimConfig::new(2), &SimDisk::new(), None, async { 5 }).unwrap();
        assert_eq!(value, 5);
    }
}
