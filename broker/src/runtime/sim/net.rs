//! The simulated network under `runtime::net`: listeners by address and
//! connections made of two one-way pipes, on the simulation's time and seed.
//! Each write is delivered after a drawn delay (in order: a later write never
//! overtakes an earlier one on the same pipe), each read takes a drawn part
//! of what has arrived (so a frame comes in pieces, as TCP may give it), a
//! pipe holds at most `PIPE_BYTES_MAX` in flight (a writer beyond it waits,
//! as on a full socket buffer), and closing a write end is seen by the
//! reader after the bytes before it. Everything lives in the executor, so a
//! run's end (a kill -9) takes every listener and connection with it. Links
//! between simulated processes can be slowed or cut (`set_link`): a cut
//! holds every byte until it heals, as TCP's retransmissions would. The
//! connections between two processes can be reset (`reset_connections`):
//! what was in flight is lost and both ends get `ConnectionReset`, as after a
//! middlebox drops the flow or a peer sends RST; that is how TCP loses
//! messages, so a request may have been applied without its answer arriving.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use super::{current, is_active};

/// Bytes written to one pipe and not yet read: the simulated socket buffer.
pub const PIPE_BYTES_MAX: usize = 256 << 10;

/// Ports given to the connecting side of simulated connections, in turn.
const EPHEMERAL_PORT_FIRST: u16 = 40_000;
const EPHEMERAL_PORTS: u16 = 20_000;

/// How often a delivery held by a cut link looks again.
const CUT_RECHECK_MS: u64 = 5;

/// The executor's network: who listens where, and the state of the links
/// between processes.
#[derive(Default)]
pub(super) struct SimNet {
    listeners: RefCell<HashMap<SocketAddr, Rc<ListenerState>>>,
    next_port: Cell<u16>,
    /// By (lower process, higher process): both directions alike.
    links: RefCell<std::collections::BTreeMap<(u32, u32), Link>>,
    /// Every pipe made, for `reset_connections`; dropped ones are pruned at
    /// each connect.
    pipes: RefCell<Vec<std::rc::Weak<Pipe>>>,
}

/// A link's faults.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Link {
    /// Added to every delivery's delay.
    pub extra_delay_us: u64,
    /// Nothing is delivered while set.
    pub cut: bool,
}

fn link_key(a: u32, b: u32) -> (u32, u32) {
    (a.min(b), a.max(b))
}

/// Sets the faults of the link between processes `a` and `b` (a simulated
/// process, see `spawn_process`; 0 is everything else).
pub fn set_link(a: u32, b: u32, link: Link) {
    let executor = current();
    let mut links = executor.net.links.borrow_mut();
    if link == Link::default() {
        links.remove(&link_key(a, b));
    } else {
        links.insert(link_key(a, b), link);
    }
}

/// Heals every link.
pub fn heal_all() {
    current().net.links.borrow_mut().clear();
}

/// Resets every open connection between processes `a` and `b`: bytes in
/// flight or unread are lost, and each end's next read or write fails with
/// `ConnectionReset`. How many connections were reset.
pub fn reset_connections(a: u32, b: u32) -> usize {
    let executor = current();
    let pipes: Vec<Rc<Pipe>> = executor
        .net
        .pipes
        .borrow()
        .iter()
        .filter_map(std::rc::Weak::upgrade)
        .filter(|p| link_key(p.writer_process, p.reader_process) == link_key(a, b))
        .collect();
    drop(executor);
    for pipe in &pipes {
        pipe.reset();
    }
    // Two pipes per connection.
    pipes.len() / 2
}

fn link(a: u32, b: u32) -> Link {
    current()
        .net
        .links
        .borrow()
        .get(&link_key(a, b))
        .copied()
        .unwrap_or_default()
}

#[derive(Default)]
struct ListenerState {
    /// The process that bound it.
    process: u32,
    backlog: RefCell<VecDeque<(SimReadHalf, SimWriteHalf, SocketAddr)>>,
    acceptor: RefCell<Option<Waker>>,
}

enum Chunk {
    Bytes(Vec<u8>),
    Eof,
}

