#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
#
# Builds one self-contained flash3 wheel (flash3/_C*.so + libflash3.so.MAJOR.MINOR beside it,
# RPATH $ORIGIN) into dist/, against the torch of PYTHON's environment; the wheel requires that
# torch's major.minor and a driver for its CUDA major, nothing else (no compiler).
#   scripts/build_wheel.sh                    # the default kernel set: 65 units of 65-95 s of one core
#   FLASH3_DTYPES=bf16 FLASH3_HDIMS=128 scripts/build_wheel.sh        # a small wheel (a few units)
#   FLASH3_LIB_DIR=build scripts/build_wheel.sh   # package build/libflash3.so as it is (no kernel build)
#   scripts/build_wheel.sh --shim             # also the opt-in FlashAttention-3 name shim's wheel
# Environment: FLASH3_DTYPES / FLASH3_HDIMS / FLASH3_FEATURES / FLASH3_PASSES (the kernel set),
# FLASH3_LIB_DIR, FLASH3_BUILD_DIR (default build-python), MAX_JOBS, WHEEL_DIR (dist), PYTHON (python3).
# One line per finished build step, with the elapsed time, is printed as the kernels compile.
set -euo pipefail
export FLASH3_PROGRESS_TTY=0  # the progress lines are shown below (grep), not again on the terminal
cd "$(dirname "$0")/.."
source scripts/env.sh
python=${PYTHON:-python3}
out=${WHEEL_DIR:-dist}
shim=0
args=()
for a in "$@"; do
  case "$a" in
    --shim) shim=1 ;;
    *) args+=("$a") ;;
  esac
done
"$python" -c "import torch, setuptools, wheel" 2>/dev/null || {
  echo "build_wheel: $python needs torch (the wheel is built against it), setuptools and wheel" >&2; exit 1; }
mkdir -p "$out"
t0=$SECONDS
echo "== build_wheel: torch $("$python" -c 'import torch; print(torch.__version__)'), kernel set:" \
     "dtypes=${FLASH3_DTYPES-default} hdims=${FLASH3_HDIMS-default} features=${FLASH3_FEATURES-default}" \
     "${FLASH3_LIB_DIR:+(prebuilt $FLASH3_LIB_DIR)}"
# -v: pip shows the build's output (the per-step progress lines) instead of a spinner; the whole
# output goes to $out/build_wheel.log, the progress lines to the terminal.
log=$out/build_wheel.log
set +e
"$python" -m pip wheel --no-build-isolation --no-deps -v -w "$out" ./python "${args[@]}" 2>&1 | tee "$log" |
  grep --line-buffered -E '^ *\[flash3 build'
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" != 0 ]; then
  tail -n 40 "$log" >&2
  echo "build_wheel: pip wheel failed ($rc); whole output: $log" >&2
  exit 1
fi
if [ "$shim" = 1 ]; then
  "$python" -m pip wheel --no-build-isolation --no-deps -q -w "$out" ./python/shim
fi
version=$(head -n1 VERSION)
for w in "$out"/flash3-"$version"-*.whl "$out"/flash3_fa3_shim-"$version"-*.whl; do
  [ -e "$w" ] && echo "== build_wheel: $w ($(($(stat -c %s "$w") / 1048576)) MiB)"
done
echo "== build_wheel: done in $((SECONDS - t0)) s"
