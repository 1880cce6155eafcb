#!/usr/bin/env bash
# Installs dependencies, builds sluice and runs every test.
#
#   scripts/test.sh             default build + ctest, then the ASan/UBSan build + ctest
#   SLUICE_ASAN=0 scripts/test.sh   skip the sanitizer pass
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}

scripts/install-deps.sh

run_preset() {
  local preset=$1
  echo "== sluice: configure + build ($preset)"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j "$JOBS"
  echo "== sluice: test ($preset)"
  ctest --preset "$preset" -j "$JOBS"
}

run_preset default
if [ "${SLUICE_ASAN:-1}" != "0" ]; then
  run_preset asan
fi
echo "== sluice: all tests passed"