/// One direction of a connection.
#[derive(Default)]
struct Pipe {
    /// The processes at the writing and the reading end.
    writer_process: u32,
    reader_process: u32,
    /// Written, waiting for its delivery time, in write order.
    in_flight: RefCell<VecDeque<(u64, Chunk)>>,
    in_flight_bytes: Cell<usize>,
    /// Delivered and not yet read.
    arrived: RefCell<VecDeque<u8>>,
    /// The writer's close has been delivered.
    eof: Cell<bool>,
    /// The write end is closed or gone (no more writes).
    closed: Cell<bool>,
    reader_gone: Cell<bool>,
    /// When the last write is delivered: later writes are not delivered before it.
    last_delivery_ns: Cell<u64>,
    reader: RefCell<Option<Waker>>,
    writer: RefCell<Option<Waker>>,
    /// Reset (`reset_connections`): both ends fail from now on.
    reset: Cell<bool>,
}

fn reset_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionReset,
        "the simulated connection was reset",
    )
}

impl Pipe {
    fn reset(&self) {
        self.reset.set(true);
        self.in_flight.borrow_mut().clear();
        self.in_flight_bytes.set(0);
        self.arrived.borrow_mut().clear();
        if let Some(waker) = self.reader.borrow_mut().take() {
            waker.wake();
        }
        self.wake_writer();
    }

    fn queued_bytes(&self) -> usize {
        self.in_flight_bytes.get() + self.arrived.borrow().len()
    }

    /// Hands `chunk` to the network; it arrives after a drawn delay.
    fn send(self: &Rc<Pipe>, chunk: Chunk) {
        let executor = current();
        let now_ns = executor.now_ns.get();
        let faults = link(self.writer_process, self.reader_process);
        let delay_ns = (executor.random_below(executor.config.net_latency_us_max + 1)
            + faults.extra_delay_us)
            * 1_000;
        let at = (now_ns + delay_ns).max(self.last_delivery_ns.get());
        self.last_delivery_ns.set(at);
        if let Chunk::Bytes(bytes) = &chunk {
            self.in_flight_bytes
                .set(self.in_flight_bytes.get() + bytes.len());
        }
        self.in_flight.borrow_mut().push_back((at, chunk));
        let pipe = self.clone();
        // Bytes handed to the network arrive even if their writer's process
        // is killed meanwhile, as a kernel's socket buffer still sends them.
        super::spawn_detached_in_simulation(async move {
            super::sleep(Duration::from_nanos(at - now_ns)).await;
            while link(pipe.writer_process, pipe.reader_process).cut {
                super::sleep(Duration::from_millis(CUT_RECHECK_MS)).await;
            }
            pipe.deliver_due();
        });
    }

    /// Moves everything whose time has come to the reader's side, in order.
    fn deliver_due(&self) {
        let now_ns = current().now_ns.get();
        let mut delivered = false;
        loop {
            let chunk = {
                let mut in_flight = self.in_flight.borrow_mut();
                match in_flight.front() {
                    Some((at, _)) if *at <= now_ns => in_flight.pop_front().map(|(_, c)| c),
                    _ => None,
                }
            };
            match chunk {
                None => break,
                Some(Chunk::Bytes(bytes)) => {
                    self.in_flight_bytes
                        .set(self.in_flight_bytes.get() - bytes.len());
                    if !self.reader_gone.get() {
                        self.arrived.borrow_mut().extend(bytes);
                    }
                }
                Some(Chunk::Eof) => self.eof.set(true),
            }
            delivered = true;
        }
        if delivered {
            if let Some(waker) = self.reader.borrow_mut().take() {
                waker.wake();
            }
        }
    }

    fn wake_writer(&self) {
        if let Some(waker) = self.writer.borrow_mut().take() {
            waker.wake();
        }
    }
}

/// The reading end of a simulated connection.
pub struct SimReadHalf {
    pipe: Rc<Pipe>,
}

/// The writing end of a simulated connection.
pub struct SimWriteHalf {
    pipe: Rc<Pipe>,
}

