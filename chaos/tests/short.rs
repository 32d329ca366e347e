//! The fault suite's short form, run by CI: every scenario once on the debug
//! binaries with a short load. Each must keep every acknowledged record
//! (read back from disk after every broker restarted), append no retried
//! record twice (the load generator is idempotent), leave no offset with
//! two values, lose no record a consumer had read, leave every replica
//! directory valid for `verify-log`, and end with no process that died on
//! its own. Scenarios that need root (partitions, full disk) report
//! themselves skipped elsewhere.

use std::path::PathBuf;
use std::process::Command;

use chaos::cluster::Binaries;
use chaos::report::{details, markdown};
use chaos::scenario::{run, Nemesis, Settings};

/// Builds the broker and controller binaries of this profile (a no-op when
/// fresh) and returns the directory they are in.
fn binary_dir() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "-p",
            "broker",
            "--bin",
            "ringlog-broker",
            "-p",
            "controller",
            "--bin",
            "ringlog-controller",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building the binaries failed");
    // target/debug/deps/short-xxxx -> target/debug
    std::env::current_exe()
        .unwrap()
        .parent()
        .and_then(|p| p.parent())
        .unwrap()
        .to_path_buf()
}

#[test]
fn every_scenario_keeps_every_acknowledged_record() {
    let work = tempfile::tempdir().unwrap();
    let settings = Settings {
        binaries: Binaries::in_dir(&binary_dir()),
        work_dir: work.path().to_path_buf(),
        load_ms: 12_000,
        rate_msgs_per_s: 1_500,
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let outcomes: Vec<_> = Nemesis::ALL
        .iter()
        .map(|&nemesis| runtime.block_on(run(nemesis, &settings)))
        .collect();
    let table = markdown(&outcomes);
    println!("{table}");
    assert!(
        outcomes.iter().all(|o| o.passed()),
        "{table}\n{}",
        details(&outcomes)
    );
}
