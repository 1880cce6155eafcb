#!/usr/bin/env bash
# Installs dependencies, builds sluice (release) and runs the main examples:
#  1. the seed pipeline Range(5).Map(x*x).Map(x+1), executed locally;
#  2. the same pipeline on an in-process service (a dispatcher and two
#     workers): Range(5).Map(x*x).Distribute(parallel_epochs).Map(x+1);
#  3. two consumers sharing job "shared" over three iterations, and the seed
#     example from Python (the sluice module, Debian's /usr/bin/python3), and
#     a torch training loop checkpointed and resumed on a new service;
#  4. an ImageNet-style training pipeline (decode, RandomResizedCrop(224),
#     flip, normalize, batch 64) over 256 synthetic JPEGs on two workers;
#  5. the perf suite in quick mode (sluice-perf transport and pipeline, about a
#     minute each, engine, under 30 s, and images, about 10 s, beside PyTorch's
#     DataLoader; results in build/release/perf/*.json
#     and *.png).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
export SLUICE_LOG_LEVEL=${SLUICE_LOG_LEVEL:-warn}

scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$JOBS" \
  --target sluice_local_pipeline sluice_distribute_seed sluice_shared_job \
           sluice_imagenet_pipeline sluice-make-jpeg-corpus \
           sluice_python sluice-perf sluice-worker sluice_perf_plugin
echo "== local pipeline"
./build/release/examples/sluice_local_pipeline
echo "== distributed seed example"
./build/release/examples/sluice_distribute_seed
echo "== shared job, two consumers, three iterations"
./build/release/examples/sluice_shared_job
echo "== the seed example from Python"
PYTHONPATH=build/release/python /usr/bin/python3 python/examples/distribute_seed.py
echo "== checkpoint and resume a torch training loop over the service"
PYTHONPATH=build/release/python /usr/bin/python3 python/examples/checkpoint_resume.py
echo "== ImageNet-style pipeline over a synthetic JPEG corpus, two workers"
rm -rf build/release/demo-corpus
./build/release/tools/sluice-make-jpeg-corpus --out build/release/demo-corpus --images 256 --classes 4
./build/release/examples/sluice_imagenet_pipeline build/release/demo-corpus --batch 64
echo "== perf suite, quick (see perf/RESULTS.md for full runs)"
./build/release/perf/sluice-perf transport --quick \
  --json build/release/perf/transport-quick.json --plot build/release/perf/transport-quick.png
./build/release/perf/sluice-perf pipeline --quick \
  --json build/release/perf/pipeline-quick.json --plot build/release/perf/pipeline-quick.png
./build/release/perf/sluice-perf engine --quick --json build/release/perf/engine-quick.json
./build/release/perf/sluice-perf images --quick --json build/release/perf/images-quick.json
