#!/usr/bin/env bash
# Full check on the GPU machine (Hopper, CUDA toolkit, cmake, ninja, torch; no network):
#   build (all cores, into build/, reused when present) -> ctest (unit tests, then the
#   GPU tests) -> bench/bench.py -> optional compute-sanitizer runs -> OUTDIR/summary.txt
#
# usage: scripts/gpu_check.sh [--sanitize] [--steps LIST] OUTDIR [extra cmake args...]
#   --sanitize     also run compute-sanitizer memcheck + racecheck on a small subset of the GPU tests
#   --steps LIST   comma-separated subset of: build,unit,gpu,bench,sanitize
#                  (default: build,unit,gpu,bench, plus sanitize with --sanitize)
# environment:
#   BUILD_DIR (build)          JOBS (nproc)             CTEST_GPU_JOBS (8: GPU test processes at once)
#   GPU_TEST_REGEX (all)       ctest -R filter for the GPU tests
#   BENCH_ARGS ("")            extra bench.py arguments, e.g. "--quick" or "--hdims 128 --passes fwd"
#   SANITIZE_FILTER            gtest filter for the sanitizer runs
#   FLASH3_GPU_TESTS_QUICK=1   the GPU test matrix leaves out its seqlen-4096 cases
#
# Every step runs even when an earlier one failed (a step that needs a missing
# artifact is reported as failed); the exit status is non-zero when any step failed.
# OUTDIR receives at most 8 files: build.log ctest.log bench.log bench.csv
# sanitize_memcheck.log sanitize_racecheck.log summary.txt (and bench.png with BENCH_ARGS=--plot ...).
set -o pipefail
set -u

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }

SANITIZE=0
STEPS=""
OUTDIR=""
CMAKE_EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) SANITIZE=1; shift ;;
    --steps) STEPS="${2:-}"; shift 2 ;;
    --steps=*) STEPS="${1#--steps=}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *)
      if [ -z "$OUTDIR" ]; then OUTDIR="$1"; else CMAKE_EXTRA+=("$1"); fi
      shift ;;
  esac
done
if [ -z "$OUTDIR" ]; then usage >&2; exit 64; fi
if [ -z "$STEPS" ]; then
  STEPS="build,unit,gpu,bench"
  [ "$SANITIZE" = 1 ] && STEPS="$STEPS,sanitize"
fi

mkdir -p "$OUTDIR" || exit 64
OUTDIR=$(cd "$OUTDIR" && pwd)
cd "$(dirname "$0")/.." || exit 64
[ -f scripts/env.sh ] && source scripts/env.sh

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
CTEST_GPU_JOBS=${CTEST_GPU_JOBS:-8}
BENCH_ARGS=${BENCH_ARGS:-}
SANITIZE_FILTER=${SANITIZE_FILTER:-"Fwd/FwdMatrix.*bf16_d128x128_nomask_sq128_sk128_gqa8x2_b1:Fwd/FwdMatrix.*bf16_d128x128_causal_sq113_sk1023_mqa4x1_b3:Fwd/FwdMatrix.*fp16_d64x64_window128x0_sq1023_sk113_mha2x2_b1:Fwd/FwdMatrix.*bf16_d256x256_causal_sq1000_sk1000_mha2x2_b1:Fwd/FwdMatrix.*fp16_d192x128_window256x256_sq17_sk17_gqa8x2_b3:FwdGpu.EmptySeqlen*:FwdGpu.HostOrMisalignedPointerIsAnError:Bwd/BwdMatrix.*bf16_d128x128_causal_sq128_sk128_gqa8x2_b1:Bwd/BwdMatrix.*bf16_d256x256_window128x0_sq17_sk17_mha2x2_b1:Bwd/BwdMatrix.*fp16_d64x64_nomask_sq113_sk1023_mqa4x1_b1:BwdGpu.EmptySeqlen*"}

SUMMARY="$OUTDIR/summary.txt"
TMPD=$(mktemp -d)
trap 'rm -rf "$TMPD"' EXIT
STEP_LINES=()
FAILED=0