impl std::fmt::Debug for SimReadHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimReadHalf")
            .field("arrived", &self.pipe.arrived.borrow().len())
            .field("eof", &self.pipe.eof.get())
            .finish()
    }
}

impl std::fmt::Debug for SimWriteHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimWriteHalf")
            .field("queued", &self.pipe.queued_bytes())
            .field("closed", &self.pipe.closed.get())
            .finish()
    }
}

impl SimReadHalf {
    pub fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        if self.pipe.reset.get() {
            return Poll::Ready(Err(reset_error()));
        }
        let available = self.pipe.arrived.borrow().len();
        if available > 0 && !buf.is_empty() {
            let most = available.min(buf.len());
            let n = 1 + current().random_below(most as u64) as usize;
            let mut arrived = self.pipe.arrived.borrow_mut();
            for (slot, byte) in buf.iter_mut().zip(arrived.drain(..n)) {
                *slot = byte;
            }
            drop(arrived);
            self.pipe.wake_writer();
            return Poll::Ready(Ok(n));
        }
        if self.pipe.eof.get() || buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        *self.pipe.reader.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for SimReadHalf {
    fn drop(&mut self) {
        self.pipe.reader_gone.set(true);
        self.pipe.arrived.borrow_mut().clear();
        self.pipe.reader.borrow_mut().take();
        self.pipe.wake_writer();
    }
}

impl SimWriteHalf {
    pub fn poll_write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.pipe.reset.get() {
            return Poll::Ready(Err(reset_error()));
        }
        // Across a cut link the writer cannot know the reader is gone: its
        // bytes go into the network and are lost there.
        let cut = link(self.pipe.writer_process, self.pipe.reader_process).cut;
        if self.pipe.reader_gone.get() && !cut {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the other side closed the connection",
            )));
        }
        if self.pipe.closed.get() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "write after close",
            )));
        }
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let room = PIPE_BYTES_MAX.saturating_sub(self.pipe.queued_bytes());
        if room == 0 {
            *self.pipe.writer.borrow_mut() = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let n = room.min(buf.len());
        self.pipe.send(Chunk::Bytes(buf[..n].to_vec()));
        Poll::Ready(Ok(n))
    }

    pub fn poll_close(&mut self) -> Poll<io::Result<()>> {
        self.close();
        Poll::Ready(Ok(()))
    }

    fn close(&mut self) {
        if !self.pipe.closed.replace(true) && !self.pipe.reset.get() {
            self.pipe.send(Chunk::Eof);
        }
    }
}

impl Drop for SimWriteHalf {
    fn drop(&mut self) {
        // A run being torn down (the end of the simulation) delivers nothing
        // more; a process killed inside it closes its connections, as the
        // kernel does for a dead process.
        if is_active() && !super::is_tearing_down() {
            self.close();
        }
    }
}

/// A bound simulated listener; unbinds when dropped.
pub struct SimListener {
    addr: SocketAddr,
    state: Rc<ListenerState>,
}

impl std::fmt::Debug for SimListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimListener")
            .field("addr", &self.addr)
            .field("backlog", &self.state.backlog.borrow().len())
            .finish()
    }
}

