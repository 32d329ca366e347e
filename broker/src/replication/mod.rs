//! Replication between a partition's leader and its followers, as pure
//! decisions and one I/O driver: the leader epoch history of a replica
//! (`epochs`), a replica's role and the rule for changing it (`role`), the
//! leader's checks of follower fetches, its bookkeeping of followers, high
//! watermark and ISR changes (`leader`), when an acks=all write may be
//! answered (`ack`), the follower's decisions on its leader's answers
//! (`follower`), and the follower's fetch loop (`fetcher`), the only part here
//! that does I/O.

pub mod ack;
pub mod epochs;
pub mod fetcher;
pub mod follower;
pub mod leader;
pub mod role;
