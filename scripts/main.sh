#!/usr/bin/env bash
# The main job: build the release binaries, start a local broker, run the
# headline load-generator scenario (1M msgs/s of 500 B for 30 s, open loop)
# against it, stop the broker cleanly, and leave the report directory path on
# screen. Also records this machine's loopback TCP bandwidth (iperf3, when it
# can be installed) as the ceiling the run is measured against.
#
# Environment: RINGLOG_PORT (default 9092), RINGLOG_WORK (default target/main-job),
# LOADGEN_ARGS (extra flags for ringlog-loadgen run, e.g. "--duration 60s",
# "--consumer-groups 3" to read everything through three consumer groups, or
# "--cpus 1" to pin the load generator's threads),
# MAIN_CONSUMER_GROUP (default main-job: the consumers read as members of this
# consumer group, committing every second; empty: plain assigned consumers).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh
cargo build --release --workspace --locked

port="${RINGLOG_PORT:-9092}"
work="${RINGLOG_WORK:-target/main-job}"
stamp="$(date +%Y%m%d-%H%M%S)"
data="$work/data-$stamp"
report="$work/report-$stamp"
mkdir -p "$work"

scripts/ceilings.sh | tee "$work/ceilings-$stamp.txt"

target/release/ringlog-broker --node-id 1 --data-dir "$data" --listen "127.0.0.1:$port" \
    > "$work/broker-$stamp.log" 2>&1 &
broker=$!
trap 'kill -TERM $broker 2>/dev/null || true; wait $broker 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
    if target/release/ringlog --bootstrap "127.0.0.1:$port" topic list >/dev/null 2>&1; then break; fi
    sleep 0.1
done

# shellcheck disable=SC2086
group="${MAIN_CONSUMER_GROUP-main-job}"
target/release/ringlog-loadgen run --bootstrap "127.0.0.1:$port" --scenario 1m-500b \
    --report-dir "$report" ${group:+--consumer-group "$group"} ${LOADGEN_ARGS:-} || echo "load generator exited with $?"

# Beside the load generator's own line ("load generator threads: ..."),
# where the broker's shards ran: both share this machine's cores.
echo "broker shards pinned to CPUs $(grep -o 'shard_cpus=\[[^]]*\]' "$work/broker-$stamp.log" | head -1 | cut -d= -f2)"

kill -TERM $broker
wait $broker || true
trap - EXIT
# A 30 s run writes about 15 GB; keep it only when asked (KEEP_DATA=1).
if [ "${KEEP_DATA:-0}" != "1" ]; then
    rm -rf "$data"
fi
echo
echo "broker log: $work/broker-$stamp.log"
echo "report directory: $(pwd)/$report"
