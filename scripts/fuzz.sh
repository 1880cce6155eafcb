#!/usr/bin/env bash
# Builds the libFuzzer targets (the `fuzz` preset: clang, -fsanitize=fuzzer,address)
# and fuzzes each for a while, starting from the seeds in fuzz/corpus/.
#
#   scripts/fuzz.sh            60 seconds per target
#   scripts/fuzz.sh 600        10 minutes per target
#   FUZZ_TARGETS=journal_reader_fuzz scripts/fuzz.sh 30    one target
#
# New inputs libFuzzer finds go to build/fuzz/corpus/<target>/ (not the
# checked-in seeds); a crash or failed invariant stops the run and leaves its
# input in build/fuzz/artifacts/<target>/. Not part of scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-60}
JOBS=${JOBS:-$(nproc)}
read -ra TARGETS <<< "${FUZZ_TARGETS:-journal_reader_fuzz dataset_def_fuzz image_decode_fuzz webdataset_fuzz}"

scripts/install-deps.sh
echo "== sluice: configure + build (fuzz)"
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$JOBS"

for t in "${TARGETS[@]}"; do
  work=build/fuzz/corpus/$t
  artifacts=build/fuzz/artifacts/$t
  mkdir -p "$work" "$artifacts"
  echo "== sluice: fuzz $t for ${SECONDS_PER_TARGET}s"
  build/fuzz/fuzz/"$t" -max_total_time="$SECONDS_PER_TARGET" -print_final_stats=1 \
    -artifact_prefix="$artifacts/" "$work" "fuzz/corpus/$t"
done
echo "== sluice: fuzzing found nothing"
