#!/usr/bin/env bash
# Installs the build tree at $1 into a scratch prefix, builds the consumer
# project against it with find_package(sluice), and checks its output.
# $2 (optional): extra compiler/linker flags (the sanitizer build passes its
# -fsanitize flags, since a sanitized library needs a sanitized program).
set -euo pipefail
build_dir=$1
extra_flags=${2:-}
src_dir=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log="$work/log"
run() { "$@" >>"$log" 2>&1 || { cat "$log"; echo "failed: $*"; exit 1; }; }
run cmake --install "$build_dir" --prefix "$work/prefix"
run cmake -S "$src_dir" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_CXX_FLAGS="$extra_flags" -DCMAKE_EXE_LINKER_FLAGS="$extra_flags"
run cmake --build "$work/build"
test -f "$work/prefix/include/sluice/sluice.h"
test -x "$work/prefix/bin/sluice-dispatcher"
test -x "$work/prefix/bin/sluice-worker"
out=$("$work/build/consumer")
echo "consumer printed: $out"
[ "$out" = "1 2 5 10 17 " ] || { echo "unexpected output"; exit 1; }
