#!/usr/bin/env bash
# Unpacks the GPU carry's compressed files beside themselves, once: `scripts/gpu-check.sh prepare`
# xz-compresses the large host libraries (OpenBLAS: 36 MB, 4 MB packed) and binaries (their CUDA
# kernels for three targets) so that the build, the libraries and the tree fit what one device
# call carries (64 MiB); an unpacked file keeps its packed copy's mode (binaries stay executable). Python's lzma does it: the
# GPU machines have Python, not necessarily xz. gpu-check.sh run and bench-gpu-compare.sh call it.
#
#   scripts/unpack-carry.sh [CARRY_DIR]           (default build-gpu-carry)
#   scripts/unpack-carry.sh --remove [CARRY_DIR]  removes the unpacked copies again (after a dry run
#                                                 here, so the carry stays small enough to carry)
set -euo pipefail
remove=0
if [ "${1:-}" = --remove ]; then remove=1; shift; fi
dir=${1:-build-gpu-carry}
for packed in "$dir"/lib/*.xz "$dir"/tools/*.xz "$dir"/tests/*.xz; do
  [ -e "$packed" ] || continue
  unpacked=${packed%.xz}
  if [ "$remove" = 1 ]; then rm -f "$unpacked"; continue; fi
  [ -e "$unpacked" ] && continue
  python3 - "$packed" "$unpacked.part" <<'PY'
import lzma, os, shutil, sys
with lzma.open(sys.argv[1]) as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
os.chmod(sys.argv[2], os.stat(sys.argv[1]).st_mode & 0o777)
PY
  mv "$unpacked.part" "$unpacked"
done
