#!/usr/bin/env bash
# Installs the build tree at $1 into a scratch prefix, builds the consumer
# project against it with find_package(sluice), and checks its output.
set -euo pipefail
build_dir=$1
src_dir=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
cmake -S "$src_dir" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
test -f "$work/prefix/include/sluice/sluice.h"
out=$("$work/build/consumer")
echo "consumer printed: $out"
[ "$out" = "1 2 5 10 17 " ] || { echo "unexpected output"; exit 1; }
