#!/usr/bin/env bash
# Flame graphs of the hot paths: starts a broker on a fresh data directory,
# runs a load-generator scenario against it, samples the whole machine with
# perf (DWARF call graphs, so the release build needs no frame pointers;
# system-wide, so io_uring's kernel worker threads count with the broker they
# work for), and renders one SVG per process with inferno:
#   OUT/LABEL-broker.svg, OUT/LABEL-loadgen.svg
# with their folded stacks (OUT/LABEL-*.folded, one line per stack), and
# OUT/LABEL-summary.txt (the run's latency table and CPU line, and the
# perf command line).
#
# Environment: SCENARIO (default 1m-500b), LOADGEN_ARGS (extra flags for
# ringlog-loadgen run), LABEL (names the files; default SCENARIO), RECORD_S (seconds sampled, default 6, taken after the
# warmup), PERF_HZ (samples a second per CPU, default 199), OUT (default
# target/flamegraphs), RINGLOG_PORT (default 9592).
# Needs root or kernel.perf_event_paranoid <= -1 for system-wide samples.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scenario="${SCENARIO:-1m-500b}"
label="${LABEL:-$scenario}"
record_s="${RECORD_S:-6}"
hz="${PERF_HZ:-199}"
out="${OUT:-target/flamegraphs}"
port="${RINGLOG_PORT:-9592}"
tools="$(pwd)/target/tools"

scripts/setup.sh
if ! command -v perf >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && apt-get install -y -qq linux-perf
    else
        sudo apt-get update -qq && sudo apt-get install -y -qq linux-perf
    fi
fi
if [ ! -x "$tools/bin/inferno-flamegraph" ]; then
    cargo install --locked --quiet --root "$tools" inferno --version 0.12.3
fi
cargo build --release --workspace --locked

work="$(mktemp -d)"
mkdir -p "$out"
target/release/ringlog-broker --node-id 1 --data-dir "$work/data" --listen "127.0.0.1:$port" \
    > "$work/broker.log" 2>&1 &
broker=$!
loadgen=""
cleanup() {
    [ -n "$loadgen" ] && kill "$loadgen" 2>/dev/null || true
    kill -TERM "$broker" 2>/dev/null || true
    wait "$broker" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 1 100); do
    if target/release/ringlog --bootstrap "127.0.0.1:$port" topic list >/dev/null 2>&1; then break; fi
    sleep 0.1
done

# Warmup 3 s; the run lasts long enough for the samples to fall inside it.
# shellcheck disable=SC2086
target/release/ringlog-loadgen run --bootstrap "127.0.0.1:$port" --scenario "$scenario" \
    --warmup 3s --duration "$((record_s + 4))s" --report-dir "$work/report" ${LOADGEN_ARGS:-} \
    > "$work/loadgen.log" 2>&1 &
loadgen=$!
loadgen_pid=$loadgen
# The loadgen creates the topic, then warms up: sample inside the measured part.
sleep 5
perf_cmd=(perf record -a -F "$hz" --call-graph dwarf,16384 -o "$work/perf.data" -- sleep "$record_s")
"${perf_cmd[@]}" 2> "$work/perf.log"
wait "$loadgen" || echo "load generator exited with $?"
loadgen=""

render() { # name pid
    perf script -i "$work/perf.data" --pid "$2" 2>/dev/null \
        | "$tools/bin/inferno-collapse-perf" --all > "$out/$label-$1.folded"
    # Frames under a pixel wide are left out: the picture stays readable
    # and small enough to keep beside the numbers.
    "$tools/bin/inferno-flamegraph" --title "$scenario: $1 ($record_s s at $hz Hz per CPU)" \
        --width 1600 --minwidth 1 < "$out/$label-$1.folded" > "$out/$label-$1.svg"
    echo "wrote $out/$label-$1.svg (stacks in $out/$label-$1.folded)"
}
render broker "$broker"
render loadgen "$loadgen_pid"

{
    echo "scenario $scenario, LOADGEN_ARGS='${LOADGEN_ARGS:-}', $(nproc) CPUs, $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "${perf_cmd[*]}"
    grep -E "^(latency|publish-|end-to-end)|^published|^cpu over|^load generator threads" "$work/loadgen.log"
    echo "broker shards pinned to CPUs $(grep -o 'shard_cpus=\[[^]]*\]' "$work/broker.log" | head -1 | cut -d= -f2)"
} | tee "$out/$label-summary.txt"
