#!/usr/bin/env bash
# Installs dependencies, builds sluice and runs every test.
#
#   scripts/test.sh             default build + ctest, the fault tests 5 more times,
#                               the release build (library, tools and perf; the
#                               tests are built by every other pass), the tsan
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

run_preset default
# The fault tests (ctest label `fault`: processes killed, links cut) again,
# each until it fails, at most SLUICE_FAULT_REPEAT times: a flake there is a
# bug to fix, not to retry.
FAULT_REPEAT=${SLUICE_FAULT_REPEAT:-5}
if [ "$FAULT_REPEAT" != "0" ]; then
  stage "fault tests x$FAULT_REPEAT (default)"
  ctest --preset default -L fault --repeat "until-fail:$FAULT_REPEAT" -j "$JOBS"
fi
# The release preset the README tells users to build (-O3 finds warnings
# the other presets do not): the library, tools, Python module and perf
# suite; the tests, which every other pass builds, are left out (they were
# nearly all of this stage's compile time).
if [ "${SLUICE_RELEASE:-1}" != "0" ]; then
  stage "configure + build (release, without the tests)"
  cmake --preset release -DSLUICE_BUILD_TESTS=OFF >/dev/null
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
stage "all tests passed"
