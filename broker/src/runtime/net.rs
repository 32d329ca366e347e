//! TCP for the shards: listeners (SO_REUSEPORT, so every shard can accept on the
//! broker's main port) and connections split into a read half and a write half
//! that two tasks of the same executor drive independently.

use std::cell::RefCell;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_lite::io::{AsyncRead, AsyncWrite};
use futures_lite::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug)]
pub struct Listener {
    inner: glommio::net::TcpListener,
}

impl Listener {
    pub fn bind(addr: SocketAddr) -> io::Result<Listener> {
        Ok(Listener {
            inner: glommio::net::TcpListener::bind(addr)?,
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.inner.local_addr()?)
    }

    /// Accepts connections for a loop that also watches for a stop: see
    /// `Acceptor`.
    pub fn acceptor(&self) -> Acceptor<'_> {
        Acceptor {
            listener: self,
            pending: None,
        }
    }

    pub async fn accept(&self) -> io::Result<(ReadHalf, WriteHalf, SocketAddr)> {
        let stream = self.inner.accept().await?;
        stream.set_nodelay(true)?;
        let peer = stream.peer_addr()?;
        let shared = Rc::new(RefCell::new(stream));
        Ok((
            ReadHalf {
                stream: shared.clone(),
            },
            WriteHalf { stream: shared },
            peer,
        ))
    }
}

type Accepted = io::Result<(ReadHalf, WriteHalf, SocketAddr)>;

/// Keeps one accept in flight across waits that time out. An accept is an
/// io_uring operation: dropping it may come after the kernel already handed
/// it a connection, whose socket then stays open with nobody reading it (a
/// client's requests on it are never answered). So a wait that times out
/// leaves the accept pending for the next wait instead of cancelling it.
pub struct Acceptor<'a> {
    listener: &'a Listener,
    pending: Option<Pin<Box<dyn std::future::Future<Output = Accepted> + 'a>>>,
}

impl std::fmt::Debug for Acceptor<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acceptor")
            .field("listener", &self.listener)
            .field("pending", &self.pending.is_some())
            .finish()
    }
}

impl Acceptor<'_> {
    /// The next connection, or `None` if none came within `wait`.
    pub async fn next_within(&mut self, wait: Duration) -> Option<Accepted> {
        let listener = self.listener;
        let pending = self
            .pending
            .get_or_insert_with(|| Box::pin(listener.accept()));
        let accepted = super::timeout(wait, pending.as_mut()).await;
        if accepted.is_some() {
            self.pending = None;
        }
        accepted
    }
}

/// Connects to `addr` within `timeout`.
pub async fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<(ReadHalf, WriteHalf)> {
    let stream = glommio::net::TcpStream::connect_timeout(addr, timeout).await?;
    stream.set_nodelay(true)?;
    let shared = Rc::new(RefCell::new(stream));
    Ok((
        ReadHalf {
            stream: shared.clone(),
        },
        WriteHalf { stream: shared },
    ))
}

/// The reading side of a connection.
#[derive(Debug)]
pub struct ReadHalf {
    stream: Rc<RefCell<glommio::net::TcpStream>>,
}

/// The writing side of a connection.
#[derive(Debug)]
pub struct WriteHalf {
    stream: Rc<RefCell<glommio::net::TcpStream>>,
}

impl AsyncRead for ReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        // The borrow lasts one poll; the two halves never hold it across an await.
        Pin::new(&mut *self.stream.borrow_mut()).poll_read(cx, buf)
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.stream.borrow_mut()).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.stream.borrow_mut()).poll_flush(cx)
    }
    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.stream.borrow_mut()).poll_close(cx)
    }
}

impl ReadHalf {
    /// Reads exactly `buf.len()` bytes, or fails with `TimedOut` after `timeout`.
    pub async fn read_exact_within(&mut self, buf: &mut [u8], timeout: Duration) -> io::Result<()> {
        let read = async { self.read_exact(buf).await };
        let expire = async {
            glommio::timer::sleep(timeout).await;
            Err(io::Error::new(io::ErrorKind::TimedOut, "read timed out"))
        };
        futures_lite::future::or(read, expire).await
    }
}

impl WriteHalf {
    pub async fn write_all_parts(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        for part in parts {
            self.write_all(part).await?;
        }
        Ok(())
    }

    pub async fn shutdown(&mut self) {
        let _ = self.close().await;
    }
}
