//! The shard simulation in CI: the broker's own shard, behind the simulated
//! network and disk, must keep and serve every acknowledged record through
//! kill -9 and power losses for a fixed range of seeds (some committing
//! through a shard journal, replayed at each start); a seed must replay
//! exactly; a long-lived connection must carry thousands of requests without
//! its reader piling up wakers (the bug that once aborted a broker in a long
//! load run); and the checker must see the losses a power loss causes when
//! acks do not wait for syncs (so a pass means something).

use broker::runtime::sim::WAKER_CLONES_MAX;
use sim::shard::{run, ShardOptions};

/// Seeds per CI run; `SIM_SHARD_SEEDS` overrides.
const CI_SEEDS: u64 = 12;

#[test]
fn shard_seeds_pass() {
    let seeds = std::env::var("SIM_SHARD_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CI_SEEDS);
    let options = ShardOptions::default();
    let mut failures = Vec::new();
    let (mut acked, mut kills, mut power_losses, mut read_back, mut consumed) = (0, 0, 0, 0, 0);
    let (mut journal_rounds, mut journal_replayed) = (0, 0);
    for seed in 0..seeds {
        match run(seed, &options) {
            Ok(report) => {
                assert!(report.acked_batches > 0, "seed {seed} acknowledged nothing");
                acked += report.acked_batches;
                kills += report.kills;
                power_losses += report.power_losses;
                read_back += report.records_read_back;
                consumed += report.records_consumed;
                journal_rounds += report.journal_rounds;
                journal_replayed += report.journal_writes_replayed;
            }
            Err(failure) => failures.push(failure.to_string()),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(kills > 0, "no seed killed the broker");
    assert!(power_losses > 0, "no seed cut the power");
    assert!(read_back > 0, "nothing was read back after a restart");
    assert!(consumed > 0, "the tailing consumer read nothing");
    assert!(acked > seeds * 100, "too few acknowledged batches: {acked}");
    // Seed 0 keeps a journal and replays it after a kill.
    assert!(journal_rounds > 0, "no seed committed through its journal");
    assert!(journal_replayed > 0, "no start replayed the journal");
}

/// A seed that lost an acknowledged batch through the request path when a
/// journal checkpoint synced a segment file before a write handed to the
/// journal in flight had landed in it (the wait reverted).
#[test]
fn a_seed_that_caught_a_checkpoint_passing_a_write_in_flight_passes() {
    let report = run(120, &ShardOptions::default()).expect("seed 120 passes");
    assert!(
        report.journal_rounds > 0,
        "seed 120 committed through its journal"
    );
    assert!(report.power_losses > 0, "seed 120 cut the power");
}

#[test]
fn a_shard_seed_replays_exactly() {
    let options = ShardOptions::default();
    let a = run(5, &options).expect("seed 5 passes");
    let b = run(5, &options).expect("seed 5 passes");
    assert_eq!(a, b);
    let c = run(6, &options).expect("seed 6 passes");
    assert_ne!(a, c, "another seed is another run");
    // Seed 6 commits through a shard journal.
    assert!(c.journal_rounds > 0, "seed 6 committed through its journal");
    assert_eq!(c, run(6, &options).expect("seed 6 passes"));
}

#[test]
fn a_long_connection_does_not_pile_up_wakers() {
    // Each request makes the connection's reader wait twice on its closing
    // signal; a waiter that added a waker per poll would pass the
    // executor's bound within this many requests on one connection.
    let options = ShardOptions {
        last_life_ms: 10_000,
        ..ShardOptions::default()
    };
    let report = run(0, &options).unwrap_or_else(|failure| panic!("{failure}"));
    assert!(
        report.longest_connection_requests > WAKER_CLONES_MAX as u64,
        "one connection carried only {} requests",
        report.longest_connection_requests
    );
}

#[test]
fn the_checker_sees_acks_lost_to_a_power_loss_when_acks_do_not_wait_for_syncs() {
    let options = ShardOptions {
        power_loss_under_any_policy: true,
        ..ShardOptions::default()
    };
    // Every third seed runs with flush.policy=none.
    let caught = (0..30)
        .filter(|seed| seed % 3 == 2)
        .find_map(|seed| run(seed, &options).err());
    let failure = caught.expect("a power loss loses records acknowledged before their sync");
    assert!(
        failure.violation.contains("gone after the restart"),
        "{failure}"
    );
}
