//! The metadata records the controller replicates: defined with the API they
//! travel in, `protocol::control::records`.

pub use protocol::control::records::*;
