#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
#
# CI: the README's "Building by hand" commands on a copy of the tree without .deps/ or build/,
# as a fresh clone is, so CMake itself finds (pip-installs) the CUTLASS headers; then installs
# into a temporary prefix. Arguments that differ from the README: -DFLASH3_BUILD_KERNELS=OFF,
# and ctest leaves out the GPU tests.
# .ci/run has just compiled the kernels (bf16, e4m3) from the same sources (scripts/test.sh), and
# a second compile would double CI's time; the manifest, configure, API, tests and install
# steps are the same with and without kernels.
# Needs what scripts/bootstrap.sh installs (cmake, ninja, g++, GoogleTest, python3 with pip).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/src"
# The files a clone has: tracked ones, and new ones git does not ignore (when run on a work tree).
git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
  tar --null -T - -cf - | tar -C "$tmp/src" -xf -

cd "$tmp/src"
t0=$SECONDS
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASH3_BUILD_KERNELS=OFF
cmake --build build -j
# (The GPU tests, label 'gpu', only skip without a GPU and were run so by scripts/test.sh.)
ctest --test-dir build --output-on-failure -LE gpu -j "$(nproc)"
cmake --install build --prefix "$tmp/prefix"
for f in include/flash3/flash3.h include/flash3/flash3_c.h lib/libflash3.so lib/cmake/flash3/flash3Config.cmake; do
  [ -e "$tmp/prefix/$f" ] || { echo "ci_by_hand: $f missing from the install prefix" >&2; exit 1; }
done
echo "ci_by_hand: configure, build, ctest and install by hand: ok ($((SECONDS - t0)) s)"
