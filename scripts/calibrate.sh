#!/usr/bin/env bash
# Prints "FLOPS EFFICIENCY" for the simulator from `pipert bench` (the compute
# threads given in the arguments): a device's fp32 GEMM peak in FLOP/s and the
# share of it a training step reaches. Used by bench-simulate.sh and
# bench-slow-site.sh.
#
# With --workers W (default 1), W bench copies run at once, as many busy
# workers as the job to predict runs, and scripts/calibration.py turns their
# outputs into one device's FLOP/s and efficiency under that contention: the
# achieved FLOP/s per busy device (min(W, devices); devices as `pipert
# simulate` counts them). A step of W workers on a shared machine is slower
# than one thread alone (memory bandwidth, caches, the OS sharing the cores,
# other users' load), and the compute term must be measured under the same
# load as the run it predicts: call this right before that run. W = 1 is one
# copy alone, the old calibration.
#
# With --sparse, also a third number: dp.method=sparse's own CPU work (gather the
# step's partition, apply its average; scheduler/cost.h) in seconds per element of
# the partition, for `pipert simulate --sparse-cpu`: a 2-replica sparse run on this
# host (loopback links, 24 steps), the mean time of its "couple" spans per step
# (steps 2 to 23, both replicas) over p·P (P: the stage's parameters, from the
# checkpoint).
# Usage: scripts/calibrate.sh [--sparse] [--workers W] PIPERT [bench and launch arguments...]
set -euo pipefail
sparse=0 workers=1
while (($#)); do
  case "$1" in
    --sparse) sparse=1; shift ;;
    --workers) workers=$2; shift 2 ;;
    *) break ;;
  esac
done
[[ "$workers" =~ ^[1-9][0-9]*$ ]] || { echo "$0: --workers: expected a count ≥ 1, got \"$workers\"" >&2; exit 2; }
pipert=$1
shift
here=$(dirname "$0")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

devices=1
if [ "$workers" -gt 1 ]; then
  devices=$("$pipert" simulate "$@" --flops 1e9 | sed -n 's/^devices: \([0-9]*\) .*/\1/p')
fi
copies=()
for ((copy = 0; copy < workers; copy++)); do
  "$pipert" bench "$@" > "$out/bench-$copy.txt" 2> "$out/bench-$copy.err" &
  copies+=($!)
done
for copy in "${!copies[@]}"; do
  wait "${copies[$copy]}" || { cat "$out/bench-$copy.err" >&2; exit 1; }
done
read -r flops efficiency < <(python3 "$here/calibration.py" --devices "$devices" "$out"/bench-*.txt)
if [ "$sparse" = 0 ]; then echo "$flops $efficiency"; exit 0; fi
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
