//! The broker-facing API's request and answer types, defined in
//! `protocol::control::messages`.

pub use protocol::control::messages::*;
