#!/usr/bin/env bash
# The CUDA checks on a GPU machine, as one report: the machine, the CUDA
# tests (each op against its scalar twin, whole tiny and SmolLM2-shaped
# models against the exact CPU backend, caches across devices),
# compute-sanitizer memcheck and racecheck, the cuBLAS bf16 peak, then the
# prefill benchmarks on synthetic models made there (SmolLM2-135M's shapes
# and Llama-2-7B's, random Q8_0 weights). Reads a bundle from
# tools/gpu_bundle.sh; builds nothing. Steps past the time budget are
# skipped, and say so.
#
#   bash tools/gpu_check.sh [BUNDLE]       (default: out/gpu_bundle)
# Environment: OUT (report folder; default out/gpu_report), GPU_CHECK_BUDGET
# (seconds, default 480), GPU_CHECK_STEPS (a regex of step names to run;
# default all), GPU_CHECK_7B_TOKENS (default 16384), GPU_CHECK_LONG_TOKENS
# (the SmolLM2-shaped long run; default 1000000).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUNDLE="$(cd "${1:-$ROOT/out/gpu_bundle}" && pwd)"
OUT="${OUT:-$ROOT/out/gpu_report}"
BUDGET="${GPU_CHECK_BUDGET:-480}"
STEPS="${GPU_CHECK_STEPS:-.}"
TOKENS_7B="${GPU_CHECK_7B_TOKENS:-16384}"
LONG_TOKENS="${GPU_CHECK_LONG_TOKENS:-1000000}"
mkdir -p "$OUT"
REPORT="$OUT/report.txt"
: > "$REPORT"
WORK="$(mktemp -d /tmp/snapfill-gpu-check.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
START=$SECONDS
BIN="$BUNDLE/bin"
TEXT="$BUNDLE/data/kjv.txt"

say() { echo "$*" | tee -a "$REPORT"; }
# step NAME SECONDS COMMAND...: runs the command with a time limit unless
# the budget is spent or NAME is not asked for; its output goes to the report.
step() {
  local name="$1" limit="$2"
  shift 2
  [[ "$name" =~ $STEPS ]] || return 0
  local used=$((SECONDS - START))
  if (( used + 10 > BUDGET )); then
    say "== $name: skipped (budget of ${BUDGET} s spent: ${used} s)"
    return 0
  fi
  (( limit > BUDGET - used )) && limit=$((BUDGET - used))
  say "== $name (limit ${limit} s)"
  echo "\$ $*" >> "$REPORT"
  local t0=$SECONDS
  # (bash -c: a step may be one of the functions below, exported.)
  timeout --kill-after=5 "$limit" bash -c '"$@"' _ "$@" >> "$REPORT" 2>&1
  local rc=$?
  say "-- $name: exit $rc, $((SECONDS - t0)) s$( ((rc == 124)) && echo ' (timed out)')"
}

# The CUDA libraries of this machine, then the bundle's; its libstdc++ only
# where this machine's is too old for the binaries.
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -e "$d/libcublas.so.13" ]] && CUDA_LIBS="${CUDA_LIBS:+$CUDA_LIBS:}$d"
done
# (cuBLAS is opened at run time, so ldd cannot tell it is missing; it may
# be only in a Python wheel's folder, nvidia/cublas/lib.)
if [[ -z "${CUDA_LIBS:-}" ]]; then
  f=$(timeout 30 find / -xdev \( -path /proc -o -path /sys \) -prune -o -name 'libcublas.so.13' -print -quit 2>/dev/null)
  [[ -n "$f" ]] && CUDA_LIBS="$(dirname "$f")"
fi
export LD_LIBRARY_PATH="$BUNDLE/lib:${CUDA_LIBS:-}:${LD_LIBRARY_PATH:-}"
if ! "$BIN/snapfill" --help > /dev/null 2>&1; then
  export LD_LIBRARY_PATH="$BUNDLE/lib:$BUNDLE/lib_std:${CUDA_LIBS:-}:${LD_LIBRARY_PATH:-}"
fi
export OMP_WAIT_POLICY=PASSIVE

