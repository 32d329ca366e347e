//! The only module that names glommio. Everything else in the broker reaches the
//! executor, direct-I/O files and task-level synchronisation through the types
//! here, so the runtime stays swappable and the rest stays testable.

pub mod file;
pub mod gate;
pub mod net;
pub mod nudge;
pub mod oneshot;
pub mod peer;
pub mod shards;
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

/// Runs `future` as a task of the current executor; awaiting the handle yields
/// its output. Dropping the handle detaches the task.
pub fn spawn<T: 'static>(future: impl Future<Output = T> + 'static) -> Task<T> {
    Task {
        inner: glommio::spawn_local(future),
    }
}

/// A spawned task's handle.
#[derive(Debug)]
pub struct Task<T> {
    inner: glommio::Task<T>,
}

impl<T> Task<T> {
    /// Lets the task run on without anyone awaiting it.
    pub fn detach(self) {
        self.inner.detach();
    }

    /// Stops the task at its next await point; its output, if it finished.
    pub async fn cancel(self) -> Option<T> {
        self.inner.cancel().await
    }
}

impl<T> Future for Task<T> {
    type Output = T;
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<T> {
        std::pin::Pin::new(&mut self.inner).poll(cx)
    }
}

/// Runs blocking `work` (a small file written and fsynced, a directory
/// removed) on the executor's blocking thread, so the shard keeps serving
/// while it waits on the disk.
pub async fn blocking<F, R>(work: F) -> R
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    glommio::executor().spawn_blocking(work).await
}

/// Sleeps on the current executor's timer.
pub async fn sleep(duration: Duration) {
    glommio::timer::sleep(duration).await;
}

/// Yields to other tasks on this executor, so long loops do not starve them.
pub async fn yield_now() {
    glommio::yield_if_needed().await;
}

/// Runs `future` until it completes or `timeout` passes; `None` on timeout.
pub async fn timeout<T>(timeout: Duration, future: impl Future<Output = T>) -> Option<T> {
    futures_lite::future::or(async { Some(future.await) }, async {
        glommio::timer::sleep(timeout).await;
        None
    })
    .await
}
