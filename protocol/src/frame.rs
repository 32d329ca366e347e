//! Framing of the wire protocol (docs/formats/wire.md). Every frame is a u32
//! big-endian length prefix and that many bytes. A request carries a fixed
//! header, a flatbuffer body and a raw payload (record batches, byte for byte);
//! a response carries the correlation id, a body and a payload. Decoders check
//! every length against its bound before using it.

use crate::api::ApiKey;

/// Bytes of the length prefix.
pub const LENGTH_PREFIX_BYTES: usize = 4;
/// Default bound on one frame (after the prefix); a broker may configure less.
pub const FRAME_SIZE_BYTES_MAX_DEFAULT: u32 = 64 << 20;
/// Bound on the client id in a request header.
pub const CLIENT_ID_BYTES_MAX: usize = 256;
/// api key u16, api version u16, correlation id u32, client id length u16.
const REQUEST_FIXED_BYTES: usize = 10;
/// correlation id u32, body length u32.
const RESPONSE_FIXED_BYTES: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {size_bytes} bytes exceeds the bound of {size_bytes_max} bytes")]
    TooLarge {
        size_bytes: u64,
        size_bytes_max: u64,
    },
    #[error("frame truncated: needs {needed} bytes, has {available}")]
    Truncated { needed: usize, available: usize },
    #[error("client id of {0} bytes exceeds the bound")]
    ClientIdTooLong(usize),
    #[error("client id is not UTF-8")]
    ClientIdNotUtf8,
    #[error("empty frame")]
    Empty,
}

/// Validates a length prefix against `frame_size_bytes_max` before anything is
/// allocated for the frame.
pub fn frame_len(
    prefix: [u8; LENGTH_PREFIX_BYTES],
    frame_size_bytes_max: u32,
) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(prefix);
    if len > frame_size_bytes_max {
        return Err(FrameError::TooLarge {
            size_bytes: u64::from(len),
            size_bytes_max: u64::from(frame_size_bytes_max),
        });
    }
    if len == 0 {
        return Err(FrameError::Empty);
    }
    Ok(len as usize)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    /// Raw key: an unknown key is answered with an error, not a dropped connection.
    pub api_key: u16,
    pub api_version: u16,
    pub correlation_id: u32,
    pub client_id: String,
}

impl RequestHeader {
    pub fn api(&self) -> Option<ApiKey> {
        ApiKey::from_u16(self.api_key)
    }
}

/// A decoded request frame borrowing its body and payload.
#[derive(Debug)]
pub struct RequestFrame<'a> {
    pub header: RequestHeader,
    pub body: &'a [u8],
    pub payload: &'a [u8],
}

fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Result<&'a [u8], FrameError> {
    if bytes.len() < n {
        return Err(FrameError::Truncated {
            needed: n,
            available: bytes.len(),
        });
    }
    let (head, rest) = bytes.split_at(n);
    *bytes = rest;
    Ok(head)
}

fn u16_at(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

fn u32_at(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Decodes a request frame (the bytes after the length prefix).
pub fn decode_request(mut frame: &[u8]) -> Result<RequestFrame<'_>, FrameError> {
    let fixed = take(&mut frame, REQUEST_FIXED_BYTES)?;
    let client_id_len = u16_at(&fixed[8..10]) as usize;
    if client_id_len > CLIENT_ID_BYTES_MAX {
        return Err(FrameError::ClientIdTooLong(client_id_len));
    }
    let client_id = std::str::from_utf8(take(&mut frame, client_id_len)?)
        .map_err(|_| FrameError::ClientIdNotUtf8)?;
    let body_len = u32_at(take(&mut frame, 4)?) as usize;
    let body = take(&mut frame, body_len)?;
    Ok(RequestFrame {
        header: RequestHeader {
            api_key: u16_at(&fixed[0..2]),
            api_version: u16_at(&fixed[2..4]),
            correlation_id: u32_at(&fixed[4..8]),
            client_id: client_id.to_owned(),
        },
        body,
        payload: frame,
    })
}

/// Appends a whole request frame (with its length prefix) to `out`.
pub fn encode_request(out: &mut Vec<u8>, header: &RequestHeader, body: &[u8], payload: &[&[u8]]) {
    let payload_len: usize = payload.iter().map(|p| p.len()).sum();
    out.reserve(
        LENGTH_PREFIX_BYTES
            + REQUEST_FIXED_BYTES
            + header.client_id.len()
            + 4
            + body.len()
            + payload_len,
    );
    encode_request_head(out, header, body, payload_len);
    for part in payload {
        out.extend_from_slice(part);
    }
}

/// Appends everything of a request frame but its payload: the length prefix
/// (counting `payload_len` more bytes), the header and the body. The payload's
/// bytes follow as they are, so a sender can write them from where they lie
/// (a vectored write) instead of copying them into the frame.
pub fn encode_request_head(
    out: &mut Vec<u8>,
    header: &RequestHeader,
    body: &[u8],
    payload_len: usize,
) {
    assert!(
        header.client_id.len() <= CLIENT_ID_BYTES_MAX,
        "client id bound"
    );
    let len = REQUEST_FIXED_BYTES + header.client_id.len() + 4 + body.len() + payload_len;
    out.extend_from_slice(&u32::try_from(len).expect("frame under 4 GiB").to_be_bytes());
    out.extend_from_slice(&header.api_key.to_be_bytes());
    out.extend_from_slice(&header.api_version.to_be_bytes());
    out.extend_from_slice(&header.correlation_id.to_be_bytes());
    out.extend_from_slice(&(header.client_id.len() as u16).to_be_bytes());
    out.extend_from_slice(header.client_id.as_bytes());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
}

/// A decoded response frame borrowing its body and payload.
#[derive(Debug)]
pub struct ResponseFrame<'a> {
    pub correlation_id: u32,
    pub body: &'a [u8],
    pub payload: &'a [u8],
}

