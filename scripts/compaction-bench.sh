#!/usr/bin/env bash
# Produce latency with the log cleaner at work against the same run without
# it: one local broker, a keyed topic (100 000 keys, 500 B values) written at
# RATE msgs/s for DURATION, once with cleanup.policy=delete and once with
# cleanup.policy=compact (small segments and a low dirty ratio, so the cleaner
# runs throughout). Prints each run's load-generator summary and the cleaner's
# counters. Bounded in time; traffic stays on 127.0.0.1.
# Environment: RATE (msgs/s, default 100000), DURATION (default 20s),
# CLEANER_IO (the cleaner's bytes/s per shard, default 8 MiB/s as the broker),
# POLICIES (default "delete compact"), COMPRESSION (none or zstd).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p broker -p loadgen -p client
rate="${RATE:-100000}"
duration="${DURATION:-20s}"
port="${RINGLOG_PORT:-9492}"
work="target/compaction-bench"
rm -rf "$work"
mkdir -p "$work"
printf '[cleaner]\nbackoff_ms = 1000\nio_bytes_per_sec_max = %s\n' "${CLEANER_IO:-8388608}" > "$work/broker.toml"
for policy in ${POLICIES:-delete compact}; do
    data="$work/data-$policy"
    target/release/ringlog-broker --node-id 1 --data-dir "$data" --listen "127.0.0.1:$port" \
        --config "$work/broker.toml" > "$work/broker-$policy.log" 2>&1 &
    broker=$!
    trap 'kill -TERM $broker 2>/dev/null || true; wait $broker 2>/dev/null || true' EXIT
    for _ in $(seq 1 100); do
        if target/release/ringlog --bootstrap "127.0.0.1:$port" topic list >/dev/null 2>&1; then break; fi
        sleep 0.1
    done
    echo "== cleanup.policy=$policy, $rate msgs/s for $duration"
    target/release/ringlog-loadgen run --bootstrap "127.0.0.1:$port" --topic "keyed-$policy" \
        --partitions 16 --replication-factor 1 --producers 2 --linger-ms 10 --rate "$rate" --duration "$duration" --warmup 5s \
        --acks 1 --consumers 0 --keys uniform:100000 --compression "${COMPRESSION:-none}" \
        --topic-config "cleanup.policy=$policy" --topic-config segment.bytes=16777216 \
        --topic-config min.cleanable.dirty.ratio=0.1 --report-dir "$work/report-$policy" \
        | grep -E "^(publish-latency|publish-delay|published) " || true
    curl -s "127.0.0.1:$((port + 64))/metrics" | grep -E '^ringlog_cleaner_(passes|read_bytes|written_bytes|removed_records)_total' || true
    du -sh "$data" | sed 's/^/data on disk: /'
    kill -TERM $broker
    wait $broker || true
    trap - EXIT
    rm -rf "$data"
done
