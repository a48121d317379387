#!/usr/bin/env bash
# Writes the King James Bible (Debian package bible-kjv, public domain) as
# plain text, one verse a line with the verse labels stripped: about 4.1 MB,
# 1,023,026 tokens for SmolLM2. Usage: tools/make_kjv.sh OUT.txt
set -euo pipefail
OUT="${1:?usage: tools/make_kjv.sh OUT.txt}"
if ! command -v bible > /dev/null; then
  echo "make_kjv: the 'bible' command is missing; run tools/install_deps.sh (package bible-kjv)" >&2
  exit 1
fi
mkdir -p "$(dirname "$OUT")"
bible -f 'Gen1:1-Rev22:21' | sed -E 's/^[0-9A-Za-z]+[0-9]+:[0-9]+ //' > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "make_kjv: wrote $OUT ($(wc -c < "$OUT") bytes)"
