//! Short real runs: the load generator against a broker started by the test,
//! open loop at a modest rate with verification on. Every send must be acked,
//! every acked record read back once (by every consumer group, when reading
//! through groups, and by read_committed consumers when producers write in
//! transactions), and the report directory written.

#[path = "../../client/tests/real_broker/mod.rs"]
mod real_broker;

use std::process::Command;

use real_broker::{free_port_block, scrape_metrics, RealBroker};

/// Runs the load generator and returns its output, which must report
/// success.
fn succeed(command: &mut Command) -> String {
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// One finished run: its output, its `result.json`, the files of its
/// report directory.
struct Run {
    stdout: String,
    result: serde_json::Value,
    report_files: Vec<String>,
}

/// Starts a broker of its own and runs `ringlog-loadgen run` against it
/// with `args` (whitespace-separated); the run must succeed.
fn run_on_own_broker(args: &str) -> Run {
    run_on_own_broker_with_metrics(args).0
}

/// `run_on_own_broker`, with the broker's metrics text after the run.
fn run_on_own_broker_with_metrics(args: &str) -> (Run, String) {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port_block(2);
    let _broker = RealBroker::start(&dir.path().join("data"), port);
    let report = dir.path().join("report");
    let stdout = succeed(
        Command::new(env!("CARGO_BIN_EXE_ringlog-loadgen"))
            .args(["run", "--bootstrap", &format!("127.0.0.1:{port}")])
            .args(args.split_whitespace())
            .arg("--report-dir")
            .arg(&report),
    );
    let result =
        serde_json::from_slice(&std::fs::read(report.join("result.json")).unwrap()).unwrap();
    let report_files = std::fs::read_dir(&report)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let run = Run {
        stdout,
        result,
        report_files,
    };
    (run, scrape_metrics(port))
}

/// A metric summed over all of its label sets (every shard, every api
/// matching `labels`).
fn metric_sum(text: &str, name: &str, labels: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(labels))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

#[test]
fn short_verified_run_writes_a_report() {
    let cpu = *loadgen::pinning::allowed_cpus().last().unwrap();
    let Run {
        stdout,
        result,
        report_files,
    } = run_on_own_broker(&format!(
        "{}{}",
        concat!(
            "--topic lg --partitions 4 --rate 20000 --duration 2s --warmup 1s ",
            "--producers 2 --consumers 2 --keys uniform:100 --payload json ",
            "--compression zstd --verify --seed 7 --cpus ",
        ),
        cpu
    ));
    assert!(stdout.contains("verdict: clean"), "{stdout}");
    assert!(
        stdout.contains(&format!("worker 0 on CPU {cpu}, worker 1 on CPU {cpu}")),
        "{stdout}"
    );
    assert_eq!(result["loadgenCpus"], serde_json::json!([cpu]));
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
        assert!(report_files.iter().any(|f| f == file), "{file} written");
    }
    let published = result["publishedMessages"].as_u64().unwrap();
    assert!(published >= 40_000, "about 3 s at 20k msg/s: {published}");
    assert_eq!(result["ackedMessages"].as_u64().unwrap(), published);
    assert_eq!(result["errors"].as_u64().unwrap(), 0);
    assert!(result["aggregatedEndToEndLatency99pct"].as_f64().unwrap() > 0.0);
}

#[test]
fn a_cpu_outside_the_affinity_mask_is_refused_before_anything_runs() {
    let output = Command::new(env!("CARGO_BIN_EXE_ringlog-loadgen"))
        .args(["run", "--bootstrap", "127.0.0.1:1", "--cpus"])
        .arg(loadgen::pinning::CPU_ID_MAX.to_string())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("not in this process's affinity mask"),
        "{stderr}"
    );
}

