#!/usr/bin/env bash
# Quick start, step 2: the whole test suite, in a release build and in a build
# with AddressSanitizer and UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build
# The srun tests need a SLURM: a one-node one on this machine (they skip themselves without it).
if [ "$(id -u)" = 0 ]; then
  scripts/slurm-one-node.sh start || echo "test: no one-node SLURM here; the srun tests skip themselves"
fi
# On a failure, a digest of why each test failed is printed last (scripts/failure-digest.py):
# a log cut to its end, as CI's is, shows it for a test that failed early in the suite too.
meson test -C build --print-errorlogs || { scripts/failure-digest.py build; exit 1; }
# The sanitizer build's command tests run every job on runtime.device=cpu-guarded: tensors the
# host cannot read outside kernel calls, so host code touching "device" memory crashes as on a GPU.
# The suite release_only (tests/meson.build: the churn bed's short form, shaped links between
# sites, the elastic scenarios under mpirun and srun) runs in the release build only: it tests
# timing and orchestration over library paths the other command tests run sanitized.
# Without the CUDA backend: the release build compiles it, and no host code of it runs without a GPU
# (nvcc's objects took 40 of this build's 107 s).
scripts/build.sh build-sanitize -Dbuildtype=debugoptimized -Db_sanitize=address,undefined -Db_lundef=false \
  -Dtest_device=cpu-guarded -Dcuda=disabled
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  meson test -C build-sanitize --print-errorlogs --timeout-multiplier 4 --no-suite release_only ||
  { scripts/failure-digest.py build-sanitize; exit 1; }
# Both builds replayed fuzz/corpus/ (suite fuzz); now a few seconds of real
# fuzzing per harness, in clang's libFuzzer build (scripts/fuzz.sh, build-fuzz).
scripts/fuzz.sh -t 3

# `meson install` gives a usable library: install into a staging root and
# build a program against it through pkg-config.
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
meson install -C build --destdir "$stage" --quiet
cat > "$stage/embed.c" <<'C'
#include <pipert/pipert.h>
#include <stdio.h>
int main(void) { printf("libpipert %s: %s\n", pipert_version(), pipert_result_str(PIPERT_OK)); return 0; }
C
pcdir=$(dirname "$(find "$stage" -name pipert.pc | head -n 1)")
libdir=$(dirname "$(find "$stage" -name 'libpipert.so' | head -n 1)")
PKG_CONFIG_PATH="$pcdir" PKG_CONFIG_SYSROOT_DIR="$stage" \
  cc "$stage/embed.c" -o "$stage/embed" $(PKG_CONFIG_PATH="$pcdir" PKG_CONFIG_SYSROOT_DIR="$stage" pkg-config --cflags --libs pipert)
LD_LIBRARY_PATH="$libdir" "$stage/embed"
# libpipert exports include/pipert/pipert.h and nothing else
exported=$(nm -D --defined-only "$libdir/libpipert.so" | awk '{print $3}')
if echo "$exported" | grep -v '^pipert_'; then
  echo "install check: libpipert exports the symbols above, which are not pipert_*" >&2
  exit 1
fi
echo "install check: ok ($(echo "$exported" | wc -l) symbols exported, all pipert_*)"

# The MPI example builds against the installed library too, and runs: 2 stages
# x 2 replicas under mpirun for 2 steps.
if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
  mpicc examples/embed_mpi.c -o "$stage/embed_mpi" \
    $(PKG_CONFIG_PATH="$pcdir" PKG_CONFIG_SYSROOT_DIR="$stage" pkg-config --cflags --libs pipert)
  mpi_flags=()
  if mpirun --version 2>&1 | grep -q "Open MPI"; then
    mpi_flags=(--oversubscribe -x LD_LIBRARY_PATH)
    if [ "$(id -u)" = 0 ]; then mpi_flags+=(--allow-run-as-root); fi
  fi
  LD_LIBRARY_PATH="$libdir" mpirun "${mpi_flags[@]}" -np 4 "$stage/embed_mpi" --steps 2 --out "$stage/embed_mpi-run"
  echo "installed MPI example: ok"
else
  echo "installed MPI example: skipped (no mpicc or mpirun)"
fi
