//! Replication between a partition's leader and its followers: the leader
//! epoch history of a replica (`epochs`), the leader's bookkeeping of its
//! followers, high watermark and ISR changes (`leader`), both pure, and the
//! follower's fetch loop (`fetcher`), the only part here that does I/O.

pub mod epochs;
pub mod fetcher;
pub mod leader;
