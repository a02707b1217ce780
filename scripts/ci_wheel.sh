#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
#
# CI (no GPU): the wheel. In a fresh virtual environment with PyPI's torch (TORCH_VERSION, as
# scripts/ci_torch_ext.sh) and transformers:
#   1. builds the flash3 wheel with scripts/build_wheel.sh around BUILD_DIR's libflash3.so
#      (FLASH3_LIB_DIR: the kernels step 1 compiled are packaged, none is compiled again; only
#      the torch extension flash3._C is compiled), and the FlashAttention-3 name shim's wheel;
#   2. checks the wheel: its files, tag (cpXY-cpXY-linux_x86_64) and metadata (version from
#      VERSION, torch==MAJOR.MINOR.* of the torch built against), _C's NEEDED libflash3.so.M.m ==
#      the bundled file's name == its SONAME and RUNPATH $ORIGIN, libflash3's NEEDED (libcudart and
#      the C/C++ runtime only, no absolute path), nothing but the API exported;
#   3. installs it with --no-deps, imports it, runs `python -m flash3` and the Python tests that
#      need no GPU (SDPA registration, transformers plumbing, the shim's exports and signatures,
#      versions; the GPU cases skip), then installs the shim and checks that it refuses to shadow
#      an installed FlashAttention-3.
# usage: scripts/ci_wheel.sh [BUILD_DIR (build)]
# environment: TORCH_VERSION (2.15.0), TRANSFORMERS_VERSION (5.17.0), PYTHON (python3)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
build_dir=$(cd "${1:-build}" && pwd)
[ -e "$build_dir/libflash3.so" ] || { echo "ci_wheel: no libflash3.so in $build_dir" >&2; exit 1; }
torch_version=${TORCH_VERSION:-2.15.0}
transformers_version=${TRANSFORMERS_VERSION:-5.17.0}
repo=$(pwd)
version=$(head -n1 VERSION)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "ci_wheel: $*" >&2; exit 1; }
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

t0=$SECONDS
"${PYTHON:-python3}" -m venv "$tmp/venv"
py=$tmp/venv/bin/python
"$py" -m pip install --quiet "torch==$torch_version" "transformers==$transformers_version" setuptools wheel pytest
echo "ci_wheel: venv with torch $("$py" -c 'import torch; print(torch.__version__)') and transformers" \
     "$transformers_version in $((SECONDS - t0)) s"

t0=$SECONDS
PYTHON=$py WHEEL_DIR=$tmp/dist FLASH3_LIB_DIR=$build_dir FLASH3_BUILD_DIR=$tmp/build-python \
  scripts/build_wheel.sh --shim
whl=$(ls "$tmp"/dist/flash3-"$version"-*.whl)
shim_whl=$(ls "$tmp"/dist/flash3_fa3_shim-"$version"-*.whl)
echo "ci_wheel: wheels built in $((SECONDS - t0)) s"

# --- 2. the wheel as a file -------------------------------------------------------------------
mm=${version%.*}
tag=$("$py" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
case "$(basename "$whl")" in
  flash3-"$version"-"$tag"-"$tag"-linux_x86_64.whl) ;;
  *) fail "wheel name $(basename "$whl"): expected flash3-$version-$tag-$tag-linux_x86_64.whl" ;;
esac
mkdir "$tmp/unpacked"
"$py" -m zipfile -e "$whl" "$tmp/unpacked"
u=$tmp/unpacked
for f in flash3/__init__.py flash3/__main__.py flash3/_version.py flash3/flash_attn_interface.py flash3/sdpa.py \
         flash3/_interface/__init__.py flash3/_interface/common.py flash3/_interface/func.py \
         flash3/_interface/fp8.py flash3/_interface/varlen.py flash3/_interface/combine.py \
         flash3/_interface/kvcache.py flash3/_interface/fake.py \
         flash3/integrations/transformers.py "flash3/libflash3.so.$mm"; do
  [ -e "$u/$f" ] || fail "the wheel lacks $f"
