//! One client connection. A reader task reads frames (the length prefix is
//! checked against `frame_size_bytes_max` before anything is allocated) and
//! starts a handler task per request, at most
//! `in_flight_requests_per_connection_max` ahead of the writer; the writer
//! sends responses strictly in request order. Bad input closes this connection
//! only, with one log line.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use protocol::frame::{frame_len, LENGTH_PREFIX_BYTES};
use protocol::ApiKey;

use crate::handlers::{self, Outcome};
use crate::runtime::net::{Listener, ReadHalf, WriteHalf};
use crate::runtime::{self, Task, Watermark};
use crate::shard::Shard;

/// How often an idle accept loop checks for shutdown.
const ACCEPT_POLL_MS: u64 = 100;
/// How long shutdown waits for connections to finish their in-flight requests.
const DRAIN_MS_MAX: u64 = 5_000;

/// A connection's receive chunk: one receive takes up to this much of what
/// the client has pipelined, and frames are cut from it without a copy.
const READ_CHUNK_BYTES: usize = 256 * 1024;
/// Frames under this size are copied out of the chunk rather than shared.
const SHARED_FRAME_BYTES_MIN: usize = 4096;

/// A fresh receive chunk of `capacity_bytes` that starts with the bytes not
/// yet cut from `rest`. `BytesMut::reserve` is not used for this: on a chunk
/// still held by nobody else it grows the allocation in place, copying every
/// byte already cut from it as well.
fn new_chunk(rest: &BytesMut, capacity_bytes: usize) -> BytesMut {
    assert!(capacity_bytes >= rest.len());
    let mut chunk = BytesMut::with_capacity(capacity_bytes);
    chunk.extend_from_slice(rest);
    chunk
}

/// The api, its outcome, the request's size and when it arrived (monotonic).
type Handled = (Option<ApiKey>, Outcome, usize, Duration);

#[derive(Default)]
struct Pipeline {
    /// Handler tasks in request order; `None` marks the end of input.
    queue: RefCell<VecDeque<Option<Task<Handled>>>>,
    submitted: Watermark,
    written: Watermark,
    closing: Watermark,
}

