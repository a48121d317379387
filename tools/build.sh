#!/usr/bin/env bash
# Configures and builds snapfill (Release) into build/ (or $SNAPFILL_BUILD_DIR).
# Extra arguments go to CMake's configure step, e.g. -DSNAPFILL_SANITIZE=address,undefined.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${SNAPFILL_BUILD_DIR:-$ROOT/build}"
JOBS="${SNAPFILL_JOBS:-$(nproc)}"
GENERATOR=()
if command -v ninja > /dev/null; then GENERATOR=(-G Ninja); fi
cmake -S "$ROOT" -B "$BUILD_DIR" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$BUILD_DIR" -j "$JOBS"
