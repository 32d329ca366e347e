//! Ringlog broker: the data plane. Today it holds the partition log storage
//! engine and the runtime layer beneath it.

pub mod clock;
pub mod log;
pub mod runtime;
