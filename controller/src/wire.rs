//! The broker-facing API's codec, defined in `protocol::control::codec`.

pub use protocol::control::codec::*;