impl SimListener {
    pub fn bind(addr: SocketAddr) -> io::Result<SimListener> {
        let executor = current();
        let mut listeners = executor.net.listeners.borrow_mut();
        if listeners.contains_key(&addr) {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{addr} is already bound in the simulation"),
            ));
        }
        let state = Rc::new(ListenerState {
            process: executor.polling_process.get(),
            ..ListenerState::default()
        });
        listeners.insert(addr, state.clone());
        Ok(SimListener { addr, state })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub async fn accept(&self) -> (SimReadHalf, SimWriteHalf, SocketAddr) {
        std::future::poll_fn(|cx| match self.state.backlog.borrow_mut().pop_front() {
            Some(accepted) => Poll::Ready(accepted),
            None => {
                *self.state.acceptor.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

impl Drop for SimListener {
    fn drop(&mut self) {
        if !is_active() {
            return;
        }
        let executor = current();
        let mut listeners = executor.net.listeners.borrow_mut();
        if listeners
            .get(&self.addr)
            .is_some_and(|s| Rc::ptr_eq(s, &self.state))
        {
            listeners.remove(&self.addr);
        }
    }
}

/// Connects to a simulated listener at `addr`, after a drawn delay.
pub async fn connect(addr: SocketAddr) -> io::Result<(SimReadHalf, SimWriteHalf)> {
    let delay_us = {
        let executor = current();
        executor.random_below(executor.config.net_latency_us_max + 1)
    };
    super::sleep(Duration::from_micros(delay_us)).await;
    let executor = current();
    let client = executor.polling_process.get();
    let Some(listener) = executor.net.listeners.borrow().get(&addr).cloned() else {
        return Err(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            format!("nothing listens on {addr} in the simulation"),
        ));
    };
    let n = executor.net.next_port.get();
    executor
        .net
        .next_port
        .set(n.wrapping_add(1) % EPHEMERAL_PORTS);
    let peer = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), EPHEMERAL_PORT_FIRST + n);
    // A handshake across a cut link waits for it to heal (the caller's
    // connect timeout bounds the wait), and only then finds out whether
    // anyone still listens.
    while link(client, listener.process).cut {
        super::sleep(Duration::from_millis(CUT_RECHECK_MS)).await;
    }
    if !Rc::ptr_eq(
        &listener,
        match executor.net.listeners.borrow().get(&addr) {
            Some(now) => now,
            None => {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!("nothing listens on {addr} in the simulation"),
                ))
            }
        },
    ) {
        return Err(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            format!("{addr} was bound again in the simulation"),
        ));
    }
    let to_server = Rc::new(Pipe {
        writer_process: client,
        reader_process: listener.process,
        ..Pipe::default()
    });
    let to_client = Rc::new(Pipe {
        writer_process: listener.process,
        reader_process: client,
        ..Pipe::default()
    });
    {
        let mut pipes = executor.net.pipes.borrow_mut();
        pipes.retain(|p| p.strong_count() > 0);
        pipes.push(Rc::downgrade(&to_server));
        pipes.push(Rc::downgrade(&to_client));
    }
    listener.backlog.borrow_mut().push_back((
        SimReadHalf {
            pipe: to_server.clone(),
        },
        SimWriteHalf {
            pipe: to_client.clone(),
        },
        peer,
    ));
    if let Some(waker) = listener.acceptor.borrow_mut().take() {
        waker.wake();
    }
    Ok((
        SimReadHalf { pipe: to_client },
        SimWriteHalf { pipe: to_server },
    ))
}

#[cfg(test)]
mod tests {
    use futures_lite::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    use super::super::{run, SimConfig, SimDisk};
    use crate::runtime::net::{connect, Listener};

    fn addr() -> SocketAddr {
        "127.0.0.1:9092".parse().unwrap()
    }

    #[test]
    fn bytes_arrive_in_order_and_in_pieces_then_the_close() {
        let received = run(&SimConfig::new(3), &SimDisk::new(), None, async {
            let listener = Listener::bind(addr()).unwrap();
            let sender = crate::runtime::spawn(async {
                let (_read, mut write) = connect(addr(), Duration::from_secs(1)).await.unwrap();
                for chunk in 0..200u32 {
                    write.write_all(&chunk.to_le_bytes()).await.unwrap();
                }
                write.close().await.unwrap();
            });
            let (mut read, _write, _) = listener.accept().await.unwrap();
            let mut all = Vec::new();
            let mut reads = 0;
            let mut buf = [0u8; 64];
            loop {
                let n = read.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                reads += 1;
                all.extend_from_slice(&buf[..n]);
            }
            sender.await;
            (all, reads)
        })
        .unwrap();
        let (bytes, reads) = received;
        let expected: Vec<u8> = (0..200u32).flat_map(|c| c.to_le_bytes()).collect();
        assert_eq!(bytes, expected);
        assert!(reads > 200 * 4 / 64, "reads take drawn parts: {reads}");
    }

