#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
#
# Installs the built library into a temporary prefix, then
#   1. checks that libflash3.so exports the public API only (the patterns of cmake/flash3.map),
#      under the SONAME libflash3.so.MAJOR.MINOR of the VERSION file;
#   2. builds + runs a downstream project that uses find_package(flash3) and links every public
#      function (tests/install/consumer: a hidden one fails the link);
#   3. builds + runs the torch-free C example (examples/c_api; "skipped: ..." without a Hopper GPU).
set -euo pipefail
build_dir=$1; src_dir=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cmake --install "$build_dir" --prefix "$tmp/prefix" >/dev/null
lib=$(ls "$tmp"/prefix/lib*/libflash3.so)

version=$(head -n1 "$src_dir/VERSION")
want_soname="libflash3.so.${version%.*}"
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "$want_soname" ] || { echo "SONAME is '$soname'; expected $want_soname (VERSION $version)"; exit 1; }

mapfile -t patterns < <(sed -n 's/^ *\(flash3_\*\|_Z[A-Za-z0-9_]*\*\);$/\1/p' "$src_dir/cmake/flash3.map")
[ "${#patterns[@]}" -gt 10 ] || { echo "no export patterns read from cmake/flash3.map"; exit 1; }
extra=0; count=0
while read -r sym; do
  count=$((count + 1)); ok=0
  for p in "${patterns[@]}"; do
    # shellcheck disable=SC2053  # glob match on purpose: the map's patterns are globs
    [[ $sym == $p ]] && { ok=1; break; }
  done
  [ $ok = 1 ] || { echo "exported but not public: $sym ($(echo "$sym" | c++filt))"; extra=$((extra + 1)); }
done < <(nm -D --defined-only "$lib" | awk '{print $3}')
[ $extra = 0 ] || exit 1
echo "libflash3.so ($soname): $count exported symbols, all public API"

cmake -S "$src_dir/tests/install/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/consumer" >/dev/null
"$tmp/consumer/consumer"

cmake -S "$src_dir/examples/c_api" -B "$tmp/c_api" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/c_api" >/dev/null
"$tmp/c_api/flash3_c_example"
