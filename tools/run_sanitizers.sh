#!/usr/bin/env bash
# Builds the whole tree with AddressSanitizer + UndefinedBehaviorSanitizer
# into build-asan/ and runs the test suite there (labels "long" and "cuda"
# left out). Any report fails the run (-fno-sanitize-recover=all).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash tools/install_deps.sh
bash tools/fetch_model.sh
BUILD_DIR="${SNAPFILL_ASAN_BUILD_DIR:-$ROOT/build-asan}"
GENERATOR=()
if command -v ninja > /dev/null; then GENERATOR=(-G Ninja); fi
cmake -S "$ROOT" -B "$BUILD_DIR" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSNAPFILL_SANITIZE=address,undefined -DSNAPFILL_BUILD_BENCH=OFF
cmake --build "$BUILD_DIR" -j "$(nproc)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" -LE "long|cuda|netns"
