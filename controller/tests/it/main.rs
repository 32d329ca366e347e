//! The controller crate's one integration test binary: openraft's storage
//! conformance suite, crash recovery of the log, the cluster state machine
//! driven through commands with its invariants checked after every step, and a
//! real three-process quorum driven over the wire.

mod cluster_state;
mod harness;
mod log_recovery;
mod quorum;
mod raft_suite;
mod single_node;
mod support;