#[test]
fn groups_consume_everything_and_commit() {
    // Proves that two consumer groups of two members each join before
    // producers start, each read every acked record once (verify per
    // group), and commit up to the log end when they leave.
    let Run { stdout, result, .. } = run_on_own_broker(concat!(
        "--topic lg-groups --partitions 4 --rate 5000 --duration 2s ",
        "--warmup 0s --consumers 2 --consumer-group lg --consumer-groups ",
        "2 --verify --seed 7",
    ));
    for group in ["lg-0", "lg-1"] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("group {group}: 2 members")))
            .unwrap_or_else(|| panic!("a summary of {group}: {stdout}"));
        assert!(
            line.contains("committed lag 0 records (4 of 4 partitions committed)"),
            "{line}"
        );
        assert!(
            stdout.contains(&format!("group {group}: acked")),
            "{group} verified on its own: {stdout}"
        );
    }
    assert!(stdout.contains("all 2 groups: acked"), "{stdout}");
    assert_eq!(stdout.matches("verdict: clean").count(), 3, "{stdout}");
    let acked = result["ackedMessages"].as_u64().unwrap();
    assert!(acked >= 8_000, "about 2 s at 5k msg/s: {acked}");
    assert_eq!(result["subscriptionsPerTopic"].as_u64(), Some(2));
    assert_eq!(result["consumerGroup"].as_str(), Some("lg"));
    assert_eq!(
        result["consumedMessages"].as_u64().unwrap(),
        2 * acked,
        "each group reads every record once"
    );
}

#[test]
fn transactional_producers_commit_and_consumers_read_committed() {
    // Proves `--transaction-ms`: each producer commits a transaction every
    // 100 ms, and read_committed consumers read every acked record once
    // (a record whose transaction never committed would stay invisible to
    // them and count as lost).
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("broker.toml");
    std::fs::write(&config, "[transactions]\nstate_topic_partitions = 4\n").unwrap();
    let port = free_port_block(2);
    let _broker = RealBroker::start_node(
        &dir.path().join("data"),
        port,
        1,
        2,
        &["--config", config.to_str().unwrap()],
    );
    let report = dir.path().join("report");
    let stdout = succeed(
        Command::new(env!("CARGO_BIN_EXE_ringlog-loadgen"))
            .args(["run", "--bootstrap", &format!("127.0.0.1:{port}")])
            .args(["--topic", "lg-txn", "--partitions", "4"])
            .args(["--rate", "10000", "--duration", "2s", "--warmup", "1s"])
            .args(["--producers", "2", "--consumers", "2", "--acks", "all"])
            .args(["--keys", "uniform:100", "--transaction-ms", "100"])
            .args(["--verify", "--seed", "11"])
            .arg("--report-dir")
            .arg(&report),
    );
    assert!(stdout.contains("verdict: clean"), "{stdout}");
    for producer in 0..2 {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("producer {producer}: ")))
            .unwrap_or_else(|| panic!("producer {producer} reports its commits: {stdout}"));
        let committed: u64 = line.split_whitespace().nth(2).unwrap().parse().unwrap();
        // Behaviour, not pace: one transaction after another.
        assert!(committed >= 2, "transactions follow each other: {line}");
    }
    let result: serde_json::Value =
        serde_json::from_slice(&std::fs::read(report.join("result.json")).unwrap()).unwrap();
    let acked = result["ackedMessages"].as_u64().unwrap();
    assert!(acked >= 20_000, "about 3 s at 10k msg/s: {acked}");
    assert_eq!(result["errors"].as_u64().unwrap(), 0);
    assert_eq!(result["consumedMessages"].as_u64().unwrap(), acked);
}

