#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
#
# CI: compiles and links the torch extension (python/csrc/*.cpp) against the headers and
# libraries of PyPI's torch wheel and BUILD_DIR's libflash3.so; fails when either step fails.
# torch is unpacked, not installed: importing it loads its CUDA libraries (the nvidia-* wheels,
# several GB) that compiling does not need, so the flags torch.utils.cpp_extension gives a
# CUDAExtension's .cpp source (python/setup.py) are spelled out here. Nothing runs (no GPU).
# usage: scripts/ci_torch_ext.sh [BUILD_DIR (build)]
# environment: TORCH_VERSION (2.15.0: its headers need C++20), CXX (g++), JOBS (compiles at once:
# the number of CPUs)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
build_dir=$(cd "${1:-build}" && pwd)
[ -e "$build_dir/libflash3.so" ] || { echo "ci_torch_ext: no libflash3.so in $build_dir" >&2; exit 1; }
torch_version=${TORCH_VERSION:-2.15.0}
cxx=${CXX:-g++}
cuda_home=$(cd "$(dirname "$(command -v nvcc)")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

t0=$SECONDS
PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 \
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "torch==$torch_version"
whl=$(ls "$tmp"/torch-*.whl)
echo "ci_torch_ext: $(basename "$whl") ($(($(stat -c %s "$whl") / 1048576)) MiB)"
# A wheel is a zip file: take the headers and the libraries the extension links against.
python3 - "$whl" "$tmp" <<'EOF'
import sys, zipfile
whl, out = sys.argv[1:]
libs = {f"torch/lib/lib{n}.so" for n in ("c10", "c10_cuda", "torch", "torch_cpu", "torch_cuda", "torch_python")}
with zipfile.ZipFile(whl) as z:
    z.extractall(out, [n for n in z.namelist() if n.startswith("torch/include/") or n in libs])
EOF
rm "$whl"
echo "ci_torch_ext: torch $torch_version fetched and unpacked in $((SECONDS - t0)) s"

torch=$tmp/torch
read -r py_include py_libdir py_lib < <(python3 -c 'import sysconfig as s; v = s.get_config_var
print(s.get_paths()["include"], v("LIBDIR"), v("LDLIBRARY"))')
[ -f "$py_include/Python.h" ] || { echo "ci_torch_ext: no Python.h in $py_include (Debian: python3-dev)" >&2; exit 1; }
# -z defs (every symbol of the extension resolved) needs a shared libpython to resolve the
# Python C API against; it catches a call into libflash3 that the library does not define.
defs=()
case "$py_lib" in
  *.so) defs=(-Wl,-z,defs "-L$py_libdir" "-l:$py_lib") ;;
  *) echo "ci_torch_ext: $py_lib is not a shared library: linking without -z defs" ;;
esac

# The extension's translation units (python/setup.py lists the same), compiled JOBS at a time
# (default: the number of CPUs; xargs fails when any compile fails), then linked together.
sources=(common attention varlen combine kvcache registration)
objects=("${sources[@]/%/.o}")
objects=("${objects[@]/#/$tmp/}")
cxxflags=(-std=c++20 -fPIC -O3 -DTORCH_API_INCLUDE_EXTENSION_H -DTORCH_EXTENSION_NAME=_C -Iinclude
  -isystem "$torch/include" -isystem "$torch/include/torch/csrc/api/include"
  -isystem "$cuda_home/include" -isystem "$py_include")
t0=$SECONDS
printf '%s\n' "${sources[@]}" |
  xargs -P "${JOBS:-$(nproc)}" -I{} "$cxx" -c "python/csrc/{}.cpp" -o "$tmp/{}.o" "${cxxflags[@]}"
"$cxx" -shared -o "$tmp/_C.so" "${objects[@]}" "-L$build_dir" -lflash3 "-L$torch/lib" \
  -ltorch_python -ltorch -ltorch_cpu -ltorch_cuda -lc10_cuda -lc10 "-L$cuda_home/lib64" -lcudart \
  "${defs[@]}" -Wl,-rpath,'$ORIGIN'
echo "ci_torch_ext: python/csrc/{$(IFS=,; echo "${sources[*]}")}.cpp compiled and linked against" \
     "torch $torch_version in $((SECONDS - t0)) s"
