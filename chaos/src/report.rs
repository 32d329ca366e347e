//! The suite's results as a Markdown table (the form docs/reliability.md
//! shows) and as JSON.

use std::fmt::Write as _;

use crate::scenario::Outcome;

pub fn markdown(outcomes: &[Outcome]) -> String {
    let mut out = String::new();
    out.push_str(
        "| scenario | result | sent | acknowledged | lost | duplicated | offsets with two values | vanished reads | longest unavailability | batches retried | verify-log | problems |\n",
    );
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for o in outcomes {
        let result = match (&o.skipped, o.passed()) {
            (Some(why), _) => format!("skipped ({why})"),
            (None, true) => "pass".to_owned(),
            (None, false) => "**FAIL**".to_owned(),
        };
        let verify_log = if o.verify_log_problems.is_empty() {
            format!("{} dirs clean", o.replica_dirs_checked)
        } else {
            format!("{} problems", o.verify_log_problems.len())
        };
        let _ = writeln!(
            out,
            "| {} | {result} | {} | {} | {} | {} | {} | {} | {} ms | {} | {verify_log} | {} |",
            o.scenario,
            o.published,
            o.counts.acknowledged,
            o.counts.lost,
            o.counts.duplicated,
            o.counts.offsets_with_two_values + o.counts.acked_offset_mismatches,
            o.counts.vanished_reads,
            o.longest_unavailability_ms,
            o.retried_batches,
            o.problems.len(),
        );
    }
    out
}

/// The problems behind a failing table, one block per scenario.
pub fn details(outcomes: &[Outcome]) -> String {
    let mut out = String::new();
    for o in outcomes.iter().filter(|o| !o.passed()) {
        let _ = writeln!(out, "### {}", o.scenario);
        let _ = writeln!(out, "{:?}", o.counts);
        for problem in o.problems.iter().chain(&o.verify_log_problems) {
            let _ = writeln!(out, "- {problem}");
        }
    }
    out
}
