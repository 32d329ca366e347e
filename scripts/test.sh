#!/usr/bin/env bash
# The one command that checks everything a change must keep green: formatting,
# lints (warnings are errors) and every test of the workspace. README.md names
# it and .ci/run calls it, so a fresh clone and CI run exactly the same checks.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh
# A clean clone builds once: the incremental cache would only double the disk
# a CI run needs.
if [ -n "${CI:-}" ]; then
    export CARGO_INCREMENTAL=0
fi
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
