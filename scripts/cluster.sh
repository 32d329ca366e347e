#!/usr/bin/env bash
# Starts or stops a local three-controller, three-broker cluster on loopback,
# as the rf3-acks-all scenario expects it: controllers on 127.0.0.1:9301-9303,
# brokers on 127.0.0.1:9192, :9292 and :9392 (one shard each).
#   scripts/cluster.sh start DIR   data and logs under DIR; returns once all
#                                  three brokers are registered and unfenced
#   scripts/cluster.sh stop DIR    SIGTERM to every process it started
# RINGLOG_BROKER_ARGS, if set, is added to every broker's command line (for
# example "--config FILE" with `journal_ring_bytes_per_shard = 0`).
# Needs the release binaries (cargo build --release).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

action="${1:?usage: scripts/cluster.sh start|stop DIR}"
dir="${2:?usage: scripts/cluster.sh start|stop DIR}"
bin=target/release
controllers=127.0.0.1:9301,127.0.0.1:9302,127.0.0.1:9303
peers=1=127.0.0.1:9301,2=127.0.0.1:9302,3=127.0.0.1:9303
ready_wait_s_max=60

case "$action" in
start)
    mkdir -p "$dir"
    : > "$dir/pids"
    for i in 1 2 3; do
        "$bin/ringlog-controller" --node-id "$i" --listen "127.0.0.1:930$i" --peers "$peers" \
            --data-dir "$dir/c$i" > "$dir/controller-$i.log" 2>&1 &
        echo $! >> "$dir/pids"
    done
    # A broker pins its shard to the first CPU of its affinity mask: three
    # started alike would all run on CPU 0. Each gets the next CPU of this
    # script's mask in turn, as a cpuset would give each its own.
    read -ra cpus <<< "$(taskset -cp $$ | sed 's/.*: //' | tr ',' '\n' \
        | awk -F- '{ if (NF == 2) { for (c = $1; c <= $2; c++) print c } else print $1 }' | tr '\n' ' ')"
    for i in 1 2 3; do
        cpu="${cpus[$(( (i - 1) % ${#cpus[@]} ))]}"
        taskset -c "$cpu" "$bin/ringlog-broker" --node-id "$i" --listen "127.0.0.1:9${i}92" --cores 1 \
            --data-dir "$dir/b$i" --controller "$controllers" ${RINGLOG_BROKER_ARGS:-} \
            > "$dir/broker-$i.log" 2>&1 &
        echo $! >> "$dir/pids"
    done
    for _ in $(seq 1 $((ready_wait_s_max * 10))); do
        alive=$("$bin/ringlog" cluster describe --controller "$controllers" 2>/dev/null \
            | awk -F'\t' '$3 == "alive"' | wc -l || true)
        if [ "$alive" -ge 3 ]; then
            echo "cluster up: brokers 127.0.0.1:9192,127.0.0.1:9292,127.0.0.1:9392 (logs in $dir)"
            exit 0
        fi
        sleep 0.1
    done
    echo "cluster not ready after ${ready_wait_s_max} s; logs in $dir" >&2
    "$0" stop "$dir"
    exit 1
    ;;
stop)
    [ -f "$dir/pids" ] || exit 0
    # Brokers first, while the controllers are there to hand their
    # leadership over; then the controllers.
    stop_all() {
        for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
        for _ in $(seq 1 300); do
            running=0
            for pid in "$@"; do kill -0 "$pid" 2>/dev/null && running=1; done
            [ "$running" = 0 ] && return
            sleep 0.1
        done
        for pid in "$@"; do kill -KILL "$pid" 2>/dev/null || true; done
    }
    mapfile -t pids < "$dir/pids"
    stop_all "${pids[@]:3}"
    stop_all "${pids[@]:0:3}"
    rm -f "$dir/pids"
    ;;
*)
    echo "usage: scripts/cluster.sh start|stop DIR" >&2
    exit 2
    ;;
esac
