//! The broker reads the system's clocks in two places only: `clock.rs` (the
//! `Clock` trait's system implementation) and the runtime module. Everything
//! else takes time from a `Clock`, so tests and a simulation can drive it.
//! This test fails on a new direct read anywhere else.

use std::path::{Path, PathBuf};

/// Paths under `broker/src` allowed to read the system's clocks.
const ALLOWED: &[&str] = &["clock.rs", "runtime/"];
/// What counts as reading a system clock.
const CLOCK_READS: &[&str] = &["Instant::now", "SystemTime::now", "UNIX_EPOCH"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("source directory readable") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn only_the_clock_and_the_runtime_read_the_system_clocks() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 20, "found the broker's sources");
    let mut offenders = Vec::new();
    for file in files {
        let relative = file
            .strip_prefix(&src)
            .expect("under src")
            .to_string_lossy()
            .replace('\\', "/");
        if ALLOWED
            .iter()
            .any(|a| relative == *a || (a.ends_with('/') && relative.starts_with(a)))
        {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("source readable");
        for (number, line) in text.lines().enumerate() {
            if CLOCK_READS.iter().any(|read| line.contains(read)) {
                offenders.push(format!("src/{relative}:{}: {}", number + 1, line.trim()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "take time from the `Clock` trait (crate::clock), not the system clock:\n{}",
        offenders.join("\n")
    );
}
