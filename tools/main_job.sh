#!/usr/bin/env bash
# The main job, on a fresh machine: installs everything, fetches the default
# model, builds, and reads the whole King James Bible (about 1M tokens) chunk
# by chunk with IMDC and SnapKV into a 1024-entry memory, guided by a question
# whose answer lies about 72% of the way in (Jonah 1:17; the model answers it
# from a 2K-token excerpt with full attention, and not without the text), with
# the recall tier bringing back what the question attends to most, then
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
# The default model's gates (about 4 minutes, once): prefill without a
# question (prefill --out, then generate --cache) compresses with them.
GATES=models/SmolLM2-135M-Instruct.Q4_1.gates
[ -s "$GATES" ] || SNAPFILL_BIN="$BUILD_DIR/bin/snapfill" bash tools/train_gates.sh "$GATES"
mkdir -p out
[ -s out/kjv.txt ] || bash tools/make_kjv.sh out/kjv.txt
INPUT=out/kjv.txt
if [ -n "${SNAPFILL_MAIN_BYTES:-}" ]; then
  head -c "$SNAPFILL_MAIN_BYTES" out/kjv.txt > out/kjv_head.txt
  INPUT=out/kjv_head.txt
fi
# The recall tier keeps every evicted entry on disk for the question (q8,
# about 12.4 KB a token: 12 GiB for the whole text, removed at the end);
# without the room, the run goes on without it.
RECALL=(--recall_dir out/recall_store)
NEED_KB=$(( $(wc -c < "$INPUT") / 4 * 13 ))
FREE_KB=$(df -Pk out | awk 'NR == 2 { print $4 }')
if [ "$FREE_KB" -lt "$NEED_KB" ]; then
  echo "main_job: $((FREE_KB / 1048576)) GiB free in out/, the recall store may take $((NEED_KB / 1048576)) GiB: running without it" >&2
  RECALL=()
fi
rm -rf out/recall_store
/usr/bin/time -f "wall %e s, peak RSS %M KiB (/usr/bin/time)" \
  "$BUILD_DIR/bin/snapfill" run --input "$INPUT" "${RECALL[@]}" \
  --question "Where was Jonah three days and three nights?" \
  --schedule imdc --memory 1024 --chunk 1024 -n 64 --telemetry out/telemetry.jsonl
