//! `Connection`: one TCP connection to a broker endpoint, split into a writer
//! task and a reader task. It assigns correlation ids, bounds the requests in
//! flight, times requests out and hands every request its own response
//! future. It knows frames, not messages: it never decodes a flatbuffer.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use protocol::frame::{self, RequestHeader, LENGTH_PREFIX_BYTES};
use protocol::ApiKey;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use crate::config::ClientConfig;
use crate::error::{ClientError, Result};

/// Every API is at version 0 today.
const API_VERSION: u16 = 0;
/// Buffers the writer hands the kernel in one vectored write.
const WRITE_SLICES_MAX: usize = 64;
/// Payload buffers below this size are copied into the frame instead: a
/// request to many partitions of one-record batches would otherwise cost
/// a vectored write per `WRITE_SLICES_MAX` tiny buffers.
const PART_COPY_BYTES_MAX: usize = 4096;
/// Bytes of a response's fixed header: correlation id and body length.
const RESPONSE_FIXED_BYTES: usize = 8;

/// A response frame, owned: the body is a flatbuffer, the payload raw bytes
/// (record batches) that `ByteRange`s in the body point into.
#[derive(Clone, Debug)]
pub struct Response {
    pub correlation_id: u32,
    frame: Bytes,
    body_end: usize,
}

impl Response {
    fn parse(frame: Bytes) -> std::result::Result<Response, frame::FrameError> {
        let decoded = frame::decode_response(&frame)?;
        let correlation_id = decoded.correlation_id;
        let body_end = RESPONSE_FIXED_BYTES + decoded.body.len();
        Ok(Response {
            correlation_id,
            frame,
            body_end,
        })
    }

    pub fn body(&self) -> &[u8] {
        &self.frame[RESPONSE_FIXED_BYTES..self.body_end]
    }

    /// The raw payload; cheap to clone and slice, so record bytes handed to
    /// callers share the frame's allocation.
    pub fn payload(&self) -> Bytes {
        self.frame.slice(self.body_end..)
    }
}

/// A request waiting for its response.
struct Pending {
    reply: oneshot::Sender<Result<Response>>,
    /// Holds one of `in_flight_requests_max` slots until the response arrives.
    _permit: OwnedSemaphorePermit,
}

/// State the reader, the writer and the handles share.
struct Shared {
    address: String,
    /// `None` once the connection failed; the reason is kept in `closed`.
    pending: Mutex<Option<HashMap<u32, Pending>>>,
    closed: Mutex<Option<ClientError>>,
}

impl Shared {
    /// Fails every pending request and refuses new ones. The first reason wins.
    fn close(&self, reason: ClientError) {
        let drained = self.pending.lock().expect("pending lock").take();
        {
            let mut closed = self.closed.lock().expect("closed lock");
            if closed.is_none() {
                *closed = Some(reason.clone());
            }
        }
        for (_, pending) in drained.into_iter().flatten() {
            let _ = pending.reply.send(Err(reason.clone()));
        }
    }

    fn closed_reason(&self) -> ClientError {
        self.closed
            .lock()
            .expect("closed lock")
            .clone()
            .unwrap_or_else(|| ClientError::ConnectionClosed {
                address: self.address.clone(),
            })
    }
}

/// A frame for the writer, in the buffers it is written from (its head,
/// then any payload buffers not copied into it); `written` hears when it
/// reached the socket.
struct Outgoing {
    frame: Vec<Bytes>,
    written: Option<oneshot::Sender<Result<()>>>,
}

struct Inner {
    shared: Arc<Shared>,
    outgoing: mpsc::Sender<Outgoing>,
    slots: Arc<Semaphore>,
    next_correlation_id: AtomicU32,
    client_id: String,
    request_timeout: Duration,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The writer ends by itself once the channel closes; the reader would
        // wait for the peer, so stop it here.
        self.reader.abort();
        self.shared.close(ClientError::ConnectionClosed {
            address: self.shared.address.clone(),
        });
    }
}

/// A pipelined connection; cheap to clone (clones share the socket).
#[derive(Clone)]
pub struct Connection {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("address", &self.inner.shared.address)
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// The response of one request; resolves to an error on timeout or when the
/// connection closes first.
pub struct ResponseFuture {
    inner: Pin<Box<dyn Future<Output = Result<Response>> + Send>>,
}

impl std::fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResponseFuture")
    }
}

