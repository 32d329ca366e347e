#!/usr/bin/env bash
# Prints this machine's own ceilings as markdown list items, for reports
# that set a run's figures beside them: loopback TCP with one iperf3 stream
# (installed with apt when missing and running as root), and with a
# directory argument a sequential O_DIRECT write of 2 GiB there.
#   scripts/ceilings.sh [DIR]
set -uo pipefail

if ! command -v iperf3 >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    { apt-get install -y -qq iperf3 || { apt-get update -qq && apt-get install -y -qq iperf3; }; } >/dev/null 2>&1 || true
fi
if command -v iperf3 >/dev/null 2>&1; then
    iperf3 -s -1 -B 127.0.0.1 -p 5299 >/dev/null 2>&1 &
    sleep 0.5
    line=$(iperf3 -c 127.0.0.1 -p 5299 -t 3 -f M 2>/dev/null | grep receiver || true)
    echo "- loopback TCP, one stream (iperf3 -t 3): $(echo "$line" | awk '{print $7, $8}')"
else
    echo "- loopback TCP: iperf3 not available"
fi
if [ -n "${1:-}" ]; then
    dd_line=$(dd if=/dev/zero of="$1/ceiling-dd.bin" bs=1M count=2048 oflag=direct 2>&1 | tail -1)
    rm -f "$1/ceiling-dd.bin"
    echo "- sequential O_DIRECT write, 2 GiB in 1 MiB blocks (dd oflag=direct): ${dd_line##*, }"
fi
