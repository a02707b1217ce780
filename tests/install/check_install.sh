#!/usr/bin/env bash
# Installs the built library into a temporary prefix and builds + runs a
# downstream project that uses find_package(flash3).
set -euo pipefail
build_dir=$1; src_dir=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cmake --install "$build_dir" --prefix "$tmp/prefix" >/dev/null
cmake -S "$src_dir/tests/install/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/consumer" >/dev/null
"$tmp/consumer/consumer"
