//! `ringlog cluster describe` against a real three-controller quorum: it
//! lists every controller, names the one leader and the Raft term, and skips
//! an unreachable endpoint to ask the next.

mod real_quorum;

use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use real_quorum::Quorum;

#[test]
fn describes_the_quorum_from_the_first_reachable_controller() {
    let quorum = Quorum::start(&[]);
    // A dead endpoint first: the command moves on to the next one.
    let dead = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let list = format!("{dead},{}", quorum.endpoints.join(","));
    let deadline = Instant::now() + Duration::from_secs(30);
    let output = loop {
        let output = Command::new(env!("CARGO_BIN_EXE_ringlog"))
            .args(["cluster", "describe", "--controller", &list])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if output.status.success() && stdout.lines().any(|l| l.ends_with("\tleader")) {
            break stdout;
        }
        assert!(
            Instant::now() < deadline,
            "no leader described: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let rows: Vec<&str> = output
        .lines()
        .filter(|l| quorum.endpoints.iter().any(|e| l.contains(e.as_str())))
        .collect();
    assert_eq!(rows.len(), 3, "every controller listed: {output}");
    assert_eq!(
        rows.iter().filter(|l| l.ends_with("\tleader")).count(),
        1,
        "one leader: {output}"
    );
    let header = output.lines().next().unwrap();
    let term: u64 = header
        .split("raft term ")
        .nth(1)
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(term >= 1, "{header}");
}