machine() {
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv
  echo "cores: $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  echo "kernel: $(uname -r) (4.4.0: gVisor, where compute-sanitizer refuses the device)"
  ldd --version | head -1
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  ldd "$BIN/snapfill" | grep -E "not found|cublas|cudart|stdc" || true
  "$BIN/snapfill" --help > /dev/null && echo "snapfill starts"
  # (Fails here where the driver or cuBLAS cannot be used: every test would skip.)
  "$BIN/snapfill" info --device cuda 2>&1 | head -12
}
# The CUDA tests; a test that skipped (no device, no cuBLAS) fails the step.
# Where one fails, each test runs again in its own process with
# CUDA_LAUNCH_BLOCKING=1: a kernel's fault is then named by its own op, and
# no test fails because an earlier one left the context broken (a fault is
# sticky for the process). The whole run has 100 s (about 40 where the CPU
# stands in), so that a hang leaves the step time to find the test.
cuda_tests() {
  timeout --kill-after=5 100 "$BIN/cuda_backend_test" --gtest_color=no "$@" | tee "$WORK/tests.txt"
  local rc=${PIPESTATUS[0]}
  (( rc == 124 )) && echo "the tests ran past 100 s"

  if grep -q '^\[  SKIPPED \]' "$WORK/tests.txt"; then
    echo "tests skipped: the device or cuBLAS was not usable"
    return 5
  fi
  if (( rc != 0 )); then
    echo "== each test alone, CUDA_LAUNCH_BLOCKING=1"
    local t r
    for t in $("$BIN/cuda_backend_test" --gtest_list_tests | awk '/^[^ ]/ {s = $1} /^  / {print s $1}'); do
      CUDA_LAUNCH_BLOCKING=1 timeout --kill-after=5 30 "$BIN/cuda_backend_test" --gtest_color=no \
        "--gtest_filter=$t" > "$WORK/alone.txt" 2>&1
      r=$?
      if (( r == 0 )); then
        echo "ok    $t"
      else
        echo "FAIL  $t (exit $r)"
        grep -v '^\[' "$WORK/alone.txt" | head -40
      fi
    done
  fi
  return "$rc"
}
export BIN TEXT WORK
export -f machine cuda_tests
step machine 30 machine
step tests 240 cuda_tests
step device_choice 30 "$BIN/device_choice_test" --gtest_color=no
# A layer's KV copies in one Gather call (one launch per 64 copies) against
# a call a copy (a launch each, as before batching).
step bench_gather 30 "$BIN/bm_gather" --benchmark_filter=Cuda --benchmark_min_time=0.2
SMOL="$WORK/smollm2-shaped-q8_0.gguf"
step make_smollm2 60 "$BIN/make_tiny_gguf" --preset smollm2-135m --type Q8_0 --fast_weights --seed 1 --out "$SMOL"
step info 60 "$BIN/snapfill" info --device cuda --model "$SMOL"
# (Every step compressed, the last too, as the IMDC paper's schedules whose
# TTFT and memory these are measured against.)
prefill() {  # MODEL TOKENS SCHEDULE [--profile=false: the TTFT without the per-op waits profiling adds]
  "$BIN/snapfill" prefill --device cuda --model "$1" --input "$TEXT" --max_tokens "$2" --schedule "$3" \
    --memory 1024 --chunk 1024 --keep_last_chunk=false --out "$WORK/cache.kv" --force --progress=false \
    --profile "${@:4}"
}
export -f prefill
step smollm2_imdc_64k 60 prefill "$SMOL" 65536 imdc
# The cache it wrote, decoded from the device (generate --cache moves it there).
step smollm2_generate_cache 30 "$BIN/snapfill" generate --device cuda --model "$SMOL" --cache "$WORK/cache.kv" \
  --prompt "Who built the ark?" -n 16 --timing
# The newest device paths end to end, before the long benchmarks, so that a
# budget spent on those does not skip them.
# A question's run (its spans selected on the device, one wait per chunk):
# backend_selections in the telemetry counts the layers that took the op.
step smollm2_question_64k 60 bash -c '"$BIN/snapfill" run --device cuda --model "$0" --input "$TEXT" \
  --max_tokens 65536 --memory 1024 --chunk 1024 --question "Who built the ark?" -n 8 --progress=false \
  --timing --telemetry "$WORK/question.jsonl" && grep -o "\"backend_selections\":[0-9]*" "$WORK/question.jsonl" | tail -1' "$SMOL"
# The question's other rules (half the share left to the window's votes,
# the largest weights), also one op per layer: a shorter run.
step smollm2_question_share_max 40 bash -c '"$BIN/snapfill" run --device cuda --model "$0" --input "$TEXT" \
  --max_tokens 16384 --memory 1024 --chunk 1024 --question "Who built the ark?" --query_share 0.5 \
  --query_votes max -n 8 --progress=false --timing --telemetry "$WORK/question_rules.jsonl" \
  && grep -o "\"backend_selections\":[0-9]*" "$WORK/question_rules.jsonl" | tail -1' "$SMOL"
# The recall tier: every evicted row to a store on the host, found and
# gathered on the device and copied a layer behind the kernels; the
# selection one op per layer but at the last step, which recalls.
step smollm2_question_recall 40 bash -c '"$BIN/snapfill" run --device cuda --model "$0" --input "$TEXT" \
  --max_tokens 16384 --memory 1024 --chunk 1024 --question "Who built the ark?" --recall_dir "$WORK/recall" \
  --recall 64 -n 8 --progress=false --timing --telemetry "$WORK/recall.jsonl" \
  && grep -o "\"backend_selections\":[0-9]*\|\"recalled\":[0-9]*" "$WORK/recall.jsonl" | tail -2' "$SMOL"
