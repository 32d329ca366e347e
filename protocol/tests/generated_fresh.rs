//! The committed generated code is exactly what the pinned flatc produces from
//! the committed schemas: regenerates into a temporary directory and compares.

use std::path::{Path, PathBuf};
use std::process::Command;

fn files(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push((
                    path.strip_prefix(root).unwrap().to_path_buf(),
                    std::fs::read(&path).unwrap(),
                ));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn generated_code_matches_the_schemas() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    // The script installs the pinned flatc when it is missing and prints its path.
    let flatc = Command::new(repo.join("scripts/generate-protocol.sh"))
        .arg("--print-flatc")
        .output()
        .expect("run scripts/generate-protocol.sh");
    assert!(
        flatc.status.success(),
        "pinned flatc unavailable: {}",
        String::from_utf8_lossy(&flatc.stderr)
    );
    let flatc = String::from_utf8(flatc.stdout).unwrap().trim().to_owned();
    let out = std::env::temp_dir().join(format!("ringlog-generated-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let status = Command::new(&flatc)
        .args(["--rust", "--rust-module-root-file", "--gen-all", "-o"])
        .arg(&out)
        .arg(repo.join("protocol/schema/ringlog.fbs"))
        .status()
        .unwrap();
    assert!(status.success());
    let fresh = files(&out);
    let committed = files(&repo.join("protocol/src/generated"));
    let _ = std::fs::remove_dir_all(&out);
    let names = |f: &[(PathBuf, Vec<u8>)]| f.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>();
    assert_eq!(
        names(&committed),
        names(&fresh),
        "generated file set is stale: run scripts/generate-protocol.sh"
    );
    for ((path, a), (_, b)) in committed.iter().zip(&fresh) {
        assert!(
            a == b,
            "{} is stale: run scripts/generate-protocol.sh",
            path.display()
        );
    }
}
