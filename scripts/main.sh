#!/usr/bin/env bash
# The main job: build the release binaries and produce the current performance
# report. Today that is the storage engine's throughput report (appends and
# reads through the partition log against the raw direct-write rate of this
# machine's disk); it grows into "start a local cluster and run the load
# generator" as the network broker and load generator land.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh
cargo build --release --workspace --locked
RINGLOG_BENCH_SUMMARY_ONLY=1 cargo bench --locked -p benches --bench log
echo
echo "binaries:   $(pwd)/target/release/ringlog-broker"
echo "report:     $(pwd)/target/bench-results/log.json"