    #[test]
    fn a_cut_link_holds_bytes_until_it_heals() {
        run(&SimConfig::new(6), &SimDisk::new(), None, async {
            let server = crate::runtime::sim::spawn_process(1, async {
                let listener = Listener::bind(addr()).unwrap();
                let (mut read, _write, _) = listener.accept().await.unwrap();
                let mut byte = [0u8; 1];
                read.read_exact(&mut byte).await.unwrap();
                crate::runtime::sim::now()
            });
            let client = crate::runtime::sim::spawn_process(2, async {
                crate::runtime::sleep(Duration::from_millis(1)).await;
                let (_read, mut write) = connect(addr(), Duration::from_secs(1)).await.unwrap();
                write.write_all(&[9]).await.unwrap();
                std::future::pending::<()>().await;
            });
            set_link(
                1,
                2,
                Link {
                    extra_delay_us: 0,
                    cut: true,
                },
            );
            crate::runtime::sleep(Duration::from_millis(500)).await;
            set_link(1, 2, Link::default());
            let arrived = server.await;
            drop(client);
            assert!(arrived >= Duration::from_millis(500), "{arrived:?}");
        })
        .unwrap();
    }

    #[test]
    fn a_reset_fails_both_ends_of_the_connections_between_two_processes_only() {
        run(&SimConfig::new(7), &SimDisk::new(), None, async {
            let server = crate::runtime::sim::spawn_process(1, async {
                let listener = Listener::bind(addr()).unwrap();
                let mut accepted = Vec::new();
                for _ in 0..3 {
                    accepted.push(listener.accept().await.unwrap());
                }
                std::future::pending::<()>().await;
                drop(accepted);
            });
            let dial = || async {
                crate::runtime::sleep(Duration::from_millis(1)).await;
                connect(addr(), Duration::from_secs(1)).await.unwrap()
            };
            let (mine, mine_too) =
                crate::runtime::sim::spawn_process(2, async move { (dial().await, dial().await) })
                    .await;
            let mut other = crate::runtime::sim::spawn_process(3, dial()).await;
            crate::runtime::sleep(Duration::from_millis(5)).await;
            assert_eq!(reset_connections(2, 1), 2);
            for (mut read, mut write) in [mine, mine_too] {
                let mut byte = [0u8; 1];
                let read_error = read.read(&mut byte).await.unwrap_err();
                assert_eq!(read_error.kind(), io::ErrorKind::ConnectionReset);
                let write_error = write.write_all(&[1]).await.unwrap_err();
                assert_eq!(write_error.kind(), io::ErrorKind::ConnectionReset);
            }
            other
                .1
                .write_all(&[1])
                .await
                .expect("another process's connection stays up");
            drop(server);
        })
        .unwrap();
    }

    #[test]
    fn nothing_listening_is_refused_and_a_bound_address_is_in_use() {
        run(&SimConfig::new(4), &SimDisk::new(), None, async {
            let refused = connect(addr(), Duration::from_secs(1)).await.unwrap_err();
            assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
            let listener = Listener::bind(addr()).unwrap();
            let in_use = Listener::bind(addr()).unwrap_err();
            assert_eq!(in_use.kind(), io::ErrorKind::AddrInUse);
            drop(listener);
            Listener::bind(addr()).expect("free again once the listener is gone");
        })
        .unwrap();
    }

    #[test]
    fn a_writer_waits_while_the_pipe_is_full_and_errs_once_the_reader_is_gone() {
        run(&SimConfig::new(5), &SimDisk::new(), None, async {
            let listener = Listener::bind(addr()).unwrap();
            let (_client_read, mut client_write) =
                connect(addr(), Duration::from_secs(1)).await.unwrap();
            let (server_read, _server_write, _) = listener.accept().await.unwrap();
            let big = vec![7u8; PIPE_BYTES_MAX];
            client_write.write_all(&big).await.unwrap();
            let more =
                crate::runtime::timeout(Duration::from_millis(100), client_write.write_all(&[1]))
                    .await;
            assert!(more.is_none(), "a full pipe takes no more bytes");
            drop(server_read);
            let broken = client_write.write_all(&[1]).await.unwrap_err();
            assert_eq!(broken.kind(), io::ErrorKind::BrokenPipe);
        })
        .unwrap();
    }
}
