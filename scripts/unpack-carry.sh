#!/usr/bin/env bash
# Unpacks the GPU carry's compressed host libraries beside themselves, once: `scripts/gpu-check.sh
# prepare` xz-compresses the large ones (OpenBLAS: 36 MB, 4 MB packed) so that the build, the
# libraries and the tree fit what one device call carries (64 MiB). Python's lzma does it: the
# GPU machines have Python, not necessarily xz. gpu-check.sh run and bench-gpu-compare.sh call it.
#
#   scripts/unpack-carry.sh [CARRY_DIR]           (default build-gpu-carry)
#   scripts/unpack-carry.sh --remove [CARRY_DIR]  removes the unpacked copies again (after a dry run
#                                                 here, so the carry stays small enough to carry)
set -euo pipefail
remove=0
if [ "${1:-}" = --remove ]; then remove=1; shift; fi
dir=${1:-build-gpu-carry}
for packed in "$dir"/lib/*.xz; do
  [ -e "$packed" ] || continue
  unpacked=${packed%.xz}
  if [ "$remove" = 1 ]; then rm -f "$unpacked"; continue; fi
  [ -e "$unpacked" ] && continue
  python3 - "$packed" "$unpacked.part" <<'PY'
import lzma, shutil, sys
with lzma.open(sys.argv[1]) as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  mv "$unpacked.part" "$unpacked"
done
