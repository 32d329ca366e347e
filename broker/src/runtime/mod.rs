//! The only module that names glommio. Everything else in the broker reaches the
//! executor, direct-I/O files and task-level synchronisation through the types
//! here, so the runtime stays swappable and the rest stays testable: while a
//! simulation runs on the thread (`sim`), the same functions and files turn
//! to its deterministic executor and simulated disk.

pub mod file;
pub mod gate;
pub mod net;
pub mod nudge;
pub mod oneshot;
pub mod peer;
pub mod shards;
pub mod sim;
pub mod watermark;

pub use file::{AlignedBuffer, DirectFile, ReadBytes, SharedBuffer, DIRECT_IO_ALIGNMENT_BYTES};
pub use gate::SerialGate;
pub use oneshot::{oneshot, OneshotReceiver, OneshotSender};
pub use watermark::Watermark;

use std::future::Future;
use std::time::Duration;

/// io_uring registered-buffer memory per executor. glommio's default of 10 MiB
/// exceeds the usual 8 MiB memlock limit and then silently falls back to
/// unregistered buffers; 2 MiB stays inside it even with a few executors.
pub const IO_MEMORY_BYTES: usize = 2 << 20;

/// Runs `future` to completion on a fresh unpinned executor on this thread.
/// Used by tools and tests; the broker's shards use pinned executors.
pub fn run_local<T>(future: impl Future<Output = T>) -> T {
    let executor = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .io_memory(IO_MEMORY_BYTES)
        .make()
        .expect("an io_uring executor can be created (is io_uring enabled?)");
    executor.run(future)
}

/// Runs `future` as a task of the current executor, in the task queue of the
/// task that spawns it; awaiting the handle yields its output. Dropping the
/// handle cancels the task (at its next await point); `detach` lets it run on.
pub fn spawn<T: 'static>(future: impl Future<Output = T> + 'static) -> Task<T> {
    if sim::is_active() {
        return Task {
            inner: TaskInner::Sim(sim::spawn(future)),
        };
    }
    Task {
        inner: TaskInner::Glommio(glommio::spawn_local(future)),
    }
}

/// What a long-lived task does, for the scheduler. Each class has its own
/// glommio task queue and shares of the core; tasks a class's task spawns
/// stay in its queue. So flushes, retention and checkpoints cannot take the
/// time produce and fetch requests need, while replication keeps an equal
/// share with requests (acks=all waits on it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskClass {
    /// Client connections, their requests, and other shards' calls.
    Requests,
    /// Follower fetch loops and the controller links (sessions, metadata).
    Replication,
    /// Log maintenance, retention, checkpoints, the admin endpoint.
    Background,
    /// Log compaction: long passes that must never delay anything else.
    Cleaner,
}

impl TaskClass {
    const ALL: [TaskClass; 4] = [
        TaskClass::Requests,
        TaskClass::Replication,
        TaskClass::Background,
        TaskClass::Cleaner,
    ];

    /// Shares of the core when classes compete.
    pub fn shares(self) -> usize {
        match self {
            TaskClass::Requests => 1_000,
            TaskClass::Replication => 1_000,
            TaskClass::Background => 100,
            TaskClass::Cleaner => 25,
        }
    }

    /// How soon a runnable task of this class should preempt others.
    fn latency(self) -> glommio::Latency {
        match self {
            TaskClass::Requests => glommio::Latency::Matters(Duration::from_millis(1)),
            TaskClass::Replication => glommio::Latency::Matters(Duration::from_millis(5)),
            TaskClass::Background | TaskClass::Cleaner => glommio::Latency::NotImportant,
        }
    }

    fn name(self) -> &'static str {
        match self {
            TaskClass::Requests => "requests",
            TaskClass::Replication => "replication",
            TaskClass::Background => "background",
            TaskClass::Cleaner => "cleaner",
        }
    }
}

thread_local! {
    /// The task queues of the executor running on this thread, by its id
    /// (tests run several executors one after another on one thread).
    static TASK_QUEUES: std::cell::RefCell<Option<(usize, [glommio::TaskQueueHandle; 4])>> =
        const { std::cell::RefCell::new(None) };
}

fn task_queue(class: TaskClass) -> glommio::TaskQueueHandle {
    let executor = glommio::executor();
    let id = executor.id();
    TASK_QUEUES.with(|queues| {
        let mut queues = queues.borrow_mut();
        if queues.as_ref().is_none_or(|(owner, _)| *owner != id) {
            let handles = TaskClass::ALL.map(|c| {
                executor.create_task_queue(
                    glommio::Shares::Static(c.shares()),
                    c.latency(),
                    c.name(),
                )
            });
            *queues = Some((id, handles));
        }
        let (_, handles) = queues.as_ref().expect("created above");
        handles[TaskClass::ALL
            .iter()
            .position(|&c| c == class)
            .expect("listed")]
    })
}

