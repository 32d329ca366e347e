//! TCP for the shards: listeners and connections split into a read half and
//! a write half that two tasks of the same executor drive independently.
//! Listeners set SO_REUSEPORT, so every shard can accept on the broker's main
//! port, and SO_REUSEADDR, so a restart binds at once. While a
//! simulation runs on the thread, the same types are the simulated network's
//! (`sim::net`), so connections, their framing and their timeouts run
//! unchanged under a seed.

use std::cell::RefCell;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_lite::io::{AsyncRead, AsyncWrite};
use futures_lite::{AsyncReadExt, AsyncWriteExt};

use super::sim;
use super::sim::net::{SimListener, SimReadHalf, SimWriteHalf};

/// Connections a listener's kernel queue holds before the shard accepts
/// them (glommio's own bind uses the same).
pub const ACCEPT_BACKLOG_CONNECTIONS_MAX: i32 = 1024;

/// Binds and listens with SO_REUSEPORT, so every shard can listen on the
/// broker's main port, and SO_REUSEADDR, without which a restart cannot bind
/// for a minute when the port's last listener set it (tokio's and Java's
/// do) and its connections are in TIME-WAIT.
fn bind_listening(addr: SocketAddr) -> io::Result<glommio::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    use std::os::fd::{FromRawFd, IntoRawFd};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.bind(&addr.into())?;
    socket.listen(ACCEPT_BACKLOG_CONNECTIONS_MAX)?;
    // glommio takes a listening socket only as a raw descriptor.
    // SAFETY: `into_raw_fd` gives up the only owner of a bound, listening TCP
    // socket, so the listener becomes its sole owner and closes it once.
    #[allow(unsafe_code)]
    let listener = unsafe { glommio::net::TcpListener::from_raw_fd(socket.into_raw_fd()) };
    Ok(listener)
}

