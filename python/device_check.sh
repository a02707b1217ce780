#!/usr/bin/env bash
# One-call check of the flash3 Python package on the GPU machine (Hopper, CUDA toolkit, cmake,
# ninja, torch; no network):
#   env -> build libflash3 (reusing $BUILD_DIR) -> pip install ./python -> import from /tmp
#   -> pytest python/tests -> python/bench_overhead.py -> examples/train_gpt.py -> OUT/summary.txt
#
# usage: python/device_check.sh OUT
# environment:
#   BUILD_DIR (build)        CMake build dir of the repository, configured here when new
#   PYTHON (python3)         interpreter with torch
#   PYTEST_ARGS (--maxfail=10)   extra pytest arguments (e.g. "-x", "-k forward")
#   TRAIN_ARGS ("")          extra examples/train_gpt.py arguments (default run: 300 steps, 4 layers,
#                            d_model 512, 8 heads of 64, seqlen 1024, batch 8)
#   STEPS (build,pip,import,pytest,bench,train)   the steps to run (e.g. STEPS=build,pip for a
#                            first call when the kernels are not built yet, then the rest)
#   DEADLINE_S (540)         total time budget: a step that would start with less than 20 s left is
#                            skipped, and each step's timeout is cut to what is left
# Every step runs even when an earlier one failed (its exit status is recorded); the exit
# status is non-zero when any step failed. Files in OUT: env.txt build.log pip.log import.log
# pytest.log pytest.xml bench_overhead.log bench_overhead.csv train.log train_loss.csv
# train_loss.png train_summary.json summary.txt
# Carry .deps/cutlass (and build/ to reuse it) to the device.
set -u -o pipefail

OUT=${1:-}
if [ -z "$OUT" ]; then sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 64; fi
mkdir -p "$OUT" || exit 64
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.." || exit 64
REPO=$(pwd)
[ -f scripts/env.sh ] && source scripts/env.sh

