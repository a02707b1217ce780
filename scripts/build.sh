#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
#
# Configure + build into ${BUILD_DIR:-build}. Extra arguments go to cmake, e.g.
#   scripts/build.sh -DFLASH3_HDIMS=128 -DFLASH3_DTYPES=bf16     (one variant, quick)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
gen=()
command -v ninja >/dev/null 2>&1 && [ ! -f "$BUILD_DIR/Makefile" ] && gen=(-G Ninja)
cmake -S . -B "$BUILD_DIR" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
# Ninja's progress lines carry the elapsed time (a full kernel build takes long on few cores).
export NINJA_STATUS=${NINJA_STATUS:-"[%f/%t %es] "}
cmake --build "$BUILD_DIR" -j "$JOBS"
