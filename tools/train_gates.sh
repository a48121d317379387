#!/usr/bin/env bash
# Trains the default model's SmartKV gates (--pruner=gate) on text that no
# evaluation here reads: SQLite's documentation (Debian package sqlite3-doc,
# public domain), its HTML reduced to prose. The gates are rebuilt here,
# never downloaded. Usage: tools/train_gates.sh [OUT.gates [snapfill train-gate flags...]]
# OUT defaults to models/SmolLM2-135M-Instruct.Q4_1.gates, beside the default
# model, where --pruner=auto (the default) finds them for prefill without a
# question. 32 sequences of 1,024 tokens, 20 epochs, 8 hidden units: about
# 4 minutes on 2 cores; flags given here come after these and win.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gates}"
[ $# -gt 0 ] && shift
DOCS=/usr/share/doc/sqlite3
if [ ! -d "$DOCS" ]; then
  echo "train_gates: $DOCS is missing; run tools/install_deps.sh (package sqlite3-doc)" >&2
  exit 1
fi
TEXT="$(dirname "$OUT")/sqlite_doc.txt"
mkdir -p "$(dirname "$OUT")"
# Prose only: scripts, styles and markup dropped, whitespace runs folded.
python3 - "$DOCS" "$TEXT.tmp" <<'PY'
import html.parser, pathlib, re, sys
class Text(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(); self.parts = []; self.skip = 0
    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"): self.skip += 1
        if tag in ("p", "br", "li", "h1", "h2", "h3", "h4", "tr", "pre", "div"): self.parts.append("\n")
    def handle_endtag(self, tag):
        if tag in ("script", "style"): self.skip -= 1
    def handle_data(self, data):
        if not self.skip: self.parts.append(data)
out = []
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.html")):
    p = Text(); p.feed(path.read_text(errors="replace"))
    text = re.sub(r"[ \t]+", " ", "".join(p.parts))
    text = re.sub(r"\n\s*\n+", "\n\n", text).strip()
    if len(text) > 2000: out.append(text)
pathlib.Path(sys.argv[2]).write_text("\n\n".join(out) + "\n")
PY
mv "$TEXT.tmp" "$TEXT"
echo "train_gates: $(wc -c < "$TEXT") bytes of training text in $TEXT"
BIN="${SNAPFILL_BIN:-$ROOT/build/bin/snapfill}"
"$BIN" train-gate --input "$TEXT" --out "$OUT" --force --seq_len 1024 --max_sequences 32 --epochs 20 "$@"
