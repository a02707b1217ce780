#!/usr/bin/env bash
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