/// Fails when a process listens on `addr` already. The shards' SO_REUSEPORT
/// would let a second broker started on the same port join the first's
/// listeners and take half its connections; this check at start refuses
/// it, as a plain bind would. A listener found is looked for again for up
/// to `LISTENER_GONE_WAIT_MS_MAX`: the listening socket of a process just
/// killed outlives it while the kernel cancels what its io_uring rings
/// still had in flight on it (an accept).
pub fn refuse_if_listened(addr: SocketAddr) -> io::Result<()> {
    let mut target = addr;
    if target.ip().is_unspecified() {
        target.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let deadline = std::time::Instant::now() + Duration::from_millis(LISTENER_GONE_WAIT_MS_MAX);
    while std::net::TcpStream::connect_timeout(&target, LISTENER_PROBE_TIMEOUT).is_ok() {
        if std::time::Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("another process listens on {addr} already"),
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// How long `refuse_if_listened` waits for a connection on loopback.
const LISTENER_PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// How long a listener found at start may take to go away.
pub const LISTENER_GONE_WAIT_MS_MAX: u64 = 5_000;

#[derive(Debug)]
pub struct Listener {
    inner: ListenerInner,
}

#[derive(Debug)]
enum ListenerInner {
    Glommio(glommio::net::TcpListener),
    Sim(SimListener),
}

impl Listener {
    pub fn bind(addr: SocketAddr) -> io::Result<Listener> {
        let inner = if sim::is_active() {
            ListenerInner::Sim(SimListener::bind(addr)?)
        } else {
            ListenerInner::Glommio(bind_listening(addr)?)
        };
        Ok(Listener { inner })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match &self.inner {
            ListenerInner::Glommio(listener) => Ok(listener.local_addr()?),
            ListenerInner::Sim(listener) => Ok(listener.local_addr()),
        }
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
        let listener = match &self.inner {
            ListenerInner::Glommio(listener) => listener,
            ListenerInner::Sim(listener) => {
                let (read, write, peer) = listener.accept().await;
                return Ok((
                    ReadHalf {
                        inner: ReadInner::Sim(read),
                    },
                    WriteHalf {
                        inner: WriteInner::Sim(write),
                    },
                    peer,
                ));
            }
        };
        let stream = listener.accept().await?;
        stream.set_nodelay(true)?;
        let peer = stream.peer_addr()?;
        let (read, write) = glommio_halves(stream);
        Ok((read, write, peer))
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
    if sim::is_active() {
        let connected = super::timeout(timeout, sim::net::connect(addr))
            .await
            .unwrap_or_else(|| Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")));
        let (read, write) = connected?;
        return Ok((
            ReadHalf {
                inner: ReadInner::Sim(read),
            },
            WriteHalf {
                inner: WriteInner::Sim(write),
            },
        ));
    }
    let stream = glommio::net::TcpStream::connect_timeout(addr, timeout).await?;
    stream.set_nodelay(true)?;
    Ok(glommio_halves(stream))
}

fn glommio_halves(stream: glommio::net::TcpStream) -> (ReadHalf, WriteHalf) {
    let shared = Rc::new(RefCell::new(stream));
    (
        ReadHalf {
            inner: ReadInner::Glommio(shared.clone()),
        },
        WriteHalf {
            inner: WriteInner::Glommio(shared),
        },
    )
}

/// The reading side of a connection.
#[derive(Debug)]
pub struct ReadHalf {
    inner: ReadInner,
}

#[derive(Debug)]
enum ReadInner {
    Glommio(Rc<RefCell<glommio::net::TcpStream>>),
    Sim(SimReadHalf),
}

/// The writing side of a connection.
#[derive(Debug)]
pub struct WriteHalf {
    inner: WriteInner,
}

#[derive(Debug)]
enum WriteInner {
    Glommio(Rc<RefCell<glommio::net::TcpStream>>),
    Sim(SimWriteHalf),
}

impl AsyncRead for ReadHalf {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.inner {
            // The borrow lasts one poll; the two halves never hold it across an await.
            ReadInner::Glommio(stream) => Pin::new(&mut *stream.borrow_mut()).poll_read(cx, buf),
            ReadInner::Sim(read) => read.poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.inner {
            WriteInner::Glommio(stream) => Pin::new(&mut *stream.borrow_mut()).poll_write(cx, buf),
            WriteInner::Sim(write) => write.poll_write(cx, buf),
        }
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.inner {
            WriteInner::Glommio(stream) => Pin::new(&mut *stream.borrow_mut()).poll_flush(cx),
            // Written bytes are already on their way.
            WriteInner::Sim(_) => Poll::Ready(Ok(())),
        }
    }
    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.inner {
            WriteInner::Glommio(stream) => Pin::new(&mut *stream.borrow_mut()).poll_close(cx),
            WriteInner::Sim(write) => write.poll_close(),
        }
    }
}

/// Bytes a wait for more data reads through the stream: the stretch it
/// zeroes first, so it stays small; reads that do not wait fill the buffer's
/// spare capacity without zeroing it.
const WAIT_READ_BYTES: usize = 4096;

impl ReadHalf {
    /// Reads until `buf` holds at least `min_bytes`, taking whatever more the
    /// socket already has, up to `buf`'s spare capacity, or fails with
    /// `TimedOut` after `timeout` spent waiting for data (`UnexpectedEof` when
    /// the peer closes first). The caller reserves the capacity; reads that
    /// find data ready go straight into it, unzeroed, and start no timer.
    pub async fn fill_within(
        &mut self,
        buf: &mut bytes::BytesMut,
        min_bytes: usize,
        timeout: Duration,
    ) -> io::Result<()> {
        assert!(
            buf.capacity() >= min_bytes,
            "fill_within: capacity not reserved"
        );
        self.take_ready(buf, min_bytes)?;
        if buf.len() >= min_bytes {
            return Ok(());
        }
        // Nothing more ready: wait for it under one timer for the rest.
        let wait = async {
            while buf.len() < min_bytes {
                // The stretch lives in `buf`, not in this future: a future
                // holding kilobytes is copied at every move.
                let start = buf.len();
                let want = (buf.capacity() - start).clamp(1, WAIT_READ_BYTES);
                buf.resize(start + want, 0);
                let read = self.read(&mut buf[start..]).await;
                buf.truncate(start + *read.as_ref().unwrap_or(&0));
                if read? == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                self.take_ready(buf, min_bytes)?;
            }
            Ok(())
        };
        super::timeout(timeout, wait)
            .await
            .unwrap_or_else(|| Err(io::Error::new(io::ErrorKind::TimedOut, "read timed out")))
    }

    /// Receives without waiting until `buf` holds `min_bytes` or the socket
    /// has nothing more ready.
    fn take_ready(&mut self, buf: &mut bytes::BytesMut, min_bytes: usize) -> io::Result<()> {
        while buf.len() < min_bytes {
            match self.recv_ready(buf) {
                Some(Ok(0)) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e),
                None => break,
            }
        }
        Ok(())
    }

    /// One receive that does not wait, into `buf`'s spare capacity: the
    /// bytes it took (0 at the end of the stream), or `None` when nothing is
    /// ready or the connection is simulated.
    fn recv_ready(&mut self, buf: &mut bytes::BytesMut) -> Option<io::Result<usize>> {
        use std::os::unix::io::AsRawFd;
        let ReadInner::Glommio(stream) = &self.inner else {
            return None;
        };
        // glommio's stream is unbuffered (it receives straight into the
        // caller's slice), so bytes taken here cannot overtake bytes it holds.
        let fd = stream.borrow().as_raw_fd();
        let spare = buf.spare_capacity_mut();
        if spare.is_empty() {
            return None;
        }
        loop {
            // SAFETY: the kernel writes at most `spare.len()` bytes at the
            // start of `buf`'s spare capacity, and only the bytes it reports
            // written are taken into `buf` below.
            #[allow(unsafe_code)]
            let received = unsafe {
                nix::libc::recv(
                    fd,
                    spare.as_mut_ptr().cast(),
                    spare.len(),
                    nix::libc::MSG_DONTWAIT,
                )
            };
            if received >= 0 {
                let received = received as usize;
                assert!(received <= spare.len());
                // SAFETY: the kernel initialised these `received` bytes.
                #[allow(unsafe_code)]
                unsafe {
                    buf.set_len(buf.len() + received)
                };
                return Some(Ok(received));
            }
            let error = io::Error::last_os_error();
            match error.kind() {
                io::ErrorKind::WouldBlock => return None,
                io::ErrorKind::Interrupted => continue,
                _ => return Some(Err(error)),
            }
        }
    }
}

/// Buffers one vectored send hands the kernel.
const SEND_SLICES_MAX: usize = 64;

impl WriteHalf {
    /// Writes every part, in order. On a real socket the parts go out in
    /// vectored sends that never wait (`MSG_DONTWAIT`), so a response's head
    /// and batches leave in one call and as few segments as the kernel
    /// makes of them; when the socket is full, the next part is written
    /// through the stream, which waits for room, and vectored sends resume.
    pub async fn write_all_parts(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        let fd = match &self.inner {
            WriteInner::Glommio(stream) => {
                use std::os::unix::io::AsRawFd;
                Some(stream.borrow().as_raw_fd())
            }
            WriteInner::Sim(_) => None,
        };
        let Some(fd) = fd else {
            for part in parts {
                self.write_all(part).await?;
            }
            return Ok(());
        };
        // The first part not wholly sent, and how much of it was.
        let (mut index, mut offset) = (0, 0);
        while index < parts.len() {
            let slices: Vec<std::io::IoSlice<'_>> = parts[index..]
                .iter()
                .enumerate()
                .map(|(i, part)| if i == 0 { &part[offset..] } else { *part })
                .filter(|part| !part.is_empty())
                .take(SEND_SLICES_MAX)
                .map(std::io::IoSlice::new)
                .collect();
            if slices.is_empty() {
                return Ok(());
            }
            let sent = match send_now(fd, &slices) {
                Some(sent) => sent?,
                None => {
                    // Full: wait for room while writing the rest of this part.
                    self.write_all(&parts[index][offset..]).await?;
                    parts[index].len() - offset
                }
            };
            let mut left = offset + sent;
            while index < parts.len() && left >= parts[index].len() {
                left -= parts[index].len();
                index += 1;
            }
            offset = left;
        }
        Ok(())
    }

    pub async fn shutdown(&mut self) {
        let _ = self.close().await;
    }
}

/// One vectored send that does not wait: the bytes the kernel took, or
/// `None` when the socket has no room.
fn send_now(
    fd: std::os::unix::io::RawFd,
    slices: &[std::io::IoSlice<'_>],
) -> Option<io::Result<usize>> {
    use nix::sys::socket::{sendmsg, MsgFlags, SockaddrStorage};
    match sendmsg::<SockaddrStorage>(
        fd,
        slices,
        &[],
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
        None,
    ) {
        Ok(0) => Some(Err(io::ErrorKind::WriteZero.into())),
        Ok(sent) => Some(Ok(sent)),
        Err(nix::errno::Errno::EAGAIN) => None,
        Err(errno) => Some(Err(io::Error::from(errno))),
    }
}
