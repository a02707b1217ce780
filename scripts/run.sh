#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
#
# The main job: on a Hopper GPU, runs flash3 on the built-in standard shapes
# (FlashAttention-3 paper shapes), checks each against a reference and prints a
# TFLOP/s table beside cuDNN and FlashAttention-2 (torch SDPA). Without a Hopper
# GPU it says so in one line and exits non-zero. Arguments go to bench/bench.py.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh >/dev/null
scripts/build.sh >/dev/null
BUILD_DIR=${BUILD_DIR:-build}
if ! "$BUILD_DIR/flash3_info" --check; then exit 2; fi
exec python3 bench/bench.py --lib "$BUILD_DIR/libflash3.so" "$@"
