//! Replication between a partition's leader and its followers, as pure
//! decisions without I/O: the leader epoch history of a replica (`epochs`), a
//! replica's role and the rule for changing it (`role`), the leader's checks
//! of follower fetches, its bookkeeping of followers, high watermark and ISR
//! changes (`leader`), when an acks=all write may be answered (`ack`), and the
//! follower's decisions on its leader's answers (`follower`), and one
//! replica's state machine over all of them (`replica`). The shard drives the
//! state machine, as does the simulator; the follower's fetch loop is
//! `shard::fetcher`.

pub mod ack;
pub mod epochs;
pub mod follower;
pub mod leader;
pub mod replica;
pub mod role;
