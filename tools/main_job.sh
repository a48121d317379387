#!/usr/bin/env bash
# Installs everything, fetches the default model, builds, and runs the main
# job on the default model: a greedy answer to a question, printing TTFT and
# peak memory.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash tools/install_deps.sh
bash tools/fetch_model.sh
bash tools/build.sh
BUILD_DIR="${SNAPFILL_BUILD_DIR:-$ROOT/build}"
"$BUILD_DIR/bin/snapfill" info
"$BUILD_DIR/bin/snapfill" generate --prompt "What is the capital of France? Answer in one sentence." -n 48 --temp 0