impl Future for ResponseFuture {
    type Output = Result<Response>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl Connection {
    /// Opens a connection to `address` (`HOST:PORT`) and starts its tasks.
    pub async fn connect(address: &str, config: &ClientConfig) -> Result<Connection> {
        let timeout_ms = config.connect_timeout_ms;
        let stream = tokio::time::timeout(
            Duration::from_millis(timeout_ms),
            TcpStream::connect(address),
        )
        .await
        .map_err(|_| ClientError::ConnectTimeout {
            address: address.to_owned(),
            timeout_ms,
        })?
        .map_err(|e| ClientError::io(address, e))?;
        // Requests are small and latency matters more than packet count.
        stream
            .set_nodelay(true)
            .map_err(|e| ClientError::io(address, e))?;
        Ok(Connection::from_stream(stream, address, config))
    }

    fn from_stream(stream: TcpStream, address: &str, config: &ClientConfig) -> Connection {
        let (read_half, write_half) = stream.into_split();
        let shared = Arc::new(Shared {
            address: address.to_owned(),
            pending: Mutex::new(Some(HashMap::new())),
            closed: Mutex::new(None),
        });
        let (outgoing, outgoing_rx) = mpsc::channel(config.in_flight_requests_max);
        let reader = tokio::spawn(read_loop(
            read_half,
            Arc::clone(&shared),
            config.frame_size_bytes_max,
        ));
        let writer = tokio::spawn(write_loop(write_half, outgoing_rx, Arc::clone(&shared)));
        Connection {
            inner: Arc::new(Inner {
                shared,
                outgoing,
                slots: Arc::new(Semaphore::new(config.in_flight_requests_max)),
                next_correlation_id: AtomicU32::new(1),
                client_id: config.client_id.clone(),
                request_timeout: config.request_timeout(),
                reader,
                writer,
            }),
        }
    }

    pub fn address(&self) -> &str {
        &self.inner.shared.address
    }

    /// Whether the connection failed or was closed; a closed connection never reopens.
    pub fn is_closed(&self) -> bool {
        self.inner
            .shared
            .closed
            .lock()
            .expect("closed lock")
            .is_some()
            || self.inner.writer.is_finished()
    }

    /// Requests sent and not yet answered.
    pub fn in_flight_requests(&self) -> usize {
        self.inner
            .shared
            .pending
            .lock()
            .expect("pending lock")
            .as_ref()
            .map_or(0, HashMap::len)
    }

    /// The frame of a request whose payload is `payload` (copied into the
    /// frame) followed by `parts` (written from where they are).
    fn encode(
        &self,
        api_key: u16,
        body: &[u8],
        payload: &[&[u8]],
        parts: Vec<Bytes>,
    ) -> (u32, Vec<Bytes>) {
        let correlation_id = self
            .inner
            .next_correlation_id
            .fetch_add(1, Ordering::Relaxed);
        let header = RequestHeader {
            api_key,
            api_version: API_VERSION,
            correlation_id,
            client_id: self.inner.client_id.clone(),
        };
        let copied: usize = payload.iter().map(|p| p.len()).sum();
        let owned: usize = parts.iter().map(Bytes::len).sum();
        let mut head = Vec::new();
        frame::encode_request_head(&mut head, &header, body, copied + owned);
        for part in payload {
            head.extend_from_slice(part);
        }
        let mut frame = Vec::with_capacity(1 + parts.len());
        for part in parts {
            if part.len() < PART_COPY_BYTES_MAX {
                head.extend_from_slice(&part);
            } else {
                if !head.is_empty() {
                    frame.push(Bytes::from(std::mem::take(&mut head)));
                }
                frame.push(part);
            }
        }
        if !head.is_empty() {
            frame.push(Bytes::from(head));
        }
        (correlation_id, frame)
    }

    /// Queues a request and returns the future of its response. Waits only
    /// for one of the `in_flight_requests_max` slots; the request is on its
    /// way (in order with other requests on this connection) once this returns.
    pub async fn send(
        &self,
        api: ApiKey,
        body: &[u8],
        payload: &[&[u8]],
    ) -> Result<ResponseFuture> {
        self.send_key(api as u16, body, payload, Vec::new()).await
    }

    /// As `send`, with a payload of shared buffers (record batches) that go to
    /// the socket in one vectored write with the frame's head, never copied
    /// into the frame.
    pub async fn send_parts(
        &self,
        api: ApiKey,
        body: &[u8],
        parts: Vec<Bytes>,
    ) -> Result<ResponseFuture> {
        self.send_key(api as u16, body, &[], parts).await
    }

    /// Sends a request to a controller (its API keys are `ControllerApiKey`s)
    /// and waits for the response.
    pub async fn request_controller(
        &self,
        api: protocol::api::ControllerApiKey,
        body: &[u8],
    ) -> Result<Response> {
        self.send_key(api as u16, body, &[], Vec::new())
            .await?
            .await
    }

    async fn send_key(
        &self,
        api_key: u16,
        body: &[u8],
        payload: &[&[u8]],
        parts: Vec<Bytes>,
    ) -> Result<ResponseFuture> {
        let shared = &self.inner.shared;
        let permit = Arc::clone(&self.inner.slots)
            .acquire_owned()
            .await
            .expect("the slot semaphore is never closed");
        let (correlation_id, frame) = self.encode(api_key, body, payload, parts);
        let (reply, response) = oneshot::channel();
        {
            let mut pending = shared.pending.lock().expect("pending lock");
            let Some(map) = pending.as_mut() else {
                return Err(shared.closed_reason());
            };
            let previous = map.insert(
                correlation_id,
                Pending {
                    reply,
                    _permit: permit,
                },
            );
            assert!(
                previous.is_none(),
                "correlation id {correlation_id} reused while pending"
            );
        }
        let outgoing = Outgoing {
            frame,
            written: None,
        };
        if self.inner.outgoing.send(outgoing).await.is_err() {
            shared.close(shared.closed_reason());
        }
        let shared = Arc::clone(shared);
        let timeout = self.inner.request_timeout;
        Ok(ResponseFuture {
            inner: Box::pin(async move {
                match tokio::time::timeout(timeout, response).await {
                    Ok(Ok(result)) => result,
                    Ok(Err(_)) => Err(shared.closed_reason()),
                    Err(_) => {
                        // A peer that does not answer in time is not trusted
                        // with the next request either (it may never read
                        // this socket again): the connection closes, its
                        // other requests fail, and retries open a new one,
                        // as Kafka clients do.
                        let error = ClientError::RequestTimeout {
                            address: shared.address.clone(),
                            timeout_ms: timeout.as_millis() as u64,
                        };
                        shared.close(error.clone());
                        Err(error)
                    }
                }
            }),
        })
    }

    /// Sends a request and waits for its response.
    pub async fn request(&self, api: ApiKey, body: &[u8], payload: &[&[u8]]) -> Result<Response> {
        self.send(api, body, payload).await?.await
    }

    /// Sends a request the broker never answers (produce with acks=0) and
    /// returns once its bytes were written to the socket and flushed.
    pub async fn send_without_response(
        &self,
        api: ApiKey,
        body: &[u8],
        payload: &[&[u8]],
    ) -> Result<()> {
        self.send_parts_without_response_inner(api, body, payload, Vec::new())
            .await
    }

    /// As `send_without_response`, with the payload of `send_parts`.
    pub async fn send_parts_without_response(
        &self,
        api: ApiKey,
        body: &[u8],
        parts: Vec<Bytes>,
    ) -> Result<()> {
        self.send_parts_without_response_inner(api, body, &[], parts)
            .await
    }

    async fn send_parts_without_response_inner(
        &self,
        api: ApiKey,
        body: &[u8],
        payload: &[&[u8]],
        parts: Vec<Bytes>,
    ) -> Result<()> {
        let shared = &self.inner.shared;
        if let Some(reason) = shared.closed.lock().expect("closed lock").clone() {
            return Err(reason);
        }
        let _permit = Arc::clone(&self.inner.slots)
            .acquire_owned()
            .await
            .expect("the slot semaphore is never closed");
        let (_, frame) = self.encode(api as u16, body, payload, parts);
        let (written, written_rx) = oneshot::channel();
        let outgoing = Outgoing {
            frame,
            written: Some(written),
        };
        if self.inner.outgoing.send(outgoing).await.is_err() {
            return Err(shared.closed_reason());
        }
        let timeout = self.inner.request_timeout;
        match tokio::time::timeout(timeout, written_rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(shared.closed_reason()),
            Err(_) => Err(ClientError::RequestTimeout {
                address: shared.address.clone(),
                timeout_ms: timeout.as_millis() as u64,
            }),
        }
    }
}

/// Writes queued frames in order: every frame queued by the time the
/// previous write returned goes out in the same vectored writes, so bursts
/// share syscalls and a lone request is not delayed.
async fn write_loop(
    mut writer: OwnedWriteHalf,
    mut outgoing: mpsc::Receiver<Outgoing>,
    shared: Arc<Shared>,
) {
    let mut notify_written = Vec::new();
    let mut pending = std::collections::VecDeque::new();
    while let Some(first) = outgoing.recv().await {
        let mut next = Some(first);
        let mut result = Ok(());
        while let Some(item) = next.take() {
            pending.extend(item.frame);
            notify_written.extend(item.written);
            if pending.len() >= WRITE_SLICES_MAX {
                result = write_buffers(&mut writer, &mut pending).await;
                if result.is_err() {
                    break;
                }
            }
            next = outgoing.try_recv().ok();
        }
        if result.is_ok() {
            result = write_buffers(&mut writer, &mut pending).await;
        }
        pending.clear();
        let outcome = result.map_err(|e| ClientError::io(&shared.address, e));
        for written in notify_written.drain(..) {
            let _ = written.send(outcome.clone());
        }
        if let Err(error) = outcome {
            shared.close(error);
            return;
        }
    }
    // Every handle is gone: half-close so the broker sees a clean end.
    let _ = writer.shutdown().await;
}

/// Writes every buffer of `pending`, in order, in vectored writes of up to
/// `WRITE_SLICES_MAX` buffers; a short write resumes where it stopped.
async fn write_buffers(
    writer: &mut OwnedWriteHalf,
    pending: &mut std::collections::VecDeque<Bytes>,
) -> std::io::Result<()> {
    use bytes::Buf;
    while !pending.is_empty() {
        let slices: Vec<std::io::IoSlice<'_>> = pending
            .iter()
            .take(WRITE_SLICES_MAX)
            .map(|b| std::io::IoSlice::new(b))
            .collect();
        let mut written = writer.write_vectored(&slices).await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while written > 0 {
            let front = pending
                .front_mut()
                .expect("written bytes came from a buffer");
            if written >= front.len() {
                written -= front.len();
                pending.pop_front();
            } else {
                front.advance(written);
                written = 0;
            }
        }
    }
    Ok(())
}

/// Reads response frames and completes the matching pending request.
async fn read_loop(mut read_half: OwnedReadHalf, shared: Arc<Shared>, frame_size_bytes_max: u32) {
    let reason = loop {
        match read_frame(&mut read_half, &shared.address, frame_size_bytes_max).await {
            Ok(Some(frame)) => match Response::parse(frame) {
                Ok(response) => deliver(&shared, response),
                Err(source) => {
                    break ClientError::Frame {
                        address: shared.address.clone(),
                        source,
                    }
                }
            },
            Ok(None) => {
                break ClientError::ConnectionClosed {
                    address: shared.address.clone(),
                }
            }
            Err(error) => break error,
        }
    };
    shared.close(reason);
}

fn deliver(shared: &Shared, response: Response) {
    let pending = shared
        .pending
        .lock()
        .expect("pending lock")
        .as_mut()
        .and_then(|map| map.remove(&response.correlation_id));
    // No entry: the request timed out and its caller has gone.
    if let Some(pending) = pending {
        let _ = pending.reply.send(Ok(response));
    }
}

/// Reads one frame; `None` on a clean end of stream between frames.
async fn read_frame(
    read_half: &mut OwnedReadHalf,
    address: &str,
    frame_size_bytes_max: u32,
) -> Result<Option<Bytes>> {
    let mut prefix = [0u8; LENGTH_PREFIX_BYTES];
    match read_half.read_exact(&mut prefix).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(ClientError::io(address, e)),
    }
    let len =
        frame::frame_len(prefix, frame_size_bytes_max).map_err(|source| ClientError::Frame {
            address: address.to_owned(),
            source,
        })?;
    // Read into spare capacity: zeroing a fetch response's megabytes first
    // cost as much as the copy out of the socket.
    let mut frame = bytes::BytesMut::with_capacity(len);
    while frame.len() < len {
        let remaining = len - frame.len();
        let read = read_half
            .read_buf(&mut bytes::BufMut::limit(&mut frame, remaining))
            .await
            .map_err(|e| ClientError::io(address, e))?;
        if read == 0 {
            return Err(ClientError::ConnectionClosed {
                address: address.to_owned(),
            });
        }
    }
    Ok(Some(frame.freeze()))
}
