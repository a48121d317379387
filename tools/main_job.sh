#!/usr/bin/env bash
# The main job, on a fresh machine: installs everything, fetches the default
# model, builds, and reads the whole King James Bible (about 1M tokens) chunk
# by chunk with IMDC and SnapKV into a 1024-entry memory, guided by a question
# whose answer lies about 72% of the way in (Jonah 1:17; the model answers it
# from a 2K-token excerpt with full attention, and not without the text), then
# answers it, printing TTFT and peak memory.
#
# SNAPFILL_MAIN_BYTES=N reads only the first N bytes of the text (a quick try).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash tools/install_deps.sh
bash tools/fetch_model.sh
bash tools/build.sh
BUILD_DIR="${SNAPFILL_BUILD_DIR:-$ROOT/build}"
mkdir -p out
[ -s out/kjv.txt ] || bash tools/make_kjv.sh out/kjv.txt
INPUT=out/kjv.txt
if [ -n "${SNAPFILL_MAIN_BYTES:-}" ]; then
  head -c "$SNAPFILL_MAIN_BYTES" out/kjv.txt > out/kjv_head.txt
  INPUT=out/kjv_head.txt
fi
/usr/bin/time -f "wall %e s, peak RSS %M KiB (/usr/bin/time)" \
  "$BUILD_DIR/bin/snapfill" run --input "$INPUT" \
  --question "Where was Jonah three days and three nights?" \
  --schedule imdc --memory 1024 --chunk 1024 -n 64 --telemetry out/telemetry.jsonl
