//! Ringlog's fault suite. Each scenario starts a real cluster (three
//! controllers and three brokers, or one broker for the roll-heavy run),
//! drives the load generator with acks=all and `--verify`, applies one
//! nemesis (kill -9 of a leader, SIGSTOP past a session, SIGTERM under load,
//! kill -9 of every broker, controller failovers, a network partition of a
//! leader, a full disk), restarts every broker and judges the run by reading
//! the whole topic back from disk and running `verify-log` on every replica:
//! never by what tailing consumers saw during the run.
//!
//! `process` runs one process under test, `netns` builds the namespaces a
//! partition needs, `cluster` lays out and drives a cluster, `scenario` runs
//! one nemesis end to end, `check` compares histories with the read-back,
//! `report` renders the results.

pub mod check;
pub mod cluster;
pub mod netns;
pub mod process;
pub mod report;
pub mod scenario;
