#!/usr/bin/env bash
# Installs dependencies, builds sluice (release) and runs the main examples:
#  1. the seed pipeline Range(5).Map(x*x).Map(x+1), executed locally;
#  2. the same pipeline on an in-process service (a dispatcher and two
#     workers): Range(5).Map(x*x).Distribute(parallel_epochs).Map(x+1);
#  3. two consumers sharing job "shared" over three iterations;
#  4. the perf suite in quick mode (sluice-perf transport and pipeline, about a
#     minute each, and engine, under 30 s; results in build/release/perf/*.json
#     and *.png).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
export SLUICE_LOG_LEVEL=${SLUICE_LOG_LEVEL:-warn}

scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$JOBS" \
  --target sluice_local_pipeline sluice_distribute_seed sluice_shared_job \
           sluice-perf sluice-worker sluice_perf_plugin
echo "== local pipeline"
./build/release/examples/sluice_local_pipeline
echo "== distributed seed example"
./build/release/examples/sluice_distribute_seed
echo "== shared job, two consumers, three iterations"
./build/release/examples/sluice_shared_job
echo "== perf suite, quick (see perf/RESULTS.md for full runs)"
./build/release/perf/sluice-perf transport --quick \
  --json build/release/perf/transport-quick.json --plot build/release/perf/transport-quick.png
./build/release/perf/sluice-perf pipeline --quick \
  --json build/release/perf/pipeline-quick.json --plot build/release/perf/pipeline-quick.png
./build/release/perf/sluice-perf engine --quick --json build/release/perf/engine-quick.json
