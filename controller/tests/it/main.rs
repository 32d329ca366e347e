//! The controller crate's one integration test binary: openraft's storage
//! conformance suite, crash recovery of the log, and the cluster state machine
//! driven through commands with its invariants checked after every step.

mod cluster_state;
mod log_recovery;
mod raft_suite;
mod single_node;
mod support;
