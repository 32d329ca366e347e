//! A short real run: the load generator against a broker started by the test,
//! open loop at a modest rate with verification on. Every send must be acked,
//! every acked record read back once, and the report directory written.

#[path = "../../client/tests/real_broker/mod.rs"]
mod real_broker;

use std::process::Command;

use real_broker::{free_port_block, RealBroker};

#[test]
fn short_verified_run_writes_a_report() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port_block(2);
    let _broker = RealBroker::start(&dir.path().join("data"), port);
    let report = dir.path().join("report");
    let output = Command::new(env!("CARGO_BIN_EXE_ringlog-loadgen"))
        .args([
            "run",
            "--bootstrap",
            &format!("127.0.0.1:{port}"),
            "--topic",
            "lg",
            "--partitions",
            "4",
        ])
        .args([
            "--rate",
            "20000",
            "--duration",
            "2s",
            "--warmup",
            "1s",
            "--producers",
            "2",
            "--consumers",
            "2",
        ])
        .args([
            "--keys",
            "uniform:100",
            "--payload",
            "json",
            "--compression",
            "zstd",
            "--verify",
            "--seed",
            "7",
        ])
        .arg("--report-dir")
        .arg(&report)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("verdict: clean"), "{stdout}");
    assert!(
        stdout.lines().filter(|l| l.starts_with('[')).count() >= 2,
        "progress lines: {stdout}"
    );
    for file in [
        "result.json",
        "publish-latency.hgrm",
        "publish-delay.hgrm",
        "end-to-end-latency.hgrm",
        "report.html",
    ] {
        assert!(report.join(file).exists(), "{file} written");
    }
    let result: serde_json::Value =
        serde_json::from_slice(&std::fs::read(report.join("result.json")).unwrap()).unwrap();
    let published = result["publishedMessages"].as_u64().unwrap();
    assert!(published >= 40_000, "about 3 s at 20k msg/s: {published}");
    assert_eq!(result["ackedMessages"].as_u64().unwrap(), published);
    assert_eq!(result["errors"].as_u64().unwrap(), 0);
    assert!(result["aggregatedEndToEndLatency99pct"].as_f64().unwrap() > 0.0);
}