pub fn decode_response(mut frame: &[u8]) -> Result<ResponseFrame<'_>, FrameError> {
    let fixed = take(&mut frame, RESPONSE_FIXED_BYTES)?;
    let body = take(&mut frame, u32_at(&fixed[4..8]) as usize)?;
    Ok(ResponseFrame {
        correlation_id: u32_at(&fixed[0..4]),
        body,
        payload: frame,
    })
}

/// The bytes that precede a response's body and payload: length prefix,
/// correlation id, body length. Sending these, the body and the payload as
/// separate slices lets stored batches go to the socket without a copy.
pub fn response_prefix(
    correlation_id: u32,
    body_len: usize,
    payload_len: usize,
) -> [u8; LENGTH_PREFIX_BYTES + RESPONSE_FIXED_BYTES] {
    let len = RESPONSE_FIXED_BYTES + body_len + payload_len;
    let mut out = [0u8; LENGTH_PREFIX_BYTES + RESPONSE_FIXED_BYTES];
    out[0..4].copy_from_slice(&u32::try_from(len).expect("frame under 4 GiB").to_be_bytes());
    out[4..8].copy_from_slice(&correlation_id.to_be_bytes());
    out[8..12].copy_from_slice(&(body_len as u32).to_be_bytes());
    out
}

/// Appends a whole response frame to `out`.
pub fn encode_response(out: &mut Vec<u8>, correlation_id: u32, body: &[u8], payload: &[&[u8]]) {
    let payload_len: usize = payload.iter().map(|p| p.len()).sum();
    out.extend_from_slice(&response_prefix(correlation_id, body.len(), payload_len));
    out.extend_from_slice(body);
    for part in payload {
        out.extend_from_slice(part);
    }
}

/// Returns the payload slice a `ByteRange` names, or `None` when it points
/// outside the payload.
pub fn payload_range(payload: &[u8], offset: u32, length: u32) -> Option<&[u8]> {
    let start = offset as usize;
    let end = start.checked_add(length as usize)?;
    payload.get(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn request_round_trips(key: u16, version: u16, correlation: u32, client in "[a-z]{0,20}", body: Vec<u8>, payload: Vec<u8>) {
            let header = RequestHeader { api_key: key, api_version: version, correlation_id: correlation, client_id: client };
            let mut out = Vec::new();
            encode_request(&mut out, &header, &body, &[&payload]);
            let len = frame_len(out[..4].try_into().unwrap(), u32::MAX).unwrap();
            prop_assert_eq!(len, out.len() - 4);
            let frame = decode_request(&out[4..]).unwrap();
            prop_assert_eq!(frame.header, header);
            prop_assert_eq!(frame.body, &body[..]);
            prop_assert_eq!(frame.payload, &payload[..]);
        }

        #[test]
        fn response_round_trips(correlation: u32, body: Vec<u8>, payload: Vec<u8>) {
            let mut out = Vec::new();
            encode_response(&mut out, correlation, &body, &[&payload[..payload.len() / 2], &payload[payload.len() / 2..]]);
            let frame = decode_response(&out[4..]).unwrap();
            prop_assert_eq!(frame.correlation_id, correlation);
            prop_assert_eq!(frame.body, &body[..]);
            prop_assert_eq!(frame.payload, &payload[..]);
        }

        #[test]
        fn decoders_never_panic(bytes: Vec<u8>) {
            let _ = decode_request(&bytes);
            let _ = decode_response(&bytes);
        }
    }

    #[test]
    fn length_prefix_is_bounded_before_allocation() {
        assert_eq!(
            frame_len(100u32.to_be_bytes(), 50),
            Err(FrameError::TooLarge {
                size_bytes: 100,
                size_bytes_max: 50
            })
        );
        assert_eq!(frame_len(0u32.to_be_bytes(), 50), Err(FrameError::Empty));
        assert_eq!(payload_range(b"abc", 1, 5), None);
        assert_eq!(payload_range(b"abc", u32::MAX, 5), None);
        assert_eq!(payload_range(b"abc", 1, 2), Some(&b"bc"[..]));
    }
}
