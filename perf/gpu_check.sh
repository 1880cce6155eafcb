#!/bin/bash
# Host-to-device copies from CUDA-pinned receive arenas versus pageable
# memory, cudaHostAlloc memory and torch's pin_memory() path, plus a check
# that no arena slot is reused under its copy (perf/gpu_check.py).
# Usage: perf/gpu_check.sh [BUILD_DIR]   (default build/default)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../build/default}"
PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" exec /usr/bin/python3 "$here/gpu_check.py"