/// Runs `future` as a task of the current executor in `class`'s task queue.
pub fn spawn_in<T: 'static>(
    class: TaskClass,
    future: impl Future<Output = T> + 'static,
) -> Task<T> {
    if sim::is_active() {
        // One queue: the simulation's seed, not shares, orders the tasks.
        return spawn(future);
    }
    Task {
        inner: TaskInner::Glommio(
            glommio::spawn_local_into(future, task_queue(class))
                .expect("the class's task queue belongs to this executor"),
        ),
    }
}

/// A spawned task's handle.
#[derive(Debug)]
pub struct Task<T> {
    inner: TaskInner<T>,
}

#[derive(Debug)]
enum TaskInner<T> {
    Glommio(glommio::Task<T>),
    Sim(sim::SimTask<T>),
}

impl<T> Task<T> {
    /// Lets the task run on without anyone awaiting it.
    pub fn detach(self) {
        match self.inner {
            TaskInner::Glommio(task) => {
                task.detach();
            }
            TaskInner::Sim(task) => task.detach(),
        }
    }

    /// Stops the task at its next await point; its output, if it finished.
    pub async fn cancel(self) -> Option<T> {
        match self.inner {
            TaskInner::Glommio(task) => task.cancel().await,
            TaskInner::Sim(task) => task.cancel(),
        }
    }
}

impl<T> Future for Task<T> {
    type Output = T;
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<T> {
        match &mut self.inner {
            TaskInner::Glommio(task) => std::pin::Pin::new(task).poll(cx),
            TaskInner::Sim(task) => std::pin::Pin::new(task).poll(cx),
        }
    }
}

/// Runs `future` as a task of its own and waits for it; if the caller stops
/// waiting (its task cancelled), the future still runs to its end. For work
/// that must not stop halfway, such as cutting a log's files and then its
/// in-memory state.
pub async fn run_to_end<T: 'static>(future: impl Future<Output = T> + 'static) -> T {
    let (done, result) = oneshot();
    spawn(async move { done.send(future.await) }).detach();
    result
        .await
        .expect("a detached task finishes while its executor runs")
}

/// Runs blocking `work` (a small file written and fsynced, a directory
/// removed) on the executor's blocking thread, so the shard keeps serving
/// while it waits on the disk.
pub async fn blocking<F, R>(work: F) -> R
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    if sim::is_active() {
        // Inline, so the simulation stays one thread and one order.
        sim::yield_now().await;
        return work();
    }
    glommio::executor().spawn_blocking(work).await
}

/// A random number: from the simulation's seed while one runs on the
/// thread (so a seed replays exactly), otherwise from the process's own
/// randomly keyed hasher.
pub fn random_u64() -> u64 {
    if sim::is_active() {
        return sim::random_below(u64::MAX);
    }
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(std::process::id())
}

/// Sleeps on the current executor's timer.
pub async fn sleep(duration: Duration) {
    if sim::is_active() {
        return sim::sleep(duration).await;
    }
    glommio::timer::sleep(duration).await;
}

/// Yields to other tasks on this executor, so long loops do not starve them.
pub async fn yield_now() {
    if sim::is_active() {
        return sim::yield_now().await;
    }
    glommio::yield_if_needed().await;
}

/// Runs `future` until it completes or `timeout` passes; `None` on timeout.
pub async fn timeout<T>(timeout: Duration, future: impl Future<Output = T>) -> Option<T> {
    futures_lite::future::or(async { Some(future.await) }, async {
        sleep(timeout).await;
        None
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_class_runs_in_its_queue_on_every_executor() {
        // Two executors one after the other on this thread: the second must
        // not use the first one's queues.
        for _ in 0..2 {
            let sum = run_local(async {
                let tasks: Vec<Task<usize>> = TaskClass::ALL
                    .iter()
                    .map(|&class| {
                        spawn_in(class, async move {
                            // A child stays in its parent's queue.
                            let queue = glommio::executor().current_task_queue();
                            let child = spawn(async { glommio::executor().current_task_queue() });
                            assert_eq!(child.await, queue);
                            assert_eq!(queue, task_queue(class));
                            class.shares()
                        })
                    })
                    .collect();
                let mut sum = 0;
                for task in tasks {
                    sum += task.await;
                }
                sum
            });
            assert_eq!(sum, 2_125);
        }
    }
}
