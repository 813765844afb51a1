#!/usr/bin/env bash
# The heterogeneous validation case of the placement issue: two emulated sites
# on this machine, one core each, site b's device SHARE times as fast as site
# a's (its worker limited by the kernel's CPU bandwidth control: `pipert
# launch --plan` does it from the cluster file, tools/wan/cpu_limit.h). For
# each plan, `pipert simulate --plan` predicts tokens/s and `pipert launch
# --plan` measures them (median ms_per_step over the later half of the run),
# REPS runs each, interleaved:
#   solver    what `pipert plan --spanning` chooses for the cluster;
#   even      2 stages, the blocks split evenly, stage 0 in a, stage 1 in b;
#   replicas  1 stage, a replica in each site (dp.method=allreduce);
#   fast-only 1 stage, 1 replica, in a (the slow site left idle).
# Prints predicted and measured tokens/s per plan, the error, and both rankings.
# The device is calibrated by `pipert bench` on one thread alone (calibrate.sh without --workers).
# Root only (network namespaces, cgroups).
#
# Usage: scripts/bench-slow-site.sh [--build DIR] [--steps K] [--reps N] [--share S] [--link RATE]
set -euo pipefail
cd "$(dirname "$0")/.."
build=build steps=60 reps=3 share=0.5 link=1gbit
while (($#)); do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --share) share=$2; shift 2 ;;
    --link) link=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--steps K] [--reps N] [--share S] [--link RATE]" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "$0: needs root (emulated sites, cgroups)" >&2; exit 1; }
pipert=$build/tools/pipert
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
model=(--model.n_layer=6 --model.n_embd=192 --model.n_head=6 --model.block_size=128 --model.vocab_size=256
       --train.batch_size=8)
common=(--runtime.threads=1 "${model[@]}" --train.val_every=0 --train.val_batches=1 --train.log_every=1
        --pipeline.schedule=1f1b)

read -r flops efficiency < <(scripts/calibrate.sh "$pipert" "${common[@]}")
echo "calibration (pipert bench, 1 thread): GEMM peak $(python3 -c "print(f'{$flops/1e9:.1f}')") GFLOP/s, efficiency $efficiency; site b at ${share}x, link $link"

python3 - "$out" "$flops" "$share" "$link" <<'PY'
import json, sys
out, flops, share, link = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
group = lambda f: [{"name": "cpu", "kind": "cpu", "count": 1, "fp32_flops": f, "memory": "8gib"}]
json.dump({"description": "two sites on this machine, b slower", "sites": [
    {"name": "a", "groups": group(flops)}, {"name": "b", "groups": group(flops * share)}],
    "links": [{"between": ["a", "b"], "bandwidth": link, "latency": "1ms"}]},
    open(f"{out}/cluster.json", "w"))
a, b = {"site": "a", "group": "cpu"}, {"site": "b", "group": "cpu"}
plans = {"even": (2, 1, "3,3", [[a, b]], "allreduce"),
         "replicas": (1, 2, "", [[a], [b]], "allreduce"),
         "fast-only": (1, 1, "", [[a]], "allreduce")}
for name, (S, R, layers, placement, method) in plans.items():
    config = {"dp": {"method": method}, "plan": {"layers": layers}}
    json.dump({"format": "pipert-plan-1", "cluster": "cluster.json", "stages": S, "replicas": R,
               "layers": layers or "6", "placement": placement, "config": config},
              open(f"{out}/{name}.json", "w"))
PY
"$pipert" plan --cluster "$out/cluster.json" --out "$out/solver.json" --spanning --keep 3 \
  --efficiency "$efficiency" "${common[@]}" | sed 's/^/  /'

plans="solver even replicas fast-only"
for name in $plans; do
  "$pipert" simulate --plan "$out/$name.json" "${common[@]}" --efficiency "$efficiency" \
    --json "$out/$name.predicted.json" > /dev/null
done
for rep in $(seq "$reps"); do
  for name in $plans; do
    rm -rf "$out/run"
    "$pipert" launch --quiet --plan "$out/$name.json" --out "$out/run" --train.steps="$steps" \
      "${common[@]}" > /dev/null
    python3 - "$out/run/metrics.jsonl" "$out/$name.measured" <<'PY'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
ms = [l["ms_per_step"] for l in lines if "ms_per_step" in l]
open(sys.argv[2], "a").write(f"{statistics.median(ms[len(ms) // 2:])}\n")
PY
  done
done
python3 - "$out" $plans <<'PY'
import json, statistics, sys
out, names = sys.argv[1], sys.argv[2:]
rows = []
for name in names:
    plan = json.load(open(f"{out}/{name}.json"))
    predicted = json.load(open(f"{out}/{name}.predicted.json"))
    tokens_per_step = predicted["tokens_per_s"] * predicted["step_s"]
    runs = [float(x) for x in open(f"{out}/{name}.measured")]
    measured_ms = statistics.median(runs)
    measured = tokens_per_step / (measured_ms / 1e3)
    rows.append((name, plan, predicted["tokens_per_s"], measured, runs))
print(f"{'plan':<10} {'S x R':>6} {'layers':>8} {'predicted tok/s':>16} {'measured tok/s':>15} {'error':>7}  ms/step runs")
for name, plan, p, m, runs in rows:
    print(f"{name:<10} {plan['stages']:>2} x {plan['replicas']:<2} {plan.get('layers', ''):>8} {p:16.0f} "
          f"{m:15.0f} {100 * (p - m) / m:+6.1f}%  " + ", ".join(f"{x:.1f}" for x in runs))
by_p = [r[0] for r in sorted(rows, key=lambda r: -r[2])]
by_m = [r[0] for r in sorted(rows, key=lambda r: -r[3])]
print("ranked by prediction:  " + " > ".join(by_p))
print("ranked by measurement: " + " > ".join(by_m) + ("  (same order)" if by_p == by_m else "  (different)"))
PY
