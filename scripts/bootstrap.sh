#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
#
# Installs what flash3 needs on a fresh machine (Debian-based, as root or with sudo):
# cmake, make, ninja, g++, GoogleTest, python3 (+ pip while the CUTLASS headers are missing)
# from apt, and the CUTLASS/CuTe headers (PyPI nvidia-cutlass==4.2.0.0 into .deps/cutlass).
# The CUDA toolkit (nvcc 12.3+ with sm_90a support) must already be installed.
# Safe to run repeatedly: it only installs what is missing, and needs no network then.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

CUTLASS_VERSION=4.2.0.0
have_cutlass() { [ -f .deps/cutlass/cutlass_library/source/include/cute/tensor.hpp ]; }
# The first python3 with a working pip: PATH's, else Debian's (python3-pip installs into
# /usr/bin/python3, which is not PATH's python3 under pyenv or a venv).
pip_python() {
  local py
  for py in python3 /usr/bin/python3; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -m pip --version >/dev/null 2>&1; then
      echo "$py"; return 0
    fi
  done
  return 1
}

need_apt=()
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v make >/dev/null 2>&1 || need_apt+=(make)  # tests/install's consumer project uses Makefiles
command -v ninja >/dev/null 2>&1 || need_apt+=(ninja-build)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
[ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev)
[ -f /usr/include/gmock/gmock.h ] || need_apt+=(libgmock-dev)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
# Debian's python3 comes without pip; it is only needed to fetch the headers.
if ! have_cutlass && ! pip_python >/dev/null; then need_apt+=(python3-pip); fi
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=()
  if [ "$(id -u)" != "0" ]; then
    if command -v sudo >/dev/null 2>&1; then
      SUDO=(sudo)
    else
      echo "bootstrap: missing ${need_apt[*]}: run as root (or install sudo)" >&2
      exit 1
    fi
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "bootstrap: missing ${need_apt[*]} and no apt-get; install them by hand" >&2
    exit 1
  fi
  echo "bootstrap: installing ${need_apt[*]}"
  # dpkg prints every unpacked package even with -qq: keep its log, show it on failure.
  log=$(mktemp)
  # --no-install-recommends: python3-pip recommends build-essential and python3-dev, which
  # nothing here uses; everything needed is named above.
  if ! { "${SUDO[@]}" apt-get update -qq &&
         "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
           "${need_apt[@]}"; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "bootstrap: apt-get failed" >&2
    exit 1
  fi
  rm -f "$log"
fi

cmake_version=$(cmake --version | head -1 | awk '{print $3}')
if [ "$(printf '%s\n' 3.24 "$cmake_version" | sort -V | head -1)" != 3.24 ]; then
  echo "bootstrap: cmake $cmake_version is older than 3.24 (e.g. python3 -m pip install cmake)" >&2
  exit 1
fi
command -v nvcc >/dev/null 2>&1 || { echo "bootstrap: nvcc not found: install the CUDA toolkit (12.3+)" >&2; exit 1; }

if ! have_cutlass; then
  py=$(pip_python) || { echo "bootstrap: no python3 with pip to fetch the CUTLASS headers" >&2; exit 1; }
  echo "bootstrap: installing CUTLASS headers (nvidia-cutlass==$CUTLASS_VERSION) into .deps/cutlass"
  # --target is not refused by PEP 668 (Debian 12's "externally-managed-environment"): it
  # installs into a plain folder, never into the system's site-packages. --upgrade: without
  # it pip skips packages whose folders a failed attempt left behind.
  PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 \
    "$py" -m pip install --quiet --upgrade --no-deps --target .deps/cutlass "nvidia-cutlass==$CUTLASS_VERSION"
  have_cutlass || { echo "bootstrap: .deps/cutlass has no cute/tensor.hpp after pip" >&2; exit 1; }
fi
echo "bootstrap: ok (cmake $cmake_version, $(nvcc --version | tail -2 | head -1))"
