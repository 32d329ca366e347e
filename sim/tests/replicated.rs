//! The replicated simulation in CI: three real brokers replicating over the
//! simulated network must keep every acks=all acknowledgement and every
//! batch consumers were served through kills (some with a power loss of
//! that broker alone, and brokers committing through a shard journal in
//! some seeds, replayed at each start), pauses, slow and cut links, connection resets, slow
//! disks, clock jumps and a whole-cluster kill with power loss, and
//! must take writes promptly with a full ISR once the faults are over, for a
//! fixed range of seeds; a seed must replay exactly; wall-clock jumps during
//! cuts must move neither the ISR nor acks=all deadlines, and a fenced
//! follower must not keep a cut-off one in the ISR; and the checker
//! must see acks=1 writes lost when they are counted as acks=all, and a
//! broker left down in the quiet period (so a pass means something).

use sim::replicated::{run, ReplicatedOptions};

/// Seeds per CI run; `SIM_REPLICATED_SEEDS` overrides.
const CI_SEEDS: u64 = 6;

#[test]
fn replicated_seeds_pass() {
    let seeds = std::env::var("SIM_REPLICATED_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CI_SEEDS);
    let options = ReplicatedOptions::default();
    let mut failures = Vec::new();
    let (mut acked_all, mut faults, mut read_back) = (0, 0, 0);
    let (mut journal_rounds, mut journal_replayed) = (0, 0);
    for seed in 0..seeds {
        match run(seed, &options) {
            Ok(report) => {
                assert!(report.acked_all > 0, "seed {seed} acknowledged nothing");
                assert!(
                    report.quiet_answers > 0,
                    "seed {seed} answered nothing in its quiet period"
                );
                acked_all += report.acked_all;
                faults += report.kills
                    + report.link_faults
                    + report.pauses
                    + report.slow_disks
                    + report.clock_jumps
                    + report.connections_reset;
                read_back += report.records_read_back;
                journal_rounds += report.journal_rounds;
                journal_replayed += report.journal_writes_replayed;
            }
            Err(failure) => failures.push(failure.to_string()),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(faults > 0, "no seed had a fault");
    assert!(read_back > 0, "nothing was read back");
    // Seed 0 keeps a journal, and the fixed range replays one after a kill.
    assert!(
        journal_rounds > 0,
        "no broker committed through its journal"
    );
    if seeds >= CI_SEEDS {
        assert!(journal_replayed > 0, "no start replayed a journal");
    }
    assert!(
        acked_all > seeds * 500,
        "too few acks=all batches: {acked_all}"
    );
}

#[test]
fn a_replicated_seed_replays_exactly() {
    let options = ReplicatedOptions::default();
    let a = run(3, &options).expect("seed 3 passes");
    let b = run(3, &options).expect("seed 3 passes");
    assert_eq!(a, b);
    // Seed 0's brokers commit through shard journals.
    let c = run(0, &options).expect("seed 0 passes");
    assert!(
        c.journal_rounds > 0,
        "seed 0 committed through its journals"
    );
    assert_eq!(c, run(0, &options).expect("seed 0 passes"));
}

#[test]
fn the_checker_sees_acks_one_writes_lost_when_counted_as_acks_all() {
    let options = ReplicatedOptions {
        acks_all_sent_as_acks_one: true,
        ..ReplicatedOptions::default()
    };
    let caught = (0..12).find_map(|seed| run(seed, &options).err());
    let failure = caught.expect("a failover loses acks=1 records");
    assert!(failure.violation.contains("acks=all"), "{failure}");
}

#[test]
fn wall_clock_jumps_move_neither_the_isr_nor_acks_all_deadlines() {
    let options = ReplicatedOptions {
        wall_clock_jumps_during_cuts: true,
        ..ReplicatedOptions::default()
    };
    for seed in 0..3 {
        if let Err(failure) = run(seed, &options) {
            panic!("{failure}");
        }
    }
}

#[test]
fn a_fenced_follower_does_not_keep_a_cut_off_one_in_the_isr() {
    let options = ReplicatedOptions {
        fenced_follower_during_cut: true,
        ..ReplicatedOptions::default()
    };
    for seed in 0..3 {
        if let Err(failure) = run(seed, &options) {
            panic!("{failure}");
        }
    }
}

#[test]
fn the_quiet_period_checks_see_a_broker_left_down() {
    let options = ReplicatedOptions {
        leave_a_broker_down: true,
        ..ReplicatedOptions::default()
    };
    let failure = run(0, &options).expect_err("a broker left down keeps an ISR short");
    assert!(failure.violation.contains("quiet period"), "{failure}");
}