/// Accepts connections until the shard stops, then waits (bounded) for them to drain.
pub async fn serve_listener(shard: Rc<Shard>, listener: Listener, name: &'static str) {
    let open = Rc::new(Cell::new(0usize));
    let mut acceptor = listener.acceptor();
    while !shard.is_stopping() {
        let accepted = acceptor
            .next_within(Duration::from_millis(ACCEPT_POLL_MS))
            .await;
        let (reader, writer, peer) = match accepted {
            None => continue,
            Some(Ok(parts)) => parts,
            Some(Err(e)) => {
                tracing::warn!(listener = name, error = %e, "accept failed");
                runtime::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if open.get() >= shard.config().connections_per_shard_max {
            shard.metrics().on_connection_refused();
            tracing::warn!(listener = name, %peer, bound = shard.config().connections_per_shard_max, "connection refused: connections_per_shard_max reached");
            drop((reader, writer));
            continue;
        }
        open.set(open.get() + 1);
        shard.metrics().on_connection_open();
        let (shard, open) = (shard.clone(), open.clone());
        runtime::spawn(async move {
            serve_connection(&shard, reader, writer, peer).await;
            open.set(open.get() - 1);
            shard.metrics().on_connection_close();
        })
        .detach();
    }
    let clock = shard.clock().clone();
    let deadline = clock.monotonic() + Duration::from_millis(DRAIN_MS_MAX);
    while open.get() > 0 && clock.monotonic() < deadline {
        runtime::sleep(Duration::from_millis(10)).await;
    }
}

async fn serve_connection(
    shard: &Rc<Shard>,
    reader: ReadHalf,
    writer: WriteHalf,
    peer: SocketAddr,
) {
    let pipeline = Rc::new(Pipeline::default());
    let read_task = {
        let (shard, pipeline) = (shard.clone(), pipeline.clone());
        runtime::spawn(async move { read_loop(&shard, reader, &pipeline, peer).await })
    };
    write_loop(shard, writer, &pipeline, peer).await;
    pipeline.closing.advance(1);
    read_task.await;
}

/// Why the reader stopped.
enum ReadEnd {
    Eof,
    Bad(String),
    Io(io::Error),
    Stopping,
    Closing,
}

async fn read_loop(
    shard: &Rc<Shard>,
    mut reader: ReadHalf,
    pipeline: &Rc<Pipeline>,
    peer: SocketAddr,
) {
    let config = shard.config().clone();
    // Frames are cut from this buffer, many per receive when the client
    // pipelines; a large frame keeps its part of the chunk, shared.
    let mut received = BytesMut::new();
    let end = loop {
        let in_flight = pipeline.submitted.get() - pipeline.written.get();
        if in_flight >= config.in_flight_requests_per_connection_max as i64 {
            let target = pipeline.written.get() + 1;
            if runtime_or_closing(pipeline, pipeline.written.wait_at_least(target))
                .await
                .is_none()
            {
                break ReadEnd::Closing;
            }
            continue;
        }
        if shard.is_stopping() {
            break ReadEnd::Stopping;
        }
        let idle = Duration::from_millis(config.connection_idle_ms_max);
        if received.len() < LENGTH_PREFIX_BYTES {
            if received.is_empty() {
                // Let go of a chunk whose frames have all been cut, so an idle
                // connection holds no receive memory.
                received = BytesMut::new();
            }
            if received.capacity() < LENGTH_PREFIX_BYTES {
                received = new_chunk(&received, READ_CHUNK_BYTES);
            }
            match runtime_or_closing(
                pipeline,
                reader.fill_within(&mut received, LENGTH_PREFIX_BYTES, idle),
            )
            .await
            {
                None => break ReadEnd::Closing,
                Some(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => break ReadEnd::Eof,
                Some(Err(e)) => break ReadEnd::Io(e),
                Some(Ok(())) => {}
            }
        }
        let prefix: [u8; LENGTH_PREFIX_BYTES] = received[..LENGTH_PREFIX_BYTES]
            .try_into()
            .expect("prefix length");
        let len = match frame_len(prefix, config.frame_size_bytes_max) {
            Ok(len) => len,
            Err(e) => break ReadEnd::Bad(e.to_string()),
        };
        let started = shard.clock().monotonic();
        let frame_end = LENGTH_PREFIX_BYTES + len;
        if received.len() < frame_end {
            if received.capacity() < frame_end {
                // `frame_len` bounded `len`, so this is at most one frame
                // larger than the chunk.
                received = new_chunk(&received, frame_end.max(READ_CHUNK_BYTES));
            }
            match runtime_or_closing(
                pipeline,
                reader.fill_within(
                    &mut received,
                    frame_end,
                    Duration::from_millis(config.frame_read_ms_max),
                ),
            )
            .await
            {
                None => break ReadEnd::Closing,
                Some(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    break ReadEnd::Bad(format!("connection closed inside a {len}-byte frame"))
                }
                Some(Err(e)) => break ReadEnd::Io(e),
                Some(Ok(())) => {}
            }
        }
        received.advance(LENGTH_PREFIX_BYTES);
        let frame = if len < SHARED_FRAME_BYTES_MIN {
            // A small request may wait long (a fetch for new data): its own
            // copy keeps it from holding the whole chunk meanwhile.
            let frame = bytes::Bytes::copy_from_slice(&received[..len]);
            received.advance(len);
            frame
        } else {
            received.split_to(len).freeze()
        };
        let handler_shard = shard.clone();
        let task = runtime::spawn(async move {
            let (api, outcome) = handlers::handle(&handler_shard, &frame, peer).await;
            (api, outcome, frame.len() + LENGTH_PREFIX_BYTES, started)
        });
        pipeline.queue.borrow_mut().push_back(Some(task));
        pipeline.submitted.advance(pipeline.submitted.get() + 1);
    };
    match end {
        ReadEnd::Eof | ReadEnd::Stopping | ReadEnd::Closing => {}
        ReadEnd::Bad(reason) => {
            shard.metrics().on_bad_frame();
            tracing::warn!(%peer, %reason, "closing connection: bad frame");
        }
        ReadEnd::Io(e) => tracing::info!(%peer, error = %e, "connection read ended"),
    }
    pipeline.queue.borrow_mut().push_back(None);
    pipeline.submitted.advance(pipeline.submitted.get() + 1);
}

/// Runs `future` unless the connection starts closing first.
async fn runtime_or_closing<T>(
    pipeline: &Pipeline,
    future: impl std::future::Future<Output = T>,
) -> Option<T> {
    futures_lite::future::or(async { Some(future.await) }, async {
        pipeline.closing.wait_at_least(1).await;
        None
    })
    .await
}

async fn write_loop(
    shard: &Rc<Shard>,
    mut writer: WriteHalf,
    pipeline: &Pipeline,
    peer: SocketAddr,
) {
    loop {
        let target = pipeline.written.get() + 1;
        pipeline.submitted.wait_at_least(target).await;
        let next = pipeline
            .queue
            .borrow_mut()
            .pop_front()
            .expect("submitted count matches the queue");
        let Some(task) = next else { break };
        let (api, outcome, request_bytes, started) = task.await;
        let result = match outcome {
            Outcome::Respond { head, payload } => {
                let mut parts: Vec<&[u8]> = vec![&head];
                parts.extend(payload.iter().map(|p| p.as_ref()));
                let response_bytes = parts.iter().map(|p| p.len()).sum();
                shard.metrics().on_request(
                    api,
                    request_bytes,
                    response_bytes,
                    shard.clock().monotonic().saturating_sub(started),
                );
                writer.write_all_parts(&parts).await
            }
            Outcome::NoResponse => {
                shard.metrics().on_request(
                    api,
                    request_bytes,
                    0,
                    shard.clock().monotonic().saturating_sub(started),
                );
                Ok(())
            }
            Outcome::Close(reason) => {
                shard.metrics().on_bad_frame();
                tracing::warn!(%peer, %reason, "closing connection: bad request");
                break;
            }
        };
        pipeline.written.advance(pipeline.written.get() + 1);
        if let Err(e) = result {
            tracing::info!(%peer, error = %e, "connection write failed");
            break;
        }
    }
    writer.shutdown().await;
}
