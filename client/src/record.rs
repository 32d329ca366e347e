//! A record header, as producers send it and consumers receive it.

use bytes::Bytes;

/// One record header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub key: String,
    pub value: Option<Bytes>,
}