#[test]
fn catch_up_readers_each_read_the_warmup_backlog() {
    // Proves `--catch-up` with two sets of the load generator's own
    // consumers: nothing is read through the 2 s warmup, then each set
    // reads every acked record once from where the run began, so the
    // oldest reads are about the warmup old.
    let Run { stdout, result, .. } = run_on_own_broker(concat!(
        "--topic lg-catch-up --partitions 4 --rate 5000 --duration 1s ",
        "--warmup 2s --consumers 2 --consumer-groups 2 --catch-up ",
        "--verify --seed 5",
    ));
    assert!(stdout.contains("verdict: clean"), "{stdout}");
    // The run's totals, warmup included (result.json counts the measured
    // phase only, which here reads more than it acks).
    let totals: Vec<u64> = stdout
        .lines()
        .find(|l| l.starts_with("published "))
        .unwrap_or_else(|| panic!("a totals line: {stdout}"))
        .split_whitespace()
        .filter_map(|word| word.parse().ok())
        .collect();
    let (acked, consumed) = (totals[1], totals[3]);
    assert!(acked >= 10_000, "about 3 s at 5k msg/s: {acked}");
    assert_eq!(
        consumed,
        2 * acked,
        "each set of consumers reads every record once"
    );
    assert_eq!(result["subscriptionsPerTopic"].as_u64(), Some(2));
    let oldest_read_ms = result["aggregatedEndToEndLatencyMax"].as_f64().unwrap();
    assert!(
        oldest_read_ms >= 1_000.0,
        "the warmup's records wait for the readers: {oldest_read_ms} ms"
    );
}

#[test]
fn a_leader_gets_one_produce_request_for_all_its_ready_partitions() {
    // Proves that the load generator's producers send per leader, as
    // Kafka's do: with keys spread over 200 partitions, batches of one or
    // two records seal on their linger a few at a time, and those sealed
    // together reach each shard in one request rather than one request per
    // batch, which with thousands of partitions meant hundreds of thousands
    // of requests a second (here about seven batches a request, against one
    // before). Every record is still acknowledged and read back once.
    let (Run { stdout, result, .. }, metrics) = run_on_own_broker_with_metrics(concat!(
        "--topic lg-spread --partitions 200 --rate 20000 --duration 2s ",
        "--warmup 1s --producers 2 --consumers 1 --keys uniform:100000 ",
        "--linger-ms 10 --verify --seed 11",
    ));
    assert!(stdout.contains("verdict: clean"), "{stdout}");
    assert_eq!(result["errors"].as_u64(), Some(0));
    let requests = metric_sum(&metrics, "ringlog_requests_total", "api=\"produce\"");
    let batches = metric_sum(&metrics, "ringlog_log_appended_batches_total", "");
    assert!(
        batches >= 1_000,
        "small batches over many partitions: {batches}"
    );
    assert!(
        requests * 3 <= batches,
        "{requests} produce requests carried {batches} batches"
    );
}

