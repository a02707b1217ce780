#!/usr/bin/env bash
# Installs what flash3 needs on a fresh machine (Debian-based, as root or with sudo):
# cmake, g++, GoogleTest, and the CUTLASS/CuTe headers (PyPI nvidia-cutlass==4.2.0.0
# into .deps/cutlass). The CUDA toolkit (nvcc 12.3+ with sm_90a support) must already
# be installed. Safe to run repeatedly: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi

need_apt=()
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
[ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev libgmock-dev)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3 python3-pip)
if [ ${#need_apt[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "bootstrap: installing ${need_apt[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
  else
    echo "bootstrap: missing ${need_apt[*]} and no apt-get; install them by hand" >&2
    exit 1
  fi
fi

if ! command -v nvcc >/dev/null 2>&1; then
  for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin /usr/local/cuda-12/bin; do
    if [ -x "$d/nvcc" ]; then export PATH="$d:$PATH"; break; fi
  done
fi
command -v nvcc >/dev/null 2>&1 || { echo "bootstrap: nvcc not found: install the CUDA toolkit (12.3+)" >&2; exit 1; }

if [ ! -f .deps/cutlass/cutlass_library/source/include/cute/tensor.hpp ]; then
  echo "bootstrap: installing CUTLASS headers (nvidia-cutlass==4.2.0.0) into .deps/cutlass"
  python3 -m pip install --quiet --no-deps --target .deps/cutlass nvidia-cutlass==4.2.0.0
fi
echo "bootstrap: ok (cmake $(cmake --version | head -1 | awk '{print $3}'), $(nvcc --version | tail -2 | head -1))"
