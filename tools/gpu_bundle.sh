#!/usr/bin/env bash
# Builds what tools/gpu_check.sh runs into a folder that a GPU machine without
# Debian's libraries can run: the CUDA build of snapfill, make_tiny_gguf,
# bm_gather and the CUDA tests (portable x86-64 kernels, sm_80 and sm_90),
# the shared libraries they need beyond glibc and the CUDA toolkit, and the
# long text the benchmarks read. Run it here (nvcc, no GPU needed); carry
# the folder (at most 64 MiB) to the GPU machine and run tools/gpu_check.sh
# there.
#
#   bash tools/gpu_bundle.sh [DEST]        (default: out/gpu_bundle)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${SNAPFILL_GPU_BUILD_DIR:-$ROOT/build_gpu}"
DEST="${1:-$ROOT/out/gpu_bundle}"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSNAPFILL_WITH_CUDA=ON -DSNAPFILL_NATIVE=OFF \
  -DSNAPFILL_BUILD_BENCH=ON "-DCMAKE_CUDA_ARCHITECTURES=80;90" > /dev/null
cmake --build "$BUILD" -j "$(nproc)" --target snapfill_cli make_tiny_gguf_cli cuda_backend_test device_choice_test \
  bm_gather

rm -rf "$DEST"
mkdir -p "$DEST/bin" "$DEST/lib" "$DEST/lib_std" "$DEST/data"
bins=("$BUILD/bin/snapfill" "$BUILD/bin/make_tiny_gguf" "$BUILD/tests/cuda_backend_test" "$BUILD/tests/device_choice_test"
      "$BUILD/bench/bm_gather")
for b in "${bins[@]}"; do
  cp "$b" "$DEST/bin/"
  strip --strip-unneeded "$DEST/bin/$(basename "$b")"
done
# Libraries: glibc's and the CUDA toolkit's come from the GPU machine;
# libstdc++ and libgcc_s go aside (lib_std), used there only where its own
# are older than the binaries need (this libstdc++ wants glibc 2.36).
for b in "${bins[@]}"; do
  ldd "$b" | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  case "$name" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|libcudart*|libcublas*) ;;
    libstdc++*|libgcc_s*) cp -L "$path" "$DEST/lib_std/$name" ;;
    *) cp -L "$path" "$DEST/lib/$name" ;;
  esac
done
if [[ ! -s "$ROOT/out/kjv.txt" ]]; then bash "$ROOT/tools/make_kjv.sh" "$ROOT/out/kjv.txt"; fi
cp "$ROOT/out/kjv.txt" "$DEST/data/kjv.txt"
size=$(du -sm "$DEST" | cut -f1)
echo "bundle: $DEST, ${size} MiB"
if (( size > 62 )); then
  echo "the bundle is over the 64 MiB a device call carries" >&2
  exit 1
fi
