//! Ringlog broker: the data plane. Thread-per-core shards on glommio, each
//! owning its partitions end to end (connections, logs, fetch waiters), the
//! partition log storage engine beneath them, and the request handlers.

pub mod batch_cache;
pub mod clock;
pub mod cluster_view;
pub mod config;
pub mod group;
pub mod handlers;
pub mod latency;
pub mod log;
pub mod metrics;
pub mod net;
pub mod partition;
pub mod replication;
pub mod runtime;
pub mod server;
pub mod shard;
pub mod txn;
