#!/usr/bin/env bash
# Apache Iggy on this host as a side-by-side peer for the performance
# figures. Iggy is not built here: IGGY_DIR names a checkout of its public
# source where `cargo build --release -p server -p iggy-bench` has been run
# (the server reads core/server/config.toml from there). For each workload
# the script starts a fresh Iggy server (its defaults: one shard per core,
# pinned, no fsync unless the bench asks for it) and runs Iggy's own
# iggy-bench, then a fresh Ringlog broker and the load generator at the
# same workload, one after the other, and prints one markdown table with
# the ratio of the rates. Both sides: 500 B messages, two producers
# (Iggy: two streams of one partition each, batches of PEER_IGGY_BATCH
# messages, one batch in flight per producer; Ringlog: 16 partitions,
# 64 KiB batches), acks after the leader's write.
#
#   IGGY_DIR=/path/to/iggy scripts/iggy-peer.sh
#
# Environment: PEER_WORK (default target/iggy-peer), PEER_SECONDS (Ringlog's
# measured seconds per workload, default 20), PEER_IGGY_BYTES (Iggy's total
# bytes per workload, default 6GB), PEER_IGGY_FSYNC_BYTES (the same with
# fsync, default 3GB), PEER_IGGY_BATCH (default 1000, Iggy's own default),
# PEER_RATE (msgs/s offered in the fixed-rate workload, default 300000).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

iggy="${IGGY_DIR:?set IGGY_DIR to an Iggy checkout with iggy-server and iggy-bench built in target/release}"
iggy="$(cd "$iggy" && pwd)"
for bin in iggy-server iggy-bench; do
    if [ ! -x "$iggy/target/release/$bin" ]; then
        echo "no $iggy/target/release/$bin: build it there first" >&2
        exit 2
    fi
done
work="${PEER_WORK:-target/iggy-peer}"
seconds="${PEER_SECONDS:-20}"
iggy_bytes="${PEER_IGGY_BYTES:-6GB}"
iggy_batch="${PEER_IGGY_BATCH:-1000}"
rate="${PEER_RATE:-300000}"
mkdir -p "$work"
work="$(cd "$work" && pwd)"
stamp="$(date +%Y%m%d-%H%M%S)"
port=19392

cargo build --release --workspace --locked -q

# iggy_run LABEL ARGS...: one bench against a fresh server; prints the
# bench's "Producers Results" line.
iggy_run() {
    local label=$1
    shift
    local data="$work/iggy-data-$stamp"
    rm -rf "$data"
    (cd "$iggy" && IGGY_SYSTEM_PATH="$data" exec target/release/iggy-server --fresh \
        --with-default-root-credentials) > "$work/$label-server.log" 2>&1 &
    local server=$!
    for _ in $(seq 1 100); do
        if (exec 3<>/dev/tcp/127.0.0.1/8090) 2>/dev/null; then break; fi
        sleep 0.1
    done
    sleep 1
    echo "iggy-bench -m 500 -P $iggy_batch $*" > "$work/$label.txt"
    (cd "$iggy" && timeout 600 target/release/iggy-bench -m 500 -P "$iggy_batch" "$@") \
        >> "$work/$label.txt" 2>&1 || echo "iggy-bench exited with $?" >&2
    kill -TERM "$server"
    wait "$server" || true
    rm -rf "$data"
    grep -a 'Producers Results' "$work/$label.txt" | tail -1 | sed 's/\x1b\[[0-9;]*m//g'
}

# ringlog_run LABEL LOADGEN_ARGS...: one scenario against a fresh broker;
# prints "msgs/s p50 p99": messages acknowledged per second, averaged over
# the measured seconds of the schedule (warm-up and the final drain left
# out), and publish latency over the measured window.
ringlog_run() {
    local label=$1
    shift
    local data="$work/ringlog-data-$stamp"
    rm -rf "$data"
    target/release/ringlog-broker --node-id 1 --data-dir "$data" --listen "127.0.0.1:$port" \
        > "$work/$label-broker.log" 2>&1 &
    local broker=$!
    for _ in $(seq 1 100); do
        if target/release/ringlog --bootstrap "127.0.0.1:$port" topic list >/dev/null 2>&1; then break; fi
        sleep 0.1
    done
    target/release/ringlog-loadgen run --bootstrap "127.0.0.1:$port" --scenario 1m-500b \
        --duration "${seconds}s" --warmup 3s --report-dir "$work/$label" "$@" \
        > "$work/$label.txt" 2>&1 || echo "ringlog-loadgen exited with $?" >&2
    kill -TERM "$broker"
    wait "$broker" || true
    rm -rf "$data"
    python3 - "$work/$label/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
# One rate per second of the run; the drain after the schedule ends is a
# last, shorter interval.
end = r["warmupS"] + r["durationS"]
at = r["elapsedSeconds"]
rates = [rate for i, rate in enumerate(r["publishRate"])
         if r["warmupS"] + 0.5 < at[i] <= end + 0.5 and at[i] - at[i - 1] > 0.5]
print(f'{sum(rates) / len(rates):.0f} '
      f'{r["aggregatedPublishLatency50pct"]:.2f} {r["aggregatedPublishLatency99pct"]:.2f}')
PY
}

