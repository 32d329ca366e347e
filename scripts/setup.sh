#!/usr/bin/env bash
# Installs what building and testing Ringlog needs on a fresh Debian/Ubuntu
# machine, so no step is ever done by hand. Idempotent: does nothing when all
# is present. Needs a Rust toolchain (cargo, rustfmt, clippy) already installed.
set -euo pipefail

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
if ((${#need_apt[@]})); then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && apt-get install -y -qq "${need_apt[@]}"
    else
        sudo apt-get update -qq && sudo apt-get install -y -qq "${need_apt[@]}"
    fi
fi

for component in rustfmt clippy; do
    if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
        rustup component add "$component"
    fi
done

# io_uring must be available: glommio executors cannot start without it.
if [ -r /proc/sys/kernel/io_uring_disabled ] && [ "$(cat /proc/sys/kernel/io_uring_disabled)" != 0 ]; then
    echo "setup.sh: io_uring is disabled (kernel.io_uring_disabled=$(cat /proc/sys/kernel/io_uring_disabled)); enable it with: sysctl kernel.io_uring_disabled=0" >&2
    exit 1
fi
