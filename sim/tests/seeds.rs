//! The simulator in CI: a fixed range of seeds must pass (a failure prints
//! its seed, trace and replay command), a seed must replay exactly, and the
//! checker must catch a planted bug (acks=all answered on the leader's
//! append alone), so a pass means something.

use sim::{run, Options};

/// Seeds per CI run; `SIM_SEEDS` overrides (the soak command runs far more).
const CI_SEEDS: u64 = 300;

#[test]
fn seeds_pass() {
    let seeds = std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CI_SEEDS);
    let options = Options::default();
    let mut acked_all = 0;
    let mut failures = Vec::new();
    for seed in 0..seeds {
        match run(seed, &options) {
            Ok(report) => {
                assert!(report.faults > 0, "seed {seed} injected no fault");
                assert!(report.committed > 0, "seed {seed} committed nothing");
                acked_all += report.acked_all;
            }
            Err(failure) => failures.push(failure.to_string()),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(
        acked_all > seeds * 100,
        "too few acks=all writes checked: {acked_all}"
    );
}

#[test]
fn a_seed_replays_exactly() {
    let options = Options::default();
    let a = run(7, &options).expect("seed 7 passes");
    let b = run(7, &options).expect("seed 7 passes");
    assert_eq!(
        (
            a.events,
            a.faults,
            a.acked_all,
            a.acked_one,
            a.consumed,
            a.committed
        ),
        (
            b.events,
            b.faults,
            b.acked_all,
            b.acked_one,
            b.consumed,
            b.committed
        )
    );
    let c = run(8, &options).expect("seed 8 passes");
    assert_ne!(a.events, c.events, "another seed is another run");
}

#[test]
fn the_checker_catches_acks_all_answered_before_replication() {
    let options = Options {
        plant_ack_on_append: true,
        ..Options::default()
    };
    let caught = (0..40).find_map(|seed| run(seed, &options).err());
    let failure = caught.expect("some seed loses an acks=all write answered on append");
    assert!(
        failure.violation.contains("acks=all") || failure.violation.contains("acknowledged"),
        "{failure}"
    );
}
