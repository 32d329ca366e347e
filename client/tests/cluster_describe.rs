//! `ringlog cluster describe` against a real three-controller quorum: it
//! lists every controller, names the one leader and the Raft term, and skips
//! an unreachable endpoint to ask the next.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Controllers {
    children: Vec<Child>,
    endpoints: Vec<String>,
    _dir: tempfile::TempDir,
}

impl Drop for Controllers {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn controller_binary() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "-p", "controller", "--bin", "ringlog-controller"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building ringlog-controller failed");
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .and_then(|p| p.parent())
        .unwrap()
        .join("ringlog-controller")
}

fn start_quorum() -> Controllers {
    let binary = controller_binary();
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<u16> = (0..3)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect::<Vec<_>>()
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect();
    let endpoints: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let peers: Vec<String> = endpoints
        .iter()
        .enumerate()
        .map(|(i, e)| format!("{}={e}", i + 1))
        .collect();
    let children = endpoints
        .iter()
        .enumerate()
        .map(|(i, endpoint)| {
            Command::new(&binary)
                .args([
                    "--node-id",
                    &(i + 1).to_string(),
                    "--listen",
                    endpoint,
                    "--peers",
                    &peers.join(","),
                ])
                .arg("--data-dir")
                .arg(dir.path().join(format!("c{}", i + 1)))
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("controller starts")
        })
        .collect();
    Controllers {
        children,
        endpoints,
        _dir: dir,
    }
}

#[test]
fn describes_the_quorum_from_the_first_reachable_controller() {
    let quorum = start_quorum();
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
