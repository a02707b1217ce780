# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
#
# Sourced by the scripts: puts nvcc on PATH when the toolkit is installed but not on PATH
# (NVIDIA's installers leave PATH alone): /usr/local/cuda, else the newest /usr/local/cuda-X.Y.
if ! command -v nvcc >/dev/null 2>&1; then
  for d in /usr/local/cuda/bin $(ls -d /usr/local/cuda-*/bin 2>/dev/null | sort -rV); do
    if [ -x "$d/nvcc" ]; then export PATH="$d:$PATH"; break; fi
  done
fi