/// Starts `ringlog-loadgen run` against the broker on `port` with `args`,
/// its stdout piped, its report under `dir`.
fn start_run(dir: &std::path::Path, port: u16, args: &str) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_ringlog-loadgen"))
        .args(["run", "--bootstrap", &format!("127.0.0.1:{port}")])
        .args(args.split_whitespace())
        .arg("--report-dir")
        .arg(dir.join("report"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for `run` to end, at most `within`; kills it and returns `None`
/// past that. `Some` holds its exit status and what it printed.
fn wait_ending(
    run: &mut std::process::Child,
    within: std::time::Duration,
) -> Option<(std::process::ExitStatus, String)> {
    let deadline = std::time::Instant::now() + within;
    let status = loop {
        if let Some(status) = run.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() >= deadline {
            let _ = run.kill();
            let _ = run.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut run.stdout.take().unwrap(), &mut stdout).unwrap();
    Some((status, stdout))
}

/// Runs `args` against a fresh broker, does `fail` to the broker 3 s in,
/// and waits at most `within` for the run to end (`wait_ending`); `recover`
/// is done to the broker before the outcome is returned, whatever it is.
fn run_with_failing_broker(
    args: &str,
    fail: impl FnOnce(&mut RealBroker),
    recover: impl FnOnce(&mut RealBroker),
    within: std::time::Duration,
) -> Option<(std::process::ExitStatus, String)> {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port_block(2);
    let mut broker = RealBroker::start(&dir.path().join("data"), port);
    let mut run = start_run(dir.path(), port, args);
    std::thread::sleep(std::time::Duration::from_secs(3));
    fail(&mut broker);
    let ended = wait_ending(&mut run, within);
    recover(&mut broker);
    ended
}

/// A run whose broker dies part-way still ends by itself: batches that no
/// leader could take within the delivery timeout count as errors, instead
/// of the run waiting for a broker that is gone.
#[test]
fn a_run_whose_broker_dies_ends_within_its_delivery_timeout() {
    // Sending ends 7 s in, the last batches fail 2 s later; 60 s is
    // generous beside that, far short of forever.
    let (status, stdout) = run_with_failing_broker(
        "--topic gone --partitions 4 --rate 5000 --duration 6s --warmup 1s --consumers 0 --delivery-timeout 2s",
        RealBroker::kill9,
        |_| {},
        std::time::Duration::from_secs(60),
    )
    .expect("the load generator still ran 60 s after its broker died");
    // Whether it ends by reporting the failed sends or by failing to take
    // a new producer id for the rest, it must say the run failed.
    assert!(!status.success(), "the run reported success:\n{stdout}");
}

/// A broker that stops answering without closing its connections (SIGSTOP:
/// a hung process, or a host gone from the network) must not hold the run
/// forever either: requests in flight time out, their batches are retried
/// until the delivery timeout, and the run ends and says it failed.
#[test]
fn a_run_whose_broker_hangs_ends_and_reports_the_failure() {
    let (status, stdout) = run_with_failing_broker(
        "--topic hung --partitions 4 --rate 5000 --duration 6s --warmup 1s --consumers 2 --delivery-timeout 2s",
        |broker| broker.signal("STOP"),
        |broker| broker.signal("CONT"),
        std::time::Duration::from_secs(90),
    )
    .expect("the load generator still ran 90 s after its broker hung");
    assert!(!status.success(), "the run reported success:\n{stdout}");
}

/// CPU time (user + system) a process has used so far, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// A producer whose buffer is full (the broker answers nothing) has nothing
/// to do until an answer frees room: it must wait for one, not spin on its
/// overdue schedule and take a core from the broker it measures.
#[test]
fn a_producer_with_a_full_buffer_waits_without_spinning() {
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let port = free_port_block(2);
    let broker = RealBroker::start(&dir.path().join("data"), port);
    let mut run = start_run(
        dir.path(),
        port,
        "--topic full --partitions 4 --rate 200000 --duration 8s --warmup 1s --consumers 0 --delivery-timeout 60s",
    );
    std::thread::sleep(Duration::from_secs(2));
    broker.signal("STOP");
    // 200k msgs/s of 500 B fill both workers' 64 MiB well within this.
    std::thread::sleep(Duration::from_secs(2));
    let ticks_per_s = 100;
    let before = cpu_ticks(run.id());
    std::thread::sleep(Duration::from_secs(3));
    let used = cpu_ticks(run.id()) - before;
    broker.signal("CONT");
    let _ = run.kill();
    let _ = run.wait();
    assert!(
        used < 3 * ticks_per_s / 4,
        "the load generator used {used} ticks of CPU in 3 s waiting on a stopped broker"
    );
}

/// A run whose standard output cannot be written (a log on a full disk, a
/// pipe whose reader left) still runs to its end and writes its report:
/// its progress lines are lost, not the run.
#[test]
fn a_run_with_a_full_standard_output_still_writes_its_report() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port_block(2);
    let _broker = RealBroker::start(&dir.path().join("data"), port);
    let report = dir.path().join("report");
    let status = Command::new(env!("CARGO_BIN_EXE_ringlog-loadgen"))
        .args(["run", "--bootstrap", &format!("127.0.0.1:{port}")])
        .args(
            "--topic quiet --partitions 2 --rate 1000 --duration 2s --warmup 0s".split_whitespace(),
        )
        .arg("--report-dir")
        .arg(&report)
        .stdout(
            std::fs::File::options()
                .write(true)
                .open("/dev/full")
                .unwrap(),
        )
        .stderr(
            std::fs::File::options()
                .write(true)
                .open("/dev/full")
                .unwrap(),
        )
        .status()
        .unwrap();
    assert!(status.success(), "{status}");
    assert!(report.join("result.json").exists());
}
