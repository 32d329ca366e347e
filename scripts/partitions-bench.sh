#!/usr/bin/env bash
# Times target 5's control-plane steps on one broker of two shards: create a
# topic of PARTITIONS partitions (answered once every shard serves it), clean
# shutdown, restart until every shard serves and leads its share, and until
# the last new leader's epoch history is saved (the newest partition
# directory's modification time: its last rename). RUNS times, each on a
# fresh file system: a journalled ext4 loop image when run as root (the
# root file system of a test machine may have no journal, or remember
# thousands of just-deleted inodes), else a temporary directory.
#
#   scripts/partitions-bench.sh                 # 10000 partitions, 3 runs
#   PARTITIONS=2000 RUNS=1 scripts/partitions-bench.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PARTITIONS=${PARTITIONS:-10000}
RUNS=${RUNS:-3}
PORT=${PORT:-19392}
cargo build --release --locked --bin ringlog-broker --bin ringlog >&2
BROKER=target/release/ringlog-broker
CLI=target/release/ringlog
work=$(mktemp -d /tmp/ringlog-partitions-bench.XXXXXX)
mnt="$work/mnt"
mkdir -p "$mnt"
broker_pid=""

cleanup() {
    if [ -n "$broker_pid" ]; then kill -9 "$broker_pid" 2>/dev/null || true; fi
    if mountpoint -q "$mnt"; then umount "$mnt" || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

loop_image() {
    [ "$(id -u)" = 0 ] && command -v mkfs.ext4 >/dev/null && command -v mount >/dev/null
}

start_broker() { # log file
    "$BROKER" --node-id 1 --data-dir "$mnt/data" --listen "127.0.0.1:$PORT" >"$1" 2>&1 &
    broker_pid=$!
}

stop_broker() { # sets stopped_s (not in a subshell: the broker is this shell's child)
    local t0 t1
    t0=$(date +%s.%N)
    kill -TERM "$broker_pid"
    wait "$broker_pid" || true
    t1=$(date +%s.%N)
    broker_pid=""
    stopped_s=$(echo "$t1 - $t0" | bc)
}

wait_listening() {
    for _ in $(seq 1 300); do
        "$CLI" --bootstrap "127.0.0.1:$PORT" topic list >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "broker did not answer within 30 s" >&2
    return 1
}

log_time() { # log file, pattern, first|last: seconds since the epoch
    local line
    line=$(sed 's/\x1b\[[0-9;]*m//g' "$1" | grep -E "$2" | { if [ "$3" = first ]; then head -1; else tail -1; fi })
    date -d "$(echo "$line" | cut -c1-26)" +%s.%N
}

if loop_image; then
    where="fresh 4 GiB journalled ext4 loop image per run"
else
    where="temporary directory on $(df --output=fstype /tmp | tail -1) (not root: no loop image)"
fi
echo "# $PARTITIONS partitions, one broker of two shards, $where"
echo "| run | create (s) | clean shutdown (s) | restart to serving (s) | restart to epoch histories saved (s) |"
echo "| --- | ---: | ---: | ---: | ---: |"
for run in $(seq 1 "$RUNS"); do
    if loop_image; then
        truncate -s 4G "$work/img"
        mkfs.ext4 -q -F "$work/img"
        mount -o loop "$work/img" "$mnt"
    fi
    start_broker "$work/first.log"
    wait_listening
    t0=$(date +%s.%N)
    "$CLI" --bootstrap "127.0.0.1:$PORT" topic create --partitions "$PARTITIONS" big >"$work/create.txt" 2>&1
    t1=$(date +%s.%N)
    create=$(echo "$t1 - $t0" | bc)
    sleep 1
    stop_broker
    shutdown=$stopped_s
    start_broker "$work/second.log"
    # Serving: every shard ready; epochs: nothing renamed for 3 s.
    for _ in $(seq 1 600); do
        ready=$(sed 's/\x1b\[[0-9;]*m//g' "$work/second.log" | grep -c "shard ready" || true)
        [ "$ready" -ge 2 ] && break
        sleep 0.1
    done
    newest=0
    for _ in $(seq 1 120); do
        sleep 1
        now=$(find "$mnt/data/topics" -mindepth 1 -maxdepth 1 -type d -printf '%T@\n' | sort -n | tail -1)
        if [ "$now" = "$newest" ]; then break; fi
        newest=$now
    done
    started=$(log_time "$work/second.log" "starting broker" first)
    served=$(log_time "$work/second.log" "shard ready" last)
    restart=$(echo "$served - $started" | bc)
    epochs=$(echo "$newest - $started" | bc)
    stop_broker
    printf '| %s | %.2f | %.2f | %.2f | %.2f |\n' "$run" "$create" "$shutdown" "$restart" "$epochs"
    if mountpoint -q "$mnt"; then umount "$mnt"; rm -f "$work/img"; else rm -rf "${mnt:?}/data"; fi
done
