#!/usr/bin/env bash
# The loss table of docs/RESULTS.md: `snapfill ppl` on the first N tokens of
# a long text for FM, IM (every growth) and IMDC, with SnapKV and with
# StreamingLLM at the same memory, and full attention where N fits the
# model's context. Writes one JSON per configuration under OUT/N/ and
# prints a markdown table.
#
#   tools/quality_tables.sh TEXT N [OUT] [extra ppl flags...]
#   e.g. tools/quality_tables.sh out/kjv.txt 8192 out/quality --threads 2
#
# Environment: SNAPFILL_BIN (default build/bin/snapfill), MEMORY (1024),
# CHUNK (1024), PRUNERS ("snapkv streaming"), SCHEDULES (the list below),
# CONTEXT (the model's context, 8192 for SmolLM2: full attention runs up to
# it; 32768 for Gemma 3 270M, given with --model).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 TEXT TOKENS [OUT_DIR] [extra snapfill ppl flags]" >&2
  exit 2
fi
TEXT=$1
N=$2
OUT=${3:-out/quality}
shift $(( $# >= 3 ? 3 : 2 ))
BIN=${SNAPFILL_BIN:-build/bin/snapfill}
MEMORY=${MEMORY:-1024}
CHUNK=${CHUNK:-1024}
CONTEXT=${CONTEXT:-8192}
PRUNERS=${PRUNERS:-snapkv streaming}
SCHEDULES=${SCHEDULES:-fm im:linear im:sqrt im:square im:square_sqrt im:adaptive imdc}
mkdir -p "$OUT/$N"

run() {  # name, flags...
  local name=$1
  shift
  local json="$OUT/$N/$name.json"
  if [ ! -s "$json" ]; then
    "$BIN" ppl --input "$TEXT" --max_tokens "$N" --progress=false --json "$json" \
      --telemetry "$OUT/$N/$name.jsonl" "$@" > "$OUT/$N/$name.txt"
  fi
  local overall
  overall=$(grep '^overall:' "$OUT/$N/$name.txt")
  # "overall: loss 1.9280 nats/token | ppl 6.876 | 8191 tokens scored | 33.4 s (...) | peak RSS 201.7 MiB"
  local loss ppl rss
  loss=$(sed -E 's/.*loss ([0-9.]+).*/\1/' <<< "$overall")
  ppl=$(sed -E 's/.*\| ppl ([0-9.]+).*/\1/' <<< "$overall")
  rss=$(sed -E 's/.*peak RSS ([0-9.]+ [KMG]iB).*/\1/' <<< "$overall")
  echo "| $N | $name | $loss | $ppl | $rss |"
}

echo "| tokens | configuration | loss (nats/token) | ppl | peak RSS |"
echo "|---:|---|---:|---:|---:|"
# Full attention where the input fits the model's context.
if [ "$N" -le "$CONTEXT" ]; then run full --pruner full --chunk "$CHUNK" "$@"; fi
for pruner in $PRUNERS; do
  for s in $SCHEDULES; do
    kind=${s%%:*}
    growth=linear
    [ "$kind" != "$s" ] && growth=${s#*:}
    name="${pruner}_${kind}"
    [ "$kind" = im ] && name="${name}_${growth}"
    run "$name" --pruner "$pruner" --schedule "$kind" --growth "$growth" \
      --memory "$MEMORY" --chunk "$CHUNK" "$@"
  done
done
