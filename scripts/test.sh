#!/usr/bin/env bash
# Installs dependencies, builds sluice and runs every test.
#
#   scripts/test.sh             the release build (what users and scripts/demo.sh
#                               build; -O3 warnings are errors too) + ctest, the
#                               fault tests 5 more times, the tsan build (clang:
#                               -Wthread-safety -Werror and ThreadSanitizer) + its
#                               ctest, then the ASan/UBSan build + ctest
#   SLUICE_PRESET=default scripts/test.sh   the first pass on another preset
#   SLUICE_TSAN=0 scripts/test.sh   skip the clang/ThreadSanitizer pass
#   SLUICE_ASAN=0 scripts/test.sh   skip the ASan pass
#   SLUICE_FAULT_REPEAT=N           repeat the fault tests N times (default 5; 0 skips)
#
# Three builds, not four: the release build is the one the optimized tests
# run on (a RelWithDebInfo `default` build as well cost a fresh clone 20
# minutes of compiling for nothing the release pass does not check).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
START=$SECONDS
# Each stage's banner says how long the run has taken so far (CI has a time
# limit; the README says what a fresh clone costs).
stage() { echo "== sluice: $* [$(( (SECONDS - START) / 60 )) min elapsed]"; }

scripts/install-deps.sh

run_preset() {
  local preset=$1
  stage "configure + build ($preset)"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j "$JOBS"
  stage "test ($preset)"
  ctest --preset "$preset" -j "$JOBS"
}

PRESET=${SLUICE_PRESET:-release}
run_preset "$PRESET"
# The fault tests (ctest label `fault`: processes killed, links cut) again,
# each until it fails, at most SLUICE_FAULT_REPEAT times: a flake there is a
# bug to fix, not to retry.
FAULT_REPEAT=${SLUICE_FAULT_REPEAT:-5}
if [ "$FAULT_REPEAT" != "0" ]; then
  stage "fault tests x$FAULT_REPEAT ($PRESET)"
  ctest --preset "$PRESET" -L fault --repeat "until-fail:$FAULT_REPEAT" -j "$JOBS"
fi
# clang with -Wthread-safety -Werror (every lock annotation checked) and
# ThreadSanitizer, in one build; its test preset says which suites run.
if [ "${SLUICE_TSAN:-1}" != "0" ]; then
  run_preset tsan
fi
if [ "${SLUICE_ASAN:-1}" != "0" ]; then
  run_preset asan
fi
stage "all tests passed"