done
[ -n "$(find "$u/flash3-$version.dist-info" -name 'LICENSE*')" ] || fail "the wheel has no LICENSE"
so_files=$(cd "$u" && find . -name '*.so*' | sort | tr '\n' ' ')
[ "$(echo "$so_files" | wc -w)" = 2 ] || fail "shared objects in the wheel: $so_files (expected _C and libflash3)"
ext=$(ls "$u"/flash3/_C*.so)
meta=$u/flash3-$version.dist-info/METADATA
grep -qx "Version: $version" "$meta" || fail "METADATA version is not $version"
want_torch=$("$py" -c 'import torch; print("torch==%s.%s.*" % tuple(torch.__version__.split("+")[0].split(".")[:2]))')
grep -qx "Requires-Dist: $want_torch" "$meta" || fail "METADATA does not require $want_torch: $(grep Requires "$meta")"
grep -qx "Root-Is-Purelib: false" "$u/flash3-$version.dist-info/WHEEL" || fail "the wheel claims to be pure"
grep -q "__version__ = \"$version\"" "$u/flash3/_version.py" || fail "_version.py is not $version"

lib=$u/flash3/libflash3.so.$mm
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libflash3.so.$mm" ] || fail "libflash3's SONAME is '$soname'; expected libflash3.so.$mm"
readelf -d "$ext" | grep -q "(NEEDED).*\[libflash3.so.$mm\]" || fail "_C does not need libflash3.so.$mm"
readelf -d "$ext" | grep -E "\((RUNPATH|RPATH)\)" | grep -qF '$ORIGIN' || fail "_C has no RUNPATH \$ORIGIN"
while read -r needed; do
  case "$needed" in
    libcudart.so.*|libstdc++.so.6|libm.so.6|libgcc_s.so.1|libc.so.6|ld-linux-x86-64.so.2) ;;
    *) fail "libflash3 needs $needed (only libcudart and the C/C++ runtime are expected)" ;;
  esac
done < <(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
exported=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -cv -E '^(flash3_|_ZN6flash3|_ZNK6flash3)' || true)
[ "$exported" = 0 ] || fail "libflash3 exports $exported symbols outside the API"
echo "ci_wheel: $(basename "$whl"): files, tag, metadata ($want_torch), SONAME, NEEDED, RUNPATH, exports ok"

# --- 3. installed -------------------------------------------------------------------------------
t0=$SECONDS
"$py" -m pip install --quiet --no-deps "$whl"
cd "$tmp"  # not the repository: the installed package, not python/flash3, is imported
"$py" -c "import flash3, sys; print('ci_wheel: import flash3', flash3._package_version, 'from', flash3.__file__)"
"$py" -m flash3
cd "$repo"
"$py" -m pytest -q -p no:cacheprovider python/tests/test_sdpa.py python/tests/test_transformers_integration.py \
  python/tests/test_shim.py python/tests/test_version.py

"$py" -m pip install --quiet --no-deps "$shim_whl"
cd "$tmp"
"$py" -c "import flash_attn_interface as a, flash_attn_3.flash_attn_interface as b, flash3
assert a.flash_attn_func is b.flash_attn_func is flash3.flash_attn_func
print('ci_wheel: shim installed: flash_attn_interface and flash_attn_3.flash_attn_interface are flash3')"
# A FlashAttention-3 distribution installed beside it: the shim refuses to import.
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir "$site/flash_attn_3-3.0.0.dist-info"
printf 'Metadata-Version: 2.1\nName: flash_attn_3\nVersion: 3.0.0\n' > "$site/flash_attn_3-3.0.0.dist-info/METADATA"
printf 'flash_attn_3\nflash_attn_interface\n' > "$site/flash_attn_3-3.0.0.dist-info/top_level.txt"
if out=$("$py" -c "import flash_attn_interface" 2>&1); then fail "the shim imported beside a FlashAttention-3 distribution"; fi
echo "$out" | grep -q "refuses to shadow" || fail "unexpected import error: $out"
echo "ci_wheel: the shim refuses to shadow an installed FlashAttention-3"
cd "$repo"
echo "ci_wheel: installed and checked in $((SECONDS - t0)) s"
