#!/usr/bin/env bash
# Installs dependencies, builds sluice (release) and runs the main example:
# the seed pipeline Range(5).Map(x*x).Map(x+1), executed locally.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}

scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$JOBS" --target sluice_local_pipeline
./build/release/examples/sluice_local_pipeline