iggy_fields() { # "msgs/s p50 p99" from a Producers Results line
    sed -E 's/.* ([0-9.]+) messages\/s.* p50 latency: ([0-9.]+) ms.* p99 latency: ([0-9.]+) ms.*/\1 \2 \3/'
}

rows=()
# workload | iggy args | ringlog args
run_pair() {
    local name=$1 iggy_args=$2 ringlog_args=$3 label
    local i_rate="" i_p50="" i_p99="" r_rate="" r_p50="" r_p99=""
    label="$(echo "$name" | tr ' ,=' '---' | tr -cd 'a-z0-9-')"
    # shellcheck disable=SC2086
    read -r i_rate i_p50 i_p99 < <(iggy_run "iggy-$label" $iggy_args | iggy_fields) || true
    # shellcheck disable=SC2086
    read -r r_rate r_p50 r_p99 < <(ringlog_run "ringlog-$label" $ringlog_args) || true
    if [ -z "${i_rate:-}" ] || [ -z "${r_rate:-}" ]; then
        rows+=("| $name | failed: see $work/iggy-$label.txt and $work/ringlog-$label.txt |")
        echo "${rows[-1]}"
        return
    fi
    rows+=("$(python3 -c '
import sys
name, i_rate, i_lat, r_rate, r_lat = sys.argv[1:]
i_rate, r_rate = float(i_rate), float(r_rate)
print(f"| {name} | {i_rate:,.0f} | {i_lat} | {r_rate:,.0f} | {r_lat} | {r_rate / i_rate:.2f} |")
' "$name" "$i_rate" "$i_p50 / $i_p99" "$r_rate" "$r_p50 / $r_p99")")
    echo "${rows[-1]}"
}

fsync_bytes="${PEER_IGGY_FSYNC_BYTES:-3GB}"
rate_bytes=$((rate * 500))
run_pair "producers only, no fsync" \
    "-T $iggy_bytes pinned-producer --streams 2 --producers 2 tcp" \
    "--rate 0 --producers 2 --consumers 0 --topic-config flush.policy=none"
run_pair "producers only, fsync before ack" \
    "-T $fsync_bytes --enforce-fsync pinned-producer --streams 2 --producers 2 tcp" \
    "--rate 0 --producers 2 --consumers 0"
run_pair "two producers and two consumers, no fsync" \
    "-T $iggy_bytes pinned-producer-and-consumer --streams 2 --producers 2 --consumers 2 tcp" \
    "--rate 0 --producers 2 --topic-config flush.policy=none"
# Iggy's rate limit covers every actor, consumers too: twice the bytes.
run_pair "$rate msgs/s offered, two consumers, no fsync" \
    "-T $iggy_bytes -r $((rate_bytes * 2))B pinned-producer-and-consumer --streams 2 --producers 2 --consumers 2 tcp" \
    "--rate $rate --producers 2 --topic-config flush.policy=none"

{
    echo "Iggy $(git -C "$iggy" rev-parse --short HEAD 2>/dev/null || echo '(no git)') against Ringlog $(git rev-parse --short HEAD), $(date -u +%Y-%m-%d)"
    echo
    echo "| workload | Iggy msgs/s | Iggy p50 / p99 ms (per batch) | Ringlog msgs/s | Ringlog publish p50 / p99 ms | Ringlog / Iggy |"
    echo "| --- | ---: | --- | ---: | --- | ---: |"
    printf '%s\n' "${rows[@]}"
} | tee "$work/iggy-peer-$stamp.md"
echo
echo "table: $work/iggy-peer-$stamp.md"
