//! Ringlog's open-loop load generator, capacity planner and report writer.
//! Everything but `driver` is network-free and testable on its own; the
//! `driver` (producers and consumers over the `client` crate) composes these
//! pieces: `schedule` gives each message its intended send time, `payload`
//! and `keys` make the records, `histograms` records latencies per worker
//! and merges them per interval, `progress` prints the per-second line,
//! `report` writes result.json, .hgrm files and report.html, and `verify`
//! checks the acked/consumed history; `readback` reads a whole topic back
//! after a run. With `--consumer-group`, `group_consumers` reads through
//! consumer groups instead, with `group_stability` deciding when a group
//! may start and `group_progress` counting what each group read; `consume`
//! holds what both kinds of consumer share. `max_rate` decides the steps of
//! `--scenario max-rate`, each one a whole run. `cpu` reads what the load
//! generator and the rest of the machine used over the measured seconds,
//! and `pinning` places its runtime threads on the CPUs `--cpus` names.

/// Writes a line to standard output if it can. A full or closed output (a
/// log on a full disk, a pipe whose reader left) must not end a run whose
/// results still go to its own files: `println!` panics there, and panics
/// abort.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `say!` without the line end.
#[macro_export]
macro_rules! say_part {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), $($arg)*);
    }};
}

/// `say!` to standard error.
#[macro_export]
macro_rules! say_err {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod consume;
pub mod cpu;
pub mod driver;
pub mod group_consumers;
pub mod group_progress;
pub mod group_stability;
pub mod histograms;
pub mod keys;
pub mod max_rate;
pub mod payload;
pub mod pinning;
pub mod plan;
pub mod progress;
pub mod readback;
pub mod report;
pub mod report_dir;
pub mod report_html;
pub mod run_config;
pub mod schedule;
mod transactions;
pub mod units;
pub mod value_id;
pub mod verify;
