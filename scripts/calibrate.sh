#!/usr/bin/env bash
# Prints "FLOPS EFFICIENCY" for the simulator from `pipert bench` (one compute
# thread given in the arguments): this machine's fp32 GEMM peak in FLOP/s and
# the share of it a training step reaches. Used by bench-simulate.sh and
# bench-slow-site.sh.
#
# With --sparse, also a third number: dp.method=sparse's own CPU work (gather the
# step's partition, apply its average; scheduler/cost.h) in seconds per element of
# the partition, for `pipert simulate --sparse-cpu`: a 2-replica sparse run on this
# host (loopback links, 24 steps), the mean time of its "couple" spans per step
# (steps 2 to 23, both replicas) over p·P (P: the stage's parameters, from the
# checkpoint). Usage: scripts/calibrate.sh [--sparse] PIPERT [bench and launch arguments...]
set -euo pipefail
sparse=0
[ "${1:-}" = --sparse ] && { sparse=1; shift; }
pipert=$1
shift
read -r flops efficiency < <("$pipert" bench "$@" 2>/dev/null | python3 -c '
import re, sys
text = sys.stdin.read()
peak = float(re.search(r"GEMM peak .*: ([0-9.]+) GFLOP/s", text)[1])
share = float(re.search(r"([0-9.]+)% of peak", text)[1])
print(peak * 1e9, round(share / 100, 4))')
if [ "$sparse" = 0 ]; then echo "$flops $efficiency"; exit 0; fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
steps=24 fraction=0.05
"$pipert" launch --quiet --out "$out/run" --train.steps=$steps --replicas 2 --dp.method=sparse \
  --dp.fraction=$fraction "$@" > /dev/null
sparse_cpu=$(python3 - "$out/run" "$steps" "$fraction" <<'PY'
import collections, glob, json, math, struct, sys
run, steps, fraction = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
with open(f"{run}/ckpt-{steps:08d}-stage-0.safetensors", "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
params = sum(math.prod(v["shape"]) for k, v in header.items()
             if k != "__metadata__" and not k.startswith(("optimizer", "dp.")))
per_step = []
for path in glob.glob(f"{run}/trace-rank-*.json"):
    t = json.load(open(path))
    spans = collections.defaultdict(float)
    for e in t["traceEvents"] if isinstance(t, dict) else t:
        if e.get("ph") == "X" and e.get("name") == "couple":
            spans[e["args"]["step"]] += e["dur"] * 1e-6
    per_step += [spans[s] for s in range(2, steps)]
print(f"{sum(per_step) / len(per_step) / (fraction * params):.4g}")
PY
)
echo "$flops $efficiency $sparse_cpu"
