#!/usr/bin/env bash
# Installs sluice's build and test dependencies from Debian's archive.
# Idempotent: packages already installed are skipped; nothing is downloaded
# from anywhere but the configured apt sources.
#
#   scripts/install-deps.sh          what the builds and tests need (clang and its
#                                    sanitizer runtimes included: the clang, tsan
#                                    and fuzz presets)
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libabsl-dev
  libprotobuf-dev protobuf-compiler
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc
  libucx-dev ucx-utils
  libhwloc-dev hwloc
  libgtest-dev libgmock-dev googletest
  libbenchmark-dev
  libspdlog-dev libfmt-dev
  libcli11-dev
  zlib1g-dev
  libturbojpeg0-dev libpng-dev          # sluice::image decode (dataset/image.cc)
  libarchive-dev        # WebDataset tar shards (dataset/webdataset.cc)
  liblz4-dev libzstd-dev  # wire compression of element frames (core/frame.cc)
  python3-dev pybind11-dev python3-pybind11 python3-numpy python3-pytest  # python/ module and its tests
  python3-torch python3-torchvision python3-pil    # sluice.torch, sluice-perf images' DataLoader side
  gnuplot-nox
  python3 python3-yaml shellcheck prometheus
  openssl               # tests generate throwaway TLS certificates
  iproute2             # ip netns: the fault tests' private networks (tests/service/fault_test.cc)
  clang libclang-rt-14-dev  # -Wthread-safety (clang preset), ThreadSanitizer (tsan), libFuzzer (fuzz)
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
