#!/usr/bin/env bash
# The deterministic simulator on a release build. CI runs a fixed range of
# seeds (cargo test -p sim); this is the long form for soak testing, from a
# random first seed unless one is given:
#
#   scripts/sim.sh --seeds 20000            # soak: 20,000 seeds from a random start
#   scripts/sim.sh --seed 1234 --trace      # replay one seed with its full trace
#   scripts/sim.sh --storage --seeds 2000   # the storage simulation (the real partition log)
#   scripts/sim.sh --shard --seeds 500      # the shard simulation (the real request path)
#   scripts/sim.sh --replicated --seeds 200 # the replicated simulation (three real brokers)
#
# Each failing seed prints its violation, the trace leading to it and the
# command that replays it; the exit status is non-zero if any seed failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

cargo build --release --locked -p sim --bin ringlog-sim
args=("$@")
if [[ " ${args[*]} " != *" --seed "* && " ${args[*]} " != *" --first "* ]]; then
    first=$(( (RANDOM << 15 | RANDOM) * 1000 ))
    echo "first seed: $first"
    args+=(--first "$first")
fi
exec target/release/ringlog-sim "${args[@]}"
