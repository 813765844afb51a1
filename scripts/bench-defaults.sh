#!/usr/bin/env bash
# The coupling methods' tuned defaults against their alternatives, on corpora and seeds
# (issue 28 item 7, BENCHMARKS.md "Defaults"): every cell (corpus x seed) is one run of
# scripts/bench-dp-quality.sh (2 stages x 2 replicas, STEPS steps, allreduce first as the
# cell's reference); the table gives each method's gap to allreduce in every cell and their mean.
# A default changes for a value better than the old one in every cell; of values within the
# seeds' spread of each other, the smaller change. A corpus the model memorizes in STEPS steps
# (validation loss rising while the training loss falls: /usr/share/common-licenses, 240 kB, at
# 500 steps) ranks how fast a method overfits, not how well it couples: leave it out.
#
# Usage: scripts/bench-defaults.sh [--steps K] [--methods "..."] [--seeds "1337 7"]
#                                  [--corpora "NAME=PATH ..."] [--out DIR] [--build DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=500 out=runs/bench-defaults build=build seeds="1337 7"
corpora="fortunes="
methods="allreduce sparse:dp.delay=10,dp.lambda=1 sparse:dp.delay=10,dp.lambda=3
sparse:dp.delay=10,dp.lambda=4 diloco:dp.outer_lr=0.7,dp.outer_momentum=0.9
diloco:dp.outer_lr=1.0,dp.outer_momentum=0.5"
while (($#)); do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --methods) methods=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --corpora) corpora=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "usage: $0 [--steps K] [--methods LIST] [--seeds LIST] [--corpora LIST] [--out DIR] [--build DIR]" >&2
       exit 2 ;;
  esac
done
methods=$(echo $methods) # one line
mkdir -p "$out"
for corpus in $corpora; do
  name=${corpus%%=*} path=${corpus#*=}
  for seed in $seeds; do
    every="seed=$seed"
    [[ -n $path ]] && every+=",data.path=$path"
    scripts/bench-dp-quality.sh --steps "$steps" --build "$build" --methods "$methods" --every "$every" \
      --out "$out/$name-$seed" | tee "$out/$name-$seed.txt"
  done
done
python3 - "$out" $methods <<'PY'
import os, re, sys
out, specs = sys.argv[1], sys.argv[2:]
cells = sorted(f[:-4] for f in os.listdir(out) if f.endswith(".txt") and f != "times.txt")
gaps = {s: {} for s in specs}
for cell in cells:
    for line in open(os.path.join(out, cell + ".txt")):
        m = re.match(r"(\S+)\s+([\d.]+)\s+([+-][\d.]+)%", line)
        if m and m.group(1) in gaps:
            gaps[m.group(1)][cell] = float(m.group(3))
print(f"\n{'gap to allreduce':<48}" + "".join(f"{c:>16}" for c in cells) + f"{'mean':>9}")
for s in specs[1:]:
    row = [gaps[s].get(c) for c in cells]
    known = [g for g in row if g is not None]
    mean = f"{sum(known) / len(known):+8.2f}%" if known else "      -"
    print(f"{s:<48}" + "".join(f"{g:+15.2f}%" if g is not None else f"{'-':>16}" for g in row) + mean)
PY
