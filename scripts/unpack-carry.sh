#!/usr/bin/env bash
# Unpacks the GPU carry's compressed host libraries beside themselves, once: `scripts/gpu-check.sh
# prepare` xz-compresses the large ones (OpenBLAS: 36 MB, 4 MB packed) so that the build, the
# libraries and the tree fit what one device call carries (64 MiB). Python's lzma does it: the
# GPU machines have Python, not necessarily xz. gpu-check.sh run and bench-gpu-compare.sh call it.
#
#   scripts/unpack-carry.sh [CARRY_DIR]   (default build-gpu-carry)
set -euo pipefail
dir=${1:-build-gpu-carry}
for packed in "$dir"/lib/*.xz; do
  [ -e "$packed" ] || continue
  unpacked=${packed%.xz}
  [ -e "$unpacked" ] && continue
  python3 - "$packed" "$unpacked.part" <<'PY'
import lzma, shutil, sys
with lzma.open(sys.argv[1]) as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  mv "$unpacked.part" "$unpacked"
done