has_step() { case ",$STEPS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# record NAME STATUS SECONDS [DETAIL]
record() {
  STEP_LINES+=("$(printf '%-10s %-8s %5ss  %s' "$1" "$2" "$3" "${4:-}")")
  [ "$2" = "FAIL" ] && FAILED=1
  echo "== $1: $2 ($3 s) ${4:-}"
}

# run_step NAME LOGFILE(append) COMMAND... : runs, tees, records OK/FAIL.
run_step() {
  local name=$1 log=$2
  shift 2
  local t0=$SECONDS rc
  echo "== $name: $*" | tee -a "$log"
  "$@" 2>&1 | tee -a "$log"
  rc=$?
  if [ $rc -eq 0 ]; then record "$name" OK $((SECONDS - t0)); else record "$name" FAIL $((SECONDS - t0)) "exit $rc, see $(basename "$log")"; fi
  return $rc
}

{
  echo "flash3 gpu_check  $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "host: $(hostname)  cores: $(nproc)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- 2>/dev/null || echo ' (+ local changes)')"
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
  else
    echo "gpu: nvidia-smi not found"
  fi
  echo "nvcc: $(nvcc --version 2>/dev/null | tail -1 || echo 'not found')"
  echo "steps: $STEPS   build dir: $BUILD_DIR   cmake extra: ${CMAKE_EXTRA[*]:-none}"
} > "$TMPD/head"

