#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
#
# The test command: installs what is missing, builds, runs every test under ctest.
# CPU tests always run; GPU tests run on a Hopper GPU and are reported as skipped
# (with the reason) elsewhere. Extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/build.sh "$@"
BUILD_DIR=${BUILD_DIR:-build}
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "${JOBS:-$(nproc)}"
# ctest lists skipped tests without gtest's reason; say it once.
if ! "$BUILD_DIR/flash3_info" --check >/dev/null 2>&1; then
  echo "GPU tests (label 'gpu') were skipped: $("$BUILD_DIR/flash3_info" --check)"
fi
# Python binding tests (python/tests): need torch (and a Hopper GPU to do more than skip).
if (cd /tmp && python3 -c "import torch, pytest, flash3") >/dev/null 2>&1; then
  python3 -m pytest -q python/tests
else
  echo "Python binding tests (python/tests) were skipped: torch, pytest or the flash3 package is not importable here" \
       "(on a GPU machine: pip install --no-build-isolation ./python && python3 -m pytest python/tests)"
fi
