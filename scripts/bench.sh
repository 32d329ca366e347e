#!/usr/bin/env bash
# Runs the load generator's scenarios one after another, each against a
# fresh broker (rf3-acks-all against a fresh three-broker cluster from
# scripts/cluster.sh), measures the machine's own ceilings in the same run
# (iperf3 on loopback, dd oflag=direct) and writes one table:
#   scripts/bench.sh                       every scenario
#   scripts/bench.sh 1m-500b max-rate      the named ones
# A scenario name may carry a flush policy, max-rate@none, for the same run
# with --topic-config flush.policy=none. BENCH_ARGS is passed to every run
# (BENCH_ARGS="--duration 60s" for the issue's 60 s runs); BENCH_WORK is where
# data, logs and reports go (default target/bench). The table lands in
# BENCH_WORK/bench-STAMP.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh
cargo build --release --workspace --locked

work="${BENCH_WORK:-target/bench}"
stamp="$(date +%Y%m%d-%H%M%S)"
out="$work/run-$stamp"
mkdir -p "$out"
table="$work/bench-$stamp.md"
bin=target/release
port=9092
if [ "$#" -gt 0 ]; then
    scenarios=("$@")
else
    scenarios=(1m-500b max-rate max-rate@none catch-up rf3-acks-all many-partitions)
fi

wait_for_broker() {
    for _ in $(seq 1 300); do
        if "$bin/ringlog" --bootstrap "$1" topic list >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    echo "broker at $1 did not answer" >&2
    return 1
}

{
    echo "# Ringlog benchmark, $(date -u +%Y-%m-%dT%H:%MZ)"
    echo
    echo "Commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); $(nproc) cores; broker and load generator share them."
    echo
    echo "## Machine ceilings"
    echo
} > "$table"
scripts/ceilings.sh "$out" >> "$table"
{
    echo
    echo "## Scenarios"
    echo
    echo "| scenario | offered msgs/s | achieved msgs/s | MB/s in | publish p50 / p99 / p99.9 ms | publish delay p99 ms | end-to-end p99 ms | read MB/s | errors | cores: load generator / rest / hypervisor |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
} >> "$table"

for entry in "${scenarios[@]}"; do
    scenario="${entry%@*}"
    extra=()
    if [ "$entry" != "$scenario" ]; then
        extra=(--topic-config "flush.policy=${entry#*@}")
    fi
    report="$out/$entry"
    data="$out/data-$entry"
    echo "== $entry"
    if [ "$scenario" = rf3-acks-all ]; then
        scripts/cluster.sh start "$data"
        bootstrap=127.0.0.1:9192,127.0.0.1:9292,127.0.0.1:9392
        stop_cmd=(scripts/cluster.sh stop "$data")
    else
        "$bin/ringlog-broker" --node-id 1 --data-dir "$data" --listen "127.0.0.1:$port" \
            > "$out/broker-$entry.log" 2>&1 &
        broker=$!
        wait_for_broker "127.0.0.1:$port"
        bootstrap="127.0.0.1:$port"
        stop_cmd=(kill -TERM "$broker")
    fi
    # shellcheck disable=SC2086
    "$bin/ringlog-loadgen" run --bootstrap "$bootstrap" --scenario "$scenario" \
        --report-dir "$report" "${extra[@]}" ${BENCH_ARGS:-} > "$out/loadgen-$entry.log" 2>&1 \
        || echo "load generator exited with $? (log: $out/loadgen-$entry.log)"
    "${stop_cmd[@]}" || true
    if [ "$scenario" != rf3-acks-all ]; then wait "$broker" || true; fi
    rm -rf "$data"
    python3 - "$entry" "$report" >> "$table" <<'PY'
import json, os, sys
entry, report = sys.argv[1], sys.argv[2]
def row(name, r, offered):
    # The measured seconds: each interval ends after the warmup and by the
    # end of sending (the drain after it sends nothing), and is a whole
    # second (the first one closes the warmup, the drain's are short).
    start_s, end_s = r["warmupS"] + 0.5, r["warmupS"] + r["durationS"] + 0.5
    at = r["elapsedSeconds"]
    series = [rate for i, rate in enumerate(r["publishRate"])
              if start_s < at[i] <= end_s and (i == 0 or at[i] - at[i - 1] > 0.5)]
    achieved = sum(series) / len(series) if series else 0.0
    size = r["messageSize"]
    read = r["consumeRate"]
    read_mb = (sum(read) / len(read) if read else 0.0) * size / 1e6
    cpu = r.get("cpu")
    cores = (f"{cpu['loadgenCores']:.2f} / {cpu['otherCores']:.2f} / {cpu['stolenCores']:.2f}"
             if cpu else "")
    return (f"| {name} | {offered:,} | {achieved:,.0f} | {achieved * size / 1e6:,.0f} | "
            f"{r['aggregatedPublishLatency50pct']:.2f} / {r['aggregatedPublishLatency99pct']:.2f} / "
            f"{r['aggregatedPublishLatency999pct']:.2f} | {r['aggregatedPublishDelayLatency99pct']:.2f} | "
            f"{r['aggregatedEndToEndLatency99pct']:.2f} | {read_mb:,.0f} | {r['errors']} | {cores} |")
max_rate = os.path.join(report, "max-rate.json")
result = os.path.join(report, "result.json")
if os.path.exists(max_rate):
    summary = json.load(open(max_rate))
    best = summary.get("max_rate_msgs_per_s")
    dirs = [d for d in os.listdir(report) if d.startswith("step-") and d.endswith(f"-{best}")]
    if best and dirs:
        r = json.load(open(os.path.join(report, dirs[0], "result.json")))
        print(row(f"{entry} (highest rate held)", r, best))
    else:
        print(f"| {entry} | | no step held | | | | | | | |")
elif os.path.exists(result):
    r = json.load(open(result))
    print(row(entry, r, r["targetRateMsgsPerS"] if "targetRateMsgsPerS" in r else 0))
else:
    print(f"| {entry} | | no report (see loadgen-{entry}.log) | | | | | | | |")
PY
done
{
    echo
    echo "Rates, latencies and cores are over each run's measured phase (after its warmup);"
    echo "\"rest\" is everything on the host but the load generator: the broker, when alone;"
    echo "reports, logs and per-step results are in $out."
} >> "$table"
echo
cat "$table"
