#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
#
# Full check on the GPU machine (Hopper, CUDA toolkit, cmake, ninja, torch; no network):
#   build (all cores, into build/, reused when present) -> ctest (unit tests, then the
#   GPU tests) -> bench/bench.py -> optional compute-sanitizer runs -> optional Python
#   package steps (pip install ./python, import, pytest, per-call overhead, training
#   example) -> OUTDIR/summary.txt
#
# usage: scripts/gpu_check.sh [--sanitize] [--python] [--steps LIST] OUTDIR [extra cmake args...]
#   --sanitize     also run compute-sanitizer memcheck + racecheck on a small subset of the GPU tests
#   --python       also run the Python package steps (pip,import,pytest,overhead,train)
#   --steps LIST   comma-separated subset of:
#                    build,unit,gpu,bench,sanitize,pip,import,pytest,overhead,train
#                  (default: build,unit,gpu,bench, plus sanitize with --sanitize and the
#                  Python steps with --python; e.g. --steps build,pip,import,pytest)
# environment:
#   BUILD_DIR (build)          JOBS (nproc)             CTEST_GPU_JOBS (8: GPU test processes at once)
#   BUILD_TARGET (all)         cmake --build target, e.g. flash3 (the library only: enough for
#                              the Python steps)
#   GPU_TEST_REGEX (all)       ctest -R filter for the GPU tests
#   BENCH_ARGS ("")            extra bench.py arguments, e.g. "--quick" or "--hdims 128 --passes fwd"
#   SANITIZE_FILTER            gtest filter for the sanitizer runs
#   FLASH3_GPU_TESTS_QUICK=1   the GPU test matrix leaves out its seqlen-4096 cases
#   PYTHON (python3)           interpreter with torch (Python steps and bench.py)
#   PYTEST_ARGS (--maxfail=10) extra pytest arguments (e.g. "-x", "-k forward")
#   TRAIN_ARGS ("")            extra examples/train_gpt.py arguments (default run: 300 steps,
#                              4 layers, d_model 512, 8 heads of 64, seqlen 1024, batch 8)
#   DEADLINE_S (none)          total time budget in seconds: a step that would start with less
#                              than 20 s left is skipped, and each step's timeout is cut to what
#                              is left (without it only the Python steps have timeouts)
#
# Every step runs even when an earlier one failed (a step that needs a missing
# artifact is reported as failed); the exit status is non-zero when any step failed.
# OUTDIR receives: env.txt build.log ctest.log bench.log bench.csv (bench.png with
# BENCH_ARGS=--plot ...) sanitize_memcheck.log sanitize_racecheck.log pip.log import.log
# pytest.log pytest.xml bench_overhead.log bench_overhead.csv train.log train_loss.csv
# train_loss.png train_summary.json summary.txt (those of the steps that ran).
# On the device machine carry .deps/cutlass (and build/ to reuse it).
set -o pipefail
set -u

usage() { sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//'; }

SANITIZE=0
PYSTEPS=0
STEPS=""
OUTDIR=""
CMAKE_EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) SANITIZE=1; shift ;;
    --python) PYSTEPS=1; shift ;;
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
  [ "$PYSTEPS" = 1 ] && STEPS="$STEPS,pip,import,pytest,overhead,train"
fi
for s in ${STEPS//,/ }; do
  case "$s" in
    build|unit|gpu|bench|sanitize|pip|import|pytest|overhead|train) ;;
    *) echo "gpu_check.sh: unknown step '$s'" >&2; usage >&2; exit 64 ;;
  esac
done

mkdir -p "$OUTDIR" || exit 64
OUTDIR=$(cd "$OUTDIR" && pwd)
cd "$(dirname "$0")/.." || exit 64
REPO=$(pwd)
[ -f scripts/env.sh ] && source scripts/env.sh

