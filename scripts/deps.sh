#!/usr/bin/env bash
# Installs pipert's build and runtime dependencies from Debian 12's packages.
# Idempotent: does nothing when everything is already there. Run as root.
set -euo pipefail

packages=(
  build-essential pkg-config meson ninja-build
  libopenblas-openmp-dev   # OpenBLAS, OpenMP variant: shares pipert's OpenMP threads
  libjansson-dev           # JSON: configuration, safetensors headers, metrics
  libcriterion-dev         # tests
  libboost-context-dev     # tests: the emulated CUDA device's threads as fibers (tests/cuda_host)
  libhwloc-dev hwloc       # topology and pinning
  libucx-dev ucx-utils     # transport (and ucx_perftest for its benchmark)
  fortunes                 # the default training text
  openmpi-bin libopenmpi-dev  # the embedding example (examples/) and the mpirun tests
  python3 iproute2         # benchmark scripts (tables; network namespaces and tc for emulated sites)
  gdb                      # a test whose job hangs prints the workers' stacks (tests/command.h)
  slurm-wlm munge          # a one-node SLURM for the srun tests (scripts/slurm-one-node.sh)
  gnuplot-nox              # pipert plot
  libsodium-dev            # authentication: the job secret proved by challenge and response
  clang libclang-rt-dev libomp-dev  # libFuzzer harnesses (scripts/fuzz.sh, fuzz/): clang, its
                           # fuzzer and sanitizer runtimes, OpenMP for clang
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The pthread build of OpenBLAS, if present, would win the alternatives and
# spin its own threads beside OpenMP's.
pthread_blas=$(dpkg-query -W -f='${Status}' libopenblas0-pthread 2>/dev/null | grep -c "install ok installed" || true)

if [ ${#missing[@]} -eq 0 ] && [ "$pthread_blas" = 0 ]; then
  echo "deps: all installed"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "deps: missing packages (${missing[*]}); run this script as root" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
if [ ${#missing[@]} -gt 0 ]; then
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
if [ "$pthread_blas" != 0 ]; then
  apt-get remove -y -q libopenblas-pthread-dev libopenblas0-pthread
fi
echo "deps: installed"
