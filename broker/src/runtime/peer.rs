//! Outbound request/response connections from a broker to another process:
//! the controller quorum and partition leaders. One request at a time per
//! connection, each bounded in time and in response size.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use bytes::Bytes;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use protocol::frame::{
    decode_response, encode_request, frame_len, RequestHeader, LENGTH_PREFIX_BYTES,
};

use super::net::{connect, ReadHalf, WriteHalf};

#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("timed out")]
    Timeout,
    #[error("malformed response: {0}")]
    Malformed(String),
}

/// A response: its body and payload, sharing one buffer.
#[derive(Debug)]
pub struct PeerResponse {
    frame: Bytes,
    body: std::ops::Range<usize>,
}

impl PeerResponse {
    pub fn body(&self) -> &[u8] {
        &self.frame[self.body.clone()]
    }

    pub fn payload(&self) -> Bytes {
        self.frame.slice(self.body.end..)
    }
}

#[derive(Debug)]
pub struct PeerConnection {
    reader: ReadHalf,
    writer: WriteHalf,
    next_correlation_id: u32,
    response_bytes_max: u32,
    request_ms_max: u64,
}

impl PeerConnection {
    /// Connects within `request_ms_max`; responses above `response_bytes_max`
    /// are refused before allocation.
    pub async fn open(
        target: &str,
        response_bytes_max: u32,
        request_ms_max: u64,
    ) -> Result<PeerConnection, PeerError> {
        let addr: SocketAddr = target
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| PeerError::Malformed(format!("{target} resolves to nothing")))?;
        let (reader, writer) = connect(addr, Duration::from_millis(request_ms_max)).await?;
        Ok(PeerConnection {
            reader,
            writer,
            next_correlation_id: 1,
            response_bytes_max,
            request_ms_max,
        })
    }

    /// One request and its response, within `wait_ms` (a long poll the
    /// request asks for) plus the request bound.
    pub async fn call(
        &mut self,
        api_key: u16,
        body: &[u8],
        payload: &[&[u8]],
        wait_ms: u64,
    ) -> Result<PeerResponse, PeerError> {
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1);
        let mut frame = Vec::new();
        let header = RequestHeader {
            api_key,
            api_version: 0,
            correlation_id,
            client_id: "ringlog-broker".into(),
        };
        encode_request(&mut frame, &header, body, payload);
        let response_bytes_max = self.response_bytes_max;
        let limit = Duration::from_millis(wait_ms + self.request_ms_max);
        let exchange = async {
            self.writer.write_all(&frame).await?;
            self.writer.flush().await?;
            let mut prefix = [0u8; LENGTH_PREFIX_BYTES];
            self.reader.read_exact(&mut prefix).await?;
            let len = frame_len(prefix, response_bytes_max)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            // Received into unzeroed capacity: replicated batches are most
            // of a broker's inbound bytes.
            let mut response = bytes::BytesMut::with_capacity(len);
            self.reader.fill_within(&mut response, len, limit).await?;
            Ok::<_, std::io::Error>(response)
        };
        let response = super::timeout(limit, exchange)
            .await
            .ok_or(PeerError::Timeout)??;
        let decoded =
            decode_response(&response).map_err(|e| PeerError::Malformed(e.to_string()))?;
        if decoded.correlation_id != correlation_id {
            return Err(PeerError::Malformed("correlation id mismatch".into()));
        }
        let start = decoded.body.as_ptr() as usize - response.as_ptr() as usize;
        let body = start..start + decoded.body.len();
        Ok(PeerResponse {
            frame: response.freeze(),
            body,
        })
    }
}