BUILD_DIR=${BUILD_DIR:-build}
PY=${PYTHON:-python3}
PYTEST_ARGS=${PYTEST_ARGS:---maxfail=10}
TRAIN_ARGS=${TRAIN_ARGS:-}
DEADLINE_S=${DEADLINE_S:-540}
JOBS=${JOBS:-$(nproc)}
STEPS=${STEPS:-build,pip,import,pytest,bench,train}
has_step() { case ",$STEPS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
START=$SECONDS
LINES=()
FAILED=0

record() {  # NAME STATUS SECONDS [DETAIL]
  LINES+=("$(printf '%-10s %-5s %5ss  %s' "$1" "$2" "$3" "${4:-}")")
  [ "$2" = FAIL ] && FAILED=1
  echo "== $1: $2 ($3 s) ${4:-}"
}

# step NAME LOG MAX_SECONDS COMMAND...   (runs with a timeout, tees into LOG, records the status)
step() {
  local name=$1 log=$2 max=$3
  shift 3
  local left=$((DEADLINE_S - (SECONDS - START)))
  if [ "$left" -lt 20 ]; then record "$name" SKIP 0 "out of time (DEADLINE_S=$DEADLINE_S)"; return 1; fi
  [ "$max" -gt "$left" ] && max=$left
  local t0=$SECONDS rc
  echo "== $name (timeout ${max}s): $*" | tee -a "$log"
  timeout --kill-after=10 "$max" "$@" >>"$log" 2>&1
  rc=$?
  tail -n 25 "$log" | sed 's/^/    /'
  if [ $rc -eq 0 ]; then record "$name" OK $((SECONDS - t0))
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then record "$name" FAIL $((SECONDS - t0)) "timed out after ${max}s, see $(basename "$log")"
  else record "$name" FAIL $((SECONDS - t0)) "exit $rc, see $(basename "$log")"; fi
  return $rc
}

# ---------------------------------------------------------------------------
# 0. Environment.
# ---------------------------------------------------------------------------
{
  echo "flash3 python device_check  $(date -u '+%Y-%m-%d %H:%M:%S UTC')  host $(hostname)  cores $(nproc)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- 2>/dev/null || echo ' (+ local changes)')"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1 | sed 's/^/gpu: /'
  echo "nvcc: $(nvcc --version 2>/dev/null | tail -1)"
  echo "cmake: $(cmake --version 2>/dev/null | head -1)   ninja: $(ninja --version 2>/dev/null)"
  $PY - <<'EOF' 2>&1
import sys
print("python", sys.version.split()[0])
for m in ("torch", "setuptools", "wheel", "pip", "pytest", "numpy", "matplotlib"):
    try:
        mod = __import__(m)
        print(f"{m} {getattr(mod, '__version__', '?')}")
    except Exception as e:
        print(f"{m}: not importable ({type(e).__name__})")
import torch
print("cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      torch.cuda.get_device_name() if torch.cuda.is_available() else "")
EOF
} > "$OUT/env.txt"
cat "$OUT/env.txt"

# ---------------------------------------------------------------------------
# 1. libflash3 (only the library target; backward kernels when the manifest has them).
# ---------------------------------------------------------------------------
: > "$OUT/build.log"
cmake_args=(-DCMAKE_BUILD_TYPE=Release)
[ -d .deps/cutlass ] && cmake_args+=(-DFLASH3_FETCH_CUTLASS=OFF)
if $PY tools/manifest.py --out "$(mktemp -d)" --passes "fwd;bwd" --kernels 0 >/dev/null 2>&1; then
  cmake_args+=("-DFLASH3_PASSES=fwd;bwd")
  echo "manifest has backward kernels: building fwd;bwd" | tee -a "$OUT/build.log"
else
  echo "manifest has no backward kernels yet: gradient tests will skip" | tee -a "$OUT/build.log"
fi
gen=()
[ ! -f "$BUILD_DIR/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
if ! has_step build; then :
elif step configure "$OUT/build.log" 120 cmake -S . -B "$BUILD_DIR" "${gen[@]}" "${cmake_args[@]}"; then
  step build "$OUT/build.log" 300 cmake --build "$BUILD_DIR" --target flash3 -j "$JOBS"
else
  record build FAIL 0 "not attempted: configure failed"
fi

# ---------------------------------------------------------------------------
# 2. pip install (no build isolation, no deps: offline; links the library built above).
# ---------------------------------------------------------------------------
: > "$OUT/pip.log"
if has_step pip; then
  $PY -m pip uninstall -y flash3 >>"$OUT/pip.log" 2>&1
  rm -rf python/build python/flash3.egg-info
fi
case "$BUILD_DIR" in /*) BUILD_ABS=$BUILD_DIR ;; *) BUILD_ABS=$REPO/$BUILD_DIR ;; esac
has_step pip && step pip "$OUT/pip.log" 240 env FLASH3_BUILD_DIR="$BUILD_ABS" MAX_JOBS="$JOBS" \
  $PY -m pip install --no-build-isolation --no-deps -v ./python

# ---------------------------------------------------------------------------
# 3. Import from outside the repository.
# ---------------------------------------------------------------------------
: > "$OUT/import.log"
IMPORT_PY=$(mktemp --suffix=.py)
cat > "$IMPORT_PY" <<'EOF'
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
has_step import && step import "$OUT/import.log" 60 bash -c "cd /tmp && $PY $IMPORT_PY"

# ---------------------------------------------------------------------------
# 4. Tests.
# ---------------------------------------------------------------------------
: > "$OUT/pytest.log"
# shellcheck disable=SC2086
has_step pytest && step pytest "$OUT/pytest.log" 300 $PY -m pytest python/tests -q -rfEs -p no:cacheprovider \
  --junitxml="$OUT/pytest.xml" $PYTEST_ARGS

# ---------------------------------------------------------------------------
# 5. Per-call overhead.
# ---------------------------------------------------------------------------
: > "$OUT/bench_overhead.log"
has_step bench && step bench "$OUT/bench_overhead.log" 120 $PY python/bench_overhead.py --csv "$OUT/bench_overhead.csv"

# ---------------------------------------------------------------------------
# 6. Training example.
# ---------------------------------------------------------------------------
: > "$OUT/train.log"
# shellcheck disable=SC2086
has_step train && step train "$OUT/train.log" 200 $PY examples/train_gpt.py --out "$OUT" $TRAIN_ARGS

# ---------------------------------------------------------------------------
# Summary.
# ---------------------------------------------------------------------------
{
  cat "$OUT/env.txt"
  echo
  echo "step       status  time   detail"
  for l in "${LINES[@]}"; do echo "$l"; done
  echo "total: $((SECONDS - START)) s"
  echo
  echo "overall: $([ $FAILED = 0 ] && echo PASS || echo FAIL)"
  echo
  echo "-- build errors (first 15) --"
  grep -E "error|Error" "$OUT/build.log" "$OUT/pip.log" 2>/dev/null | grep -v -E "Werror|error_|-Wno-error" | head -15
  echo
  echo "-- import --"
  cat "$OUT/import.log" 2>/dev/null | grep -v "^==" | head -20
  echo
  echo "-- pytest --"
  tail -n 40 "$OUT/pytest.log" 2>/dev/null | grep -E "passed|failed|error|FAILED|ERROR|SKIPPED" | head -40
  echo
  echo "-- overhead --"
  sed -n '/sq x sk/,$p' "$OUT/bench_overhead.log" 2>/dev/null | head -12
  echo
  echo "-- training --"
  grep -E "^(data|model|max \||final loss|  \[.*FAILED)" "$OUT/train.log" 2>/dev/null | head -10
} > "$OUT/summary.txt"
echo
cat "$OUT/summary.txt"
exit $FAILED