BUILD_DIR=${BUILD_DIR:-build}
case "$BUILD_DIR" in /*) BUILD_ABS=$BUILD_DIR ;; *) BUILD_ABS=$REPO/$BUILD_DIR ;; esac
JOBS=${JOBS:-$(nproc)}
CTEST_GPU_JOBS=${CTEST_GPU_JOBS:-8}
BUILD_TARGET=${BUILD_TARGET:-}
BENCH_ARGS=${BENCH_ARGS:-}
PY=${PYTHON:-python3}
PYTEST_ARGS=${PYTEST_ARGS:---maxfail=10}
TRAIN_ARGS=${TRAIN_ARGS:-}
DEADLINE_S=${DEADLINE_S:-0}
SANITIZE_FILTER=${SANITIZE_FILTER:-"Fwd/FwdMatrix.*bf16_d128x128_nomask_sq128_sk128_gqa8x2_b1:Fwd/FwdMatrix.*bf16_d128x128_causal_sq113_sk1023_mqa4x1_b3:Fwd/FwdMatrix.*fp16_d64x64_window128x0_sq1023_sk113_mha2x2_b1:Fwd/FwdMatrix.*bf16_d256x256_causal_sq1000_sk1000_mha2x2_b1:Fwd/FwdMatrix.*fp16_d192x128_window256x256_sq17_sk17_gqa8x2_b3:FwdGpu.EmptySeqlen*:FwdGpu.HostOrMisalignedPointerIsAnError:Bwd/BwdMatrix.*bf16_d128x128_causal_sq128_sk128_gqa8x2_b1:Bwd/BwdMatrix.*bf16_d256x256_window128x0_sq17_sk17_mha2x2_b1:Bwd/BwdMatrix.*fp16_d64x64_nomask_sq113_sk1023_mqa4x1_b1:BwdGpu.EmptySeqlen*"}

SUMMARY="$OUTDIR/summary.txt"
TMPD=$(mktemp -d)
trap 'rm -rf "$TMPD"' EXIT
START=$SECONDS
STEP_LINES=()
FAILED=0

has_step() { case ",$STEPS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# record NAME STATUS SECONDS [DETAIL]
record() {
  STEP_LINES+=("$(printf '%-10s %-8s %5ss  %s' "$1" "$2" "$3" "${4:-}")")
  [ "$2" = "FAIL" ] && FAILED=1
  echo "== $1: $2 ($3 s) ${4:-}"
}

# run_step NAME LOGFILE(append) MAX_SECONDS COMMAND... : runs, tees, records OK/FAIL.
# MAX_SECONDS 0: no limit of its own; DEADLINE_S > 0 cuts it to the time left.
run_step() {
  local name=$1 log=$2 max=$3
  shift 3
  if [ "$DEADLINE_S" -gt 0 ]; then
    local left=$((DEADLINE_S - (SECONDS - START)))
    if [ "$left" -lt 20 ]; then record "$name" SKIP 0 "out of time (DEADLINE_S=$DEADLINE_S)"; return 1; fi
    if [ "$max" -eq 0 ] || [ "$max" -gt "$left" ]; then max=$left; fi
  fi
  local t0=$SECONDS rc
  local limit=()
  [ "$max" -gt 0 ] && limit=(timeout --kill-after=10 "$max")
  echo "== $name${limit[*]:+ (timeout ${max}s)}: $*" | tee -a "$log"
  "${limit[@]}" "$@" 2>&1 | tee -a "$log"
  rc=$?
  if [ $rc -eq 0 ]; then record "$name" OK $((SECONDS - t0))
  elif [ ${#limit[@]} -gt 0 ] && { [ $rc -eq 124 ] || [ $rc -eq 137 ]; }; then
    record "$name" FAIL $((SECONDS - t0)) "timed out after ${max}s, see $(basename "$log")"
  else record "$name" FAIL $((SECONDS - t0)) "exit $rc, see $(basename "$log")"; fi
  return $rc
}

# ---------------------------------------------------------------------------
# 0. Environment.
# ---------------------------------------------------------------------------
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
  echo "cmake: $(cmake --version 2>/dev/null | head -1)   ninja: $(ninja --version 2>/dev/null || echo 'not found')"
  $PY - <<'EOF' 2>&1
import sys
print("python", sys.version.split()[0])
for m in ("torch", "setuptools", "wheel", "pip", "pytest", "numpy", "matplotlib"):
    try:
        mod = __import__(m)
        print(f"{m} {getattr(mod, '__version__', '?')}")
    except Exception as e:
        print(f"{m}: not importable ({type(e).__name__})")
try:
    import torch
    print("cuda", torch.version.cuda, "available", torch.cuda.is_available(),
          torch.cuda.get_device_name() if torch.cuda.is_available() else "")
except Exception:
    pass
EOF
  echo "steps: $STEPS   build dir: $BUILD_DIR   cmake extra: ${CMAKE_EXTRA[*]:-none}"
} > "$OUTDIR/env.txt"
cat "$OUTDIR/env.txt"

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
  if run_step configure "$OUTDIR/build.log" 0 cmake -S . -B "$BUILD_DIR" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
       "${cutlass_args[@]}" "${CMAKE_EXTRA[@]}"; then
    target=()
    [ -n "$BUILD_TARGET" ] && target=(--target "$BUILD_TARGET")
    # Keep going past a failing target so whatever can be built is built (and tested).
    keep=()
    if [ -f "$BUILD_DIR/build.ninja" ]; then keep=(-- -k 0); else keep=(-- -k); fi
    run_step build "$OUTDIR/build.log" 0 cmake --build "$BUILD_DIR" "${target[@]}" -j "$JOBS" "${keep[@]}"
  else
    record build FAIL 0 "not attempted: configure failed"
  fi
  grep -E "error|Error|warning: .*spill" "$OUTDIR/build.log" | grep -v -E "Werror|error_|-Wno-error" | head -20 \
    > "$TMPD/build" || true
fi

# ---------------------------------------------------------------------------
# 2. Tests.
# ---------------------------------------------------------------------------
ctest_log="$OUTDIR/ctest.log"
if has_step unit || has_step gpu; then : > "$ctest_log"; fi
if has_step unit; then
  if [ -f "$BUILD_DIR/CTestTestfile.cmake" ]; then
    run_step unit "$ctest_log" 0 ctest --test-dir "$BUILD_DIR" --output-on-failure -LE gpu -j "$JOBS" --timeout 600
  else
    record unit FAIL 0 "no $BUILD_DIR/CTestTestfile.cmake (build step?)"
  fi
fi
if has_step gpu; then
  if [ -x "$BUILD_DIR/tests/flash3_gpu_tests" ]; then
    regex=()
    [ -n "${GPU_TEST_REGEX:-}" ] && regex=(-R "$GPU_TEST_REGEX")
    run_step gpu "$ctest_log" 0 ctest --test-dir "$BUILD_DIR" --output-on-failure -L gpu -j "$CTEST_GPU_JOBS" \
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
  run_step bench "$OUTDIR/bench.log" 0 $PY bench/bench.py --lib "$lib" --csv "$OUTDIR/bench.csv" $BENCH_ARGS
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
      run_step "$tool" "$log" 0 "$san" --tool "$tool" --error-exitcode 86 --print-limit 50 \
        "$BUILD_DIR/tests/flash3_gpu_tests" --gtest_filter="$SANITIZE_FILTER" --gtest_brief=1
    done
  fi
fi

# ---------------------------------------------------------------------------
# 5. The Python package: pip install (no build isolation, no deps: offline; links
#    the library built above), import from outside the repository, pytest, the
#    per-call overhead, the training example.
# ---------------------------------------------------------------------------
if has_step pip; then
  : > "$OUTDIR/pip.log"
  $PY -m pip uninstall -y flash3 >>"$OUTDIR/pip.log" 2>&1
  rm -rf python/build python/flash3.egg-info
  run_step pip "$OUTDIR/pip.log" 240 env FLASH3_BUILD_DIR="$BUILD_ABS" MAX_JOBS="$JOBS" \
    $PY -m pip install --no-build-isolation --no-deps -v ./python
fi
if has_step import; then
  : > "$OUTDIR/import.log"
  cat > "$TMPD/import_check.py" <<'EOF'
import os
import torch
import flash3
print("flash3", flash3.__version__, "from", os.path.dirname(flash3.__file__))
print("files:", sorted(os.listdir(os.path.dirname(flash3.__file__))))
print("device supported:", flash3.device_is_supported())
for d, dv in [(64, 64), (96, 96), (128, 128), (192, 192), (256, 256), (192, 128)]:
    print(f"  bf16 {d}x{dv}: forward {flash3.forward_is_built(torch.bfloat16, d, dv)}, "
          f"backward {flash3.backward_is_built(torch.bfloat16, d, dv)}")
q = torch.randn(1, 128, 2, 128, device="cuda", dtype=torch.bfloat16)
print("smoke:", flash3.flash_attn_func(q, q, q, causal=True).float().abs().mean().item())
EOF
  run_step import "$OUTDIR/import.log" 60 bash -c "cd /tmp && $PY $TMPD/import_check.py"
fi
if has_step pytest; then
  : > "$OUTDIR/pytest.log"
  # shellcheck disable=SC2086
  run_step pytest "$OUTDIR/pytest.log" 300 $PY -m pytest python/tests -q -rfEs -p no:cacheprovider \
    --junitxml="$OUTDIR/pytest.xml" $PYTEST_ARGS
fi
if has_step overhead; then
  : > "$OUTDIR/bench_overhead.log"
  run_step overhead "$OUTDIR/bench_overhead.log" 120 $PY python/bench_overhead.py --csv "$OUTDIR/bench_overhead.csv"
fi
if has_step train; then
  : > "$OUTDIR/train.log"
  # shellcheck disable=SC2086
  run_step train "$OUTDIR/train.log" 200 $PY examples/train_gpt.py --out "$OUTDIR" $TRAIN_ARGS
fi

# ---------------------------------------------------------------------------
# Summary.
# ---------------------------------------------------------------------------
# section TITLE FILE FILTER: the title and FILE through the shell pipeline FILTER, when FILE is not empty.
section() {
  [ -s "$2" ] || return 0
  echo
  echo "-- $1 --"
  bash -c "$3" < "$2" || true
}
{
  cat "$OUTDIR/env.txt"
  echo
  echo "step       status   time   detail"
  for l in "${STEP_LINES[@]}"; do echo "$l"; done
  echo "total: $((SECONDS - START)) s"
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
    section "$tool" "$OUTDIR/sanitize_$tool.log" \
      'grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race reported|PASSED|FAILED" | head -10'
  done
  section import "$OUTDIR/import.log" 'grep -v "^==" | head -20'
  section pytest "$OUTDIR/pytest.log" 'tail -n 40 | grep -E "passed|failed|error|FAILED|ERROR|SKIPPED" | head -40'
  section overhead "$OUTDIR/bench_overhead.log" "sed -n '/sq x sk/,\$p' | head -12"
  section training "$OUTDIR/train.log" 'grep -E "^(data|model|max \||final loss|  \[.*FAILED)" | head -10'
} > "$SUMMARY"

echo
cat "$SUMMARY"
exit $FAILED
