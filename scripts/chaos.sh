#!/usr/bin/env bash
# The fault suite on release builds: every scenario in turn (kill -9 of a
# leader, SIGSTOP past a session, SIGTERM under load, kill -9 of every broker,
# controller failovers, a network partition of a leader, a full disk, a
# roll-heavy single broker), each judged by reading the topic back from disk
# after every broker restarted and by verify-log on every replica. CI runs the
# short form as a test (cargo test -p chaos); this script is the long form:
#
#   scripts/chaos.sh --duration 30m        # soak: repeat the scenarios for 30 min
#   scripts/chaos.sh --scenarios kill-leader,pause-leader --load 60s
#
# Network partitions and the full disk need root (network namespaces, a small
# tmpfs); without it those scenarios report themselves skipped. The table goes
# to standard output and to target/chaos/report.md (JSON beside it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh
cargo build --release --locked -p broker -p controller -p chaos --bins
mkdir -p target/chaos
exec target/release/ringlog-chaos \
    --work-dir target/chaos \
    --report target/chaos/report.md \
    --json target/chaos/report.json \
    "$@"