# The same with a q8 store: the rows converted to int8 records on the device.
step smollm2_question_recall_q8 30 bash -c '"$BIN/snapfill" run --device cuda --model "$0" --input "$TEXT" \
  --max_tokens 8192 --memory 1024 --chunk 1024 --question "Who built the ark?" --recall_dir "$WORK/recall_q8" \
  --recall_format q8 --recall 64 -n 8 --progress=false --timing --telemetry "$WORK/recall_q8.jsonl" \
  && grep -o "\"backend_selections\":[0-9]*\|\"recalled\":[0-9]*" "$WORK/recall_q8.jsonl" | tail -2' "$SMOL"
# A question asked after a prefill it did not guide: the evicted rows to a
# store, then generate --cache brings back into the device's cache what the
# question attends to, ranked across layers (RecallForQuestion).
step smollm2_recall_after 60 bash -c '"$BIN/snapfill" prefill --device cuda --model "$0" --input "$TEXT" \
  --max_tokens 16384 --memory 1024 --chunk 1024 --recall_dir "$WORK/after" --out "$WORK/after.kv" --force \
  --progress=false && "$BIN/snapfill" generate --device cuda --model "$0" --cache "$WORK/after.kv" \
  --recall_dir "$WORK/after" --prompt "Who built the ark?" -n 8 --timing' "$SMOL"
# Context reconstruction: its scores made on the device and kept there with
# the memory, its selection one op per layer.
step smollm2_reconstruct 40 bash -c 'prefill "$0" 16384 imdc --pruner reconstruct --profile=false \
  --telemetry "$WORK/reconstruct.jsonl" && grep -o "\"backend_selections\":[0-9]*" "$WORK/reconstruct.jsonl" | tail -1' \
  "$SMOL"
step bench_smollm2 90 "$BIN/snapfill" bench --device cuda --model "$SMOL" --input "$TEXT" --max_tokens 16384 \
  --schedules fm,imdc --memory 1024 --chunk 1024 --repetitions 1 --full_tokens 0 -n 16
MODEL_7B="$WORK/llama2-7b-shaped-q8_0.gguf"
step make_7b 150 "$BIN/make_tiny_gguf" --preset llama2-7b --type Q8_0 --seed 1 --context 8192 --out "$MODEL_7B"
step 7b_plan_1m 40 prefill "$MODEL_7B" 1000000 imdc --dry_run
step 7b_imdc 120 prefill "$MODEL_7B" "$TOKENS_7B" imdc
step 7b_imdc_ttft 90 prefill "$MODEL_7B" "$TOKENS_7B" imdc --profile=false
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
# (Under gVisor, kernel 4.4.0, compute-sanitizer refuses the device: "Device
# not supported", then error 999 at the first allocation.)
if [[ -n "$SAN" && "$(uname -r)" == 4.4.0* ]]; then
  say "== sanitizers: skipped (gVisor: compute-sanitizer refuses the device there)"
  SAN=""
fi
OPS='CudaBackend.ElementwiseOps*:CudaBackend.AttentionFamily*:CudaBackend.TensorCoreAttention*:CudaBackend.Selection*:CudaBackend.Products*:CudaBackend.Fused*:CudaBackend.BadArguments*'
OPS="$OPS:CudaBackend.BuffersLive*:CudaBackend.GatherMoves*:CudaBackend.OpsTakeTheBuffers*:CudaBackend.GateScores*:CudaBackend.Complement*:CudaBackend.DownloadAsync*"
OPS="$OPS:CudaBackend.ToHalfInBuffers*:CudaBackend.ToInt8RowsInBuffers*:CudaBackend.GatherBatches*"
if [[ -n "$SAN" ]]; then
  step memcheck 120 "$SAN" --tool memcheck --error-exitcode 3 "$BIN/cuda_backend_test" --gtest_color=no \
    "--gtest_filter=$OPS:CudaBackend.TinyModel*"
  step racecheck 90 "$SAN" --tool racecheck --error-exitcode 3 "$BIN/cuda_backend_test" --gtest_color=no \
    '--gtest_filter=CudaBackend.ElementwiseOps*:CudaBackend.AttentionFamily*:CudaBackend.TensorCoreAttentionMatches*:CudaBackend.SelectionMatchesTheTwins:CudaBackend.GatherMoves*:CudaBackend.Complement*'
elif [[ "$(uname -r)" != 4.4.0* ]]; then
  say "== sanitizers: compute-sanitizer not found"
fi

# The same with the f32 attention kernel: what the tensor cores bring, measured in one run.
step 7b_imdc_f32_attention 120 prefill "$MODEL_7B" "$TOKENS_7B" imdc --kernels attention=f32
step smollm2_imdc_long 150 prefill "$SMOL" "$LONG_TOKENS" imdc
step 7b_fm 90 prefill "$MODEL_7B" "$TOKENS_7B" fm
step 7b_im 90 prefill "$MODEL_7B" "$TOKENS_7B" im
say "== done in $((SECONDS - START)) s"
