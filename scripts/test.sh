#!/usr/bin/env bash
# Installs dependencies, builds sluice and runs every test.
#
#   scripts/test.sh             default build + ctest, the fault tests 5 more times,
#                               the release build (tests built, not run), the tsan
#                               build (clang: -Wthread-safety -Werror and
#                               ThreadSanitizer) + its ctest, then the ASan/UBSan
#                               build + ctest
#   SLUICE_RELEASE=0 scripts/test.sh   skip the release build
#   SLUICE_TSAN=0 scripts/test.sh   skip the clang/ThreadSanitizer pass
#   SLUICE_ASAN=0 scripts/test.sh   skip the ASan pass
#   SLUICE_FAULT_REPEAT=N           repeat the fault tests N times (default 5; 0 skips)
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
# The fault tests (ctest label `fault`: processes killed, links cut) again,
# each until it fails, at most SLUICE_FAULT_REPEAT times: a flake there is a
# bug to fix, not to retry.
FAULT_REPEAT=${SLUICE_FAULT_REPEAT:-5}
if [ "$FAULT_REPEAT" != "0" ]; then
  echo "== sluice: fault tests x$FAULT_REPEAT (default)"
  ctest --preset default -L fault --repeat "until-fail:$FAULT_REPEAT" -j "$JOBS"
fi
# The release preset the README tells users to build (-O3 finds warnings
# the other presets do not): built in full, tests included, not run.
if [ "${SLUICE_RELEASE:-1}" != "0" ]; then
  echo "== sluice: configure + build (release)"
  cmake --preset release >/dev/null
  cmake --build --preset release -j "$JOBS"
fi
# clang with -Wthread-safety -Werror (every lock annotation checked) and
# ThreadSanitizer, in one build; its test preset says which suites run.
if [ "${SLUICE_TSAN:-1}" != "0" ]; then
  run_preset tsan
fi
if [ "${SLUICE_ASAN:-1}" != "0" ]; then
  run_preset asan
fi
echo "== sluice: all tests passed"