# ---------------------------------------------------------------------------
# 1. Configure + build.
# ---------------------------------------------------------------------------
if has_step build; then
  : > "$OUTDIR/build.log"
  gen=()
  if [ ! -f "$BUILD_DIR/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1; then gen=(-G Ninja); fi
  cutlass_args=()
  # No network on the GPU machine: use the carried .deps/cutlass, never try pip.
  [ -d .deps/cutlass ] && cutlass_args=(-DFLASH3_FETCH_CUTLASS=OFF)
  if run_step configure "$OUTDIR/build.log" cmake -S . -B "$BUILD_DIR" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
       "${cutlass_args[@]}" "${CMAKE_EXTRA[@]}"; then
    # Keep going past a failing target so whatever can be built is built (and tested).
    keep=()
    if [ -f "$BUILD_DIR/build.ninja" ]; then keep=(-- -k 0); else keep=(-- -k); fi
    run_step build "$OUTDIR/build.log" cmake --build "$BUILD_DIR" -j "$JOBS" "${keep[@]}"
  else
    record build FAIL 0 "not attempted: configure failed"
  fi
  grep -E "error|Error|warning: .*spill" "$OUTDIR/build.log" | head -20 > "$TMPD/build" || true
fi

# ---------------------------------------------------------------------------
# 2. Tests.
# ---------------------------------------------------------------------------
ctest_log="$OUTDIR/ctest.log"
if has_step unit || has_step gpu; then : > "$ctest_log"; fi
if has_step unit; then
  if [ -f "$BUILD_DIR/CTestTestfile.cmake" ]; then
    run_step unit "$ctest_log" ctest --test-dir "$BUILD_DIR" --output-on-failure -LE gpu -j "$JOBS" --timeout 600
  else
    record unit FAIL 0 "no $BUILD_DIR/CTestTestfile.cmake (build step?)"
  fi
fi
if has_step gpu; then
  if [ -x "$BUILD_DIR/tests/flash3_gpu_tests" ]; then
    regex=()
    [ -n "${GPU_TEST_REGEX:-}" ] && regex=(-R "$GPU_TEST_REGEX")
    run_step gpu "$ctest_log" ctest --test-dir "$BUILD_DIR" --output-on-failure -L gpu -j "$CTEST_GPU_JOBS" \
      --timeout 600 "${regex[@]}"
  else
    record gpu FAIL 0 "no $BUILD_DIR/tests/flash3_gpu_tests (build step?)"
  fi
fi

# ---------------------------------------------------------------------------
# 3. Benchmark.
# ---------------------------------------------------------------------------
if has_step bench; then
  : > "$OUTDIR/bench.log"
  lib="$BUILD_DIR/libflash3.so"
  if [ ! -e "$lib" ]; then
    echo "warning: $lib not found: bench.py will time the baselines only and exit non-zero" | tee -a "$OUTDIR/bench.log"
  fi
  # shellcheck disable=SC2086
  run_step bench "$OUTDIR/bench.log" python3 bench/bench.py --lib "$lib" --csv "$OUTDIR/bench.csv" $BENCH_ARGS
fi

# ---------------------------------------------------------------------------
# 4. compute-sanitizer on a few small GPU test cases.
# ---------------------------------------------------------------------------
if has_step sanitize; then
  san=""
  for c in compute-sanitizer /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    if command -v "$c" >/dev/null 2>&1; then san=$(command -v "$c"); break; fi
  done
  if [ -z "$san" ]; then
    record sanitize FAIL 0 "compute-sanitizer not found"
  elif [ ! -x "$BUILD_DIR/tests/flash3_gpu_tests" ]; then
    record sanitize FAIL 0 "no $BUILD_DIR/tests/flash3_gpu_tests"
  else
    for tool in memcheck racecheck; do
      log="$OUTDIR/sanitize_$tool.log"
      : > "$log"
      run_step "$tool" "$log" "$san" --tool "$tool" --error-exitcode 86 --print-limit 50 \
        "$BUILD_DIR/tests/flash3_gpu_tests" --gtest_filter="$SANITIZE_FILTER" --gtest_brief=1
    done
  fi
fi

# ---------------------------------------------------------------------------
# Summary.
# ---------------------------------------------------------------------------
{
  cat "$TMPD/head"
  echo
  echo "step       status   time   detail"
  for l in "${STEP_LINES[@]}"; do echo "$l"; done
  echo
  echo "overall: $([ $FAILED = 0 ] && echo PASS || echo FAIL)"
  if [ -s "$TMPD/build" ]; then
    echo
    echo "-- build errors / spills (first 20 lines) --"
    cat "$TMPD/build"
  fi
  if [ -s "$ctest_log" ]; then
    echo
    echo "-- ctest --"
    grep -E "tests passed|tests failed|Total Test time" "$ctest_log" || true
    n_skip=$(grep -c "\*\*\*Skipped\|Not Run (Disabled)" "$ctest_log" 2>/dev/null || true)
    echo "skipped tests: ${n_skip:-0}"
    failed=$(sed -n '/The following tests FAILED:/,/^Errors while running CTest/p' "$ctest_log" | grep -E "^\s+[0-9]+ - " || true)
    if [ -n "$failed" ]; then
      echo "failed tests (first 40 of $(echo "$failed" | wc -l)):"
      echo "$failed" | head -40
    fi
    skips=$(grep -oE "(not built|no supported GPU|not supported yet)[^\"]*" "$ctest_log" | sort | uniq -c | sort -rn | head -5 || true)
    [ -n "$skips" ] && { echo "skip reasons:"; echo "$skips"; }
  fi
  if [ -s "$OUTDIR/bench.log" ]; then
    echo
    echo "-- bench --"
    grep -E "^device:|geomean|CHECK FAIL|no Hopper GPU|cannot load" "$OUTDIR/bench.log" | head -40 || true
    echo "rows: PASS $(grep -cE '\| PASS \|$' "$OUTDIR/bench.log")  FAIL $(grep -cE '\| FAIL \|$' "$OUTDIR/bench.log")"
  fi
  for tool in memcheck racecheck; do
    if [ -s "$OUTDIR/sanitize_$tool.log" ]; then
      echo
      echo "-- $tool --"
      grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race reported|PASSED|FAILED" "$OUTDIR/sanitize_$tool.log" | head -10 || true
    fi
  done
} > "$SUMMARY"

echo
cat "$SUMMARY"
exit $FAILED
