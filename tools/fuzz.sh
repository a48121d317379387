#!/usr/bin/env bash
# Runs snapfill's libFuzzer targets (tests/fuzz/) for a set time each.
#
#   tools/fuzz.sh [seconds_per_target] [target...]
#
# Targets: gguf_reader tokenizer cache_file checkpoint_file schedule_planner
# (default: all, in that order; default time 60 s each).
#
# Builds build-fuzz/ with clang-14 and -DSNAPFILL_FUZZ=ON (libFuzzer + ASan +
# UBSan everywhere), installing clang-14 and libclang-rt-14-dev if missing.
# Each target runs on a copy of its seed corpus in build-fuzz/corpus/<target>
# (the repository's tests/fuzz/corpus/ stays small; new inputs stay in the
# build tree) with one worker, -rss_limit_mb=2048 (an input that makes a
# parser allocate gigabytes is a bug) and -timeout=10 (30 for the planner).
# Crash, leak, OOM and timeout reproducers are written to
# tests/fuzz/regressions/<target>/, where fuzz_regression_test replays them;
# fix the bug, then keep the file (libFuzzer's "slow-unit-*" files are
# reports, not failures: replay them before keeping one). Reproducers
# already there are replayed first and must pass.
#
# Prints, per target, the seconds, executions, exec/s, corpus size and
# reproducers found, and a markdown table at the end. Logs are in
# build-fuzz/logs/<target>.log.
#
# Environment: FUZZ_NICE (default 19): niceness of the fuzzers;
# FUZZ_BUILD_DIR (default build-fuzz); FUZZ_JOBS (default 2): build jobs;
# FUZZ_EXTRA: more libFuzzer flags.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

SECONDS_PER_TARGET="${1:-60}"
shift || true
ALL_TARGETS=(gguf_reader tokenizer cache_file checkpoint_file schedule_planner)
if [ $# -gt 0 ]; then TARGETS=("$@"); else TARGETS=("${ALL_TARGETS[@]}"); fi
for t in "${TARGETS[@]}"; do
  case " ${ALL_TARGETS[*]} " in
    *" $t "*) ;;
    *) echo "fuzz.sh: unknown target '$t' (known: ${ALL_TARGETS[*]})" >&2; exit 2 ;;
  esac
done
if ! [[ "$SECONDS_PER_TARGET" =~ ^[0-9]+$ ]]; then
  echo "fuzz.sh: seconds_per_target must be a whole number, got '$SECONDS_PER_TARGET'" >&2
  exit 2
fi

# Largest input per target: whole small files for the file formats, a few KB
# of text for the tokenizer, a config plus retention ratios for the planner.
max_len() {
  case "$1" in
    gguf_reader) echo 65536 ;;
    tokenizer) echo 4096 ;;
    cache_file) echo 16384 ;;
    checkpoint_file) echo 16384 ;;
    schedule_planner) echo 512 ;;
  esac
}

# Seconds one input may take: the planner's largest legal plans (2^26
# budgets) take a few seconds under ASan, the parsers' inputs milliseconds.
unit_timeout() {
  case "$1" in
    schedule_planner) echo 30 ;;
    *) echo 10 ;;
  esac
}

# --- toolchain -------------------------------------------------------------
bash tools/install_deps.sh
FUZZ_PACKAGES=(clang-14 libclang-rt-14-dev libomp-14-dev)
missing=()
for p in "${FUZZ_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "fuzz.sh: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

BUILD_DIR="${FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
NICE="${FUZZ_NICE:-19}"
GENERATOR=()
if command -v ninja > /dev/null; then GENERATOR=(-G Ninja); fi
CC=clang-14 CXX=clang++-14 cmake -S "$ROOT" -B "$BUILD_DIR" "${GENERATOR[@]}" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSNAPFILL_FUZZ=ON -DSNAPFILL_BUILD_BENCH=OFF > /dev/null
build_targets=()
for t in "${TARGETS[@]}"; do build_targets+=("${t}_fuzzer"); done
nice -n "$NICE" cmake --build "$BUILD_DIR" -j "${FUZZ_JOBS:-2}" --target "${build_targets[@]}"

