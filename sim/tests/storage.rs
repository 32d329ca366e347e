//! The storage simulation in CI: the broker's partition log on the
//! deterministic runtime must keep every acknowledged record through kill -9
//! and power losses for a fixed range of seeds, a seed must replay exactly,
//! and the checker must see the losses a power loss causes when acks wait
//! only for the write, or only for a journal that is then not replayed (so
//! a pass means something).

use sim::storage::{run, StorageOptions};

/// Seeds per CI run; `SIM_STORAGE_SEEDS` overrides.
const CI_SEEDS: u64 = 48;

#[test]
fn storage_seeds_pass() {
    let seeds = std::env::var("SIM_STORAGE_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CI_SEEDS);
    let options = StorageOptions::default();
    let mut failures = Vec::new();
    let (mut acked, mut power_losses, mut truncations) = (0, 0, 0);
    let (mut journal_commits, mut replayed) = (0, 0);
    for seed in 0..seeds {
        match run(seed, &options) {
            Ok(report) => {
                assert!(report.acked_batches > 0, "seed {seed} acknowledged nothing");
                acked += report.acked_batches;
                power_losses += report.power_losses;
                truncations += report.truncations;
                journal_commits += report.journal_commits;
                replayed += report.journal_writes_replayed;
            }
            Err(failure) => failures.push(failure.to_string()),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(power_losses > 0, "no seed cut the power");
    assert!(truncations > 0, "no seed truncated");
    assert!(journal_commits > 0, "no commit went through a journal");
    assert!(replayed > 0, "no journal replay wrote anything back");
    assert!(acked > seeds * 50, "too few acknowledged batches: {acked}");
}

/// Seeds that lost acknowledged batches when a journal checkpoint synced a
/// segment file without waiting for the writes of the records it released
/// (handed to the journal while still in flight).
const CHECKPOINT_LANDING_SEEDS: [u64; 3] = [5150, 5153, 5165];

#[test]
fn seeds_that_caught_a_checkpoint_passing_a_write_in_flight_pass() {
    let options = StorageOptions::default();
    for seed in CHECKPOINT_LANDING_SEEDS {
        if let Err(failure) = run(seed, &options) {
            panic!("{failure}");
        }
    }
}

#[test]
fn a_storage_seed_replays_exactly() {
    let options = StorageOptions::default();
    let a = run(11, &options).expect("seed 11 passes");
    let b = run(11, &options).expect("seed 11 passes");
    assert_eq!(a, b);
    let c = run(12, &options).expect("seed 12 passes");
    assert_ne!(a, c, "another seed is another run");
    // Seed 5 commits through a shard journal, whose checkpoints sync their
    // files in the order they were first written, not a hash map's.
    let d = run(5, &options).expect("seed 5 passes");
    assert!(
        d.journal_commits > 0,
        "seed 5 committed through its journal"
    );
    assert_eq!(d, run(5, &options).expect("seed 5 passes"));
}

#[test]
fn the_checker_sees_acks_lost_to_a_power_loss_when_acks_do_not_wait_for_syncs() {
    let options = StorageOptions {
        power_loss_under_any_policy: true,
        ..StorageOptions::default()
    };
    // Seeds 0 and 1 of every three run with flush.policy interval or none.
    let caught = (0..30)
        .filter(|seed| seed % 3 != 2)
        .find_map(|seed| run(seed, &options).err());
    let failure = caught.expect("a power loss loses records acknowledged before their sync");
    assert!(
        failure.violation.contains("lost after recovery"),
        "{failure}"
    );
}

#[test]
fn acks_only_the_journal_held_are_lost_when_it_is_not_replayed() {
    let options = StorageOptions {
        drop_journal: true,
        ..StorageOptions::default()
    };
    // flush.policy=always with a journal attached: acks wait for its rounds,
    // and the segment files are synced only at checkpoints and closes.
    let caught = (0..60)
        .filter(|seed| seed % 3 == 2 && sim::storage::journal_used(*seed))
        .find_map(|seed| run(seed, &options).err());
    let failure = caught.expect("a power loss loses records only the journal held");
    assert!(
        failure.violation.contains("lost after recovery"),
        "{failure}"
    );
}
