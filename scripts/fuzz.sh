#!/usr/bin/env bash
# Runs the libFuzzer targets in fuzz/ (cargo fuzz) against Ringlog's decoders of
# untrusted bytes: record batches and varints from producers and segment files,
# offset/time index files read back at recovery, and the client's decoding of
# the batches a fetch returns (the list: `cargo fuzz list`). Property tests
# sample a few hundred inputs; this searches coverage-guided for an input that
# panics, which for these decoders is a bug (a corrupt byte must be an error,
# never a crash).
#
# Usage: scripts/fuzz.sh [TARGET...]      (default: every target, `cargo fuzz list`)
#   FUZZ_SECONDS   seconds per target (default 60), libFuzzer's -max_total_time
#   FUZZ_ARGS      extra libFuzzer flags, e.g. "-max_len=65536"
# A crash leaves its input in fuzz/artifacts/TARGET/ and the run exits non-zero;
# replay it with `cargo fuzz run TARGET fuzz/artifacts/TARGET/crash-...`.
#
# cargo fuzz needs nightly compiler flags (-Zsanitizer, sancov passes). Only the
# stable toolchain is installed here, so RUSTC_BOOTSTRAP=1 lets stable rustc
# accept them; it is set for this script's builds only. The fuzz package has its
# own [workspace] and target dir, so it never touches the main workspace build.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo/fuzz"

export RUSTC_BOOTSTRAP=1
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$repo/fuzz/target}"
# Two cores: one build at a time, and leave room for other work on the machine.
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
seconds="${FUZZ_SECONDS:-60}"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo fuzz list)
fi

# Seed an empty corpus with valid encodings so the fuzzer starts past CRC and magic.
for t in "${targets[@]}"; do
    if [ -z "$(ls -A "corpus/$t" 2>/dev/null)" ]; then
        cargo run --quiet --example seed_corpus
        break
    fi
done

# One build of all targets up front (a single cargo invocation); the runs reuse it.
cargo fuzz build
failed=()
for t in "${targets[@]}"; do
    echo "=== fuzz.sh: $t for ${seconds}s ===" >&2
    # shellcheck disable=SC2086 # FUZZ_ARGS is a list of flags.
    if ! cargo fuzz run "$t" -- -max_total_time="$seconds" -print_final_stats=1 ${FUZZ_ARGS:-}; then
        failed+=("$t")
    fi
done

if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz.sh: FAILED: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzz.sh: ${#targets[@]} targets ran ${seconds}s each without a crash" >&2