# --- runs ------------------------------------------------------------------
mkdir -p "$BUILD_DIR/logs"
declare -A R_SECONDS R_EXECS R_RATE R_CORPUS R_CRASHES R_COV
for t in "${TARGETS[@]}"; do
  corpus="$BUILD_DIR/corpus/$t"
  regress="$ROOT/tests/fuzz/regressions/$t"
  log="$BUILD_DIR/logs/$t.log"
  mkdir -p "$corpus" "$regress"
  # Seed the working corpus; inputs it already found are kept across runs.
  cp -n "$ROOT/tests/fuzz/corpus/$t/"* "$corpus/" 2> /dev/null || true
  # Kept reproducers first: each must pass now (a fixed bug stays fixed
  # under the sanitizers and the memory limit too, not only in ctest).
  if [ -n "$(ls -A "$regress")" ]; then
    if ! "$BUILD_DIR/tests/fuzz/${t}_fuzzer" -rss_limit_mb=2048 -malloc_limit_mb=2048 \
         -timeout="$(unit_timeout "$t")" "$regress"/* > "$BUILD_DIR/logs/$t.regressions.log" 2>&1; then
      echo "fuzz.sh: a kept reproducer of $t fails again; see $BUILD_DIR/logs/$t.regressions.log" >&2
      exit 1
    fi
  fi
  before=$(find "$regress" -type f ! -name "slow-unit-*" | wc -l)
  echo "=== $t: ${SECONDS_PER_TARGET}s, -max_len=$(max_len "$t") ==="
  start=$(date +%s)
  # -fork=1 would survive crashes but restarts the process; one plain run
  # stops at the first crash, which is what a fix-and-rerun loop wants.
  set +e
  # shellcheck disable=SC2086
  ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=0" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    nice -n "$NICE" "$BUILD_DIR/tests/fuzz/${t}_fuzzer" "$corpus" \
    -max_total_time="$SECONDS_PER_TARGET" -max_len="$(max_len "$t")" \
    -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout="$(unit_timeout "$t")" -print_final_stats=1 \
    -artifact_prefix="$regress/" ${FUZZ_EXTRA:-} > "$log" 2>&1
  rc=$?
  set -e
  end=$(date +%s)
  after=$(find "$regress" -type f ! -name "slow-unit-*" | wc -l)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  if [ -z "$execs" ]; then execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#'); fi
  execs=${execs:-0}
  secs=$((end - start))
  R_SECONDS[$t]=$secs
  R_EXECS[$t]=$execs
  R_RATE[$t]=$(( secs > 0 ? execs / secs : execs ))
  R_CORPUS[$t]=$(find "$corpus" -type f | wc -l)
  R_CRASHES[$t]=$((after - before))
  R_COV[$t]=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  echo "$t: ${secs}s, ${execs} executions (${R_RATE[$t]}/s), corpus ${R_CORPUS[$t]} files," \
       "coverage ${R_COV[$t]:-?} edges, new reproducers ${R_CRASHES[$t]} (exit $rc)"
  if [ "$rc" -ne 0 ]; then
    grep -E "^==[0-9]+==ERROR|SUMMARY|Test unit written|runtime error|Check failed|CHECK" "$log" \
      | head -8 || true
  fi
done

echo
echo "| target | seconds | executions | exec/s | corpus files | coverage (edges) | new reproducers |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for t in "${TARGETS[@]}"; do
  echo "| $t | ${R_SECONDS[$t]} | ${R_EXECS[$t]} | ${R_RATE[$t]} | ${R_CORPUS[$t]} | ${R_COV[$t]:-?} | ${R_CRASHES[$t]} |"
done
