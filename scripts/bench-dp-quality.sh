#!/usr/bin/env bash
# Quality and traffic of the coupling methods at equal tokens (BENCHMARKS.md,
# "Coupling methods"): a STAGES x 2 mesh (async 1F1B with the default
# look-ahead inside each replica) on the default corpus and model, once per
# method, every run with the same steps, seed, data and validation batches.
# Prints the final validation loss, its ratio to allreduce's, and the bytes a
# replica of stage 0 sent per step relative to allreduce (from
# DIR/metrics-stage-0.jsonl: replica 0 writes it).
#
# Usage: scripts/bench-dp-quality.sh [--steps K] [--stages S] [--methods "..."] [--every "k=v,..."]
#                                     [--out DIR] [--build DIR]
#   a method is NAME[:key=value,...], e.g. "sparse:dp.delay=10 streaming-diloco:dp.compress=e3m0";
#   --every's keys go to every method's run (a corpus, a seed: "seed=7,data.path=/usr/share/common-licenses")
set -euo pipefail
cd "$(dirname "$0")/.."
steps=700 stages=2 out=runs/bench-dp-quality build=build every=""
methods="allreduce sparse:dp.delay=10 sparse:dp.delay=10,dp.compress=e3m0 diloco streaming-diloco:dp.compress=e3m0 co2"
while (($#)); do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --stages) stages=$2; shift 2 ;;
    --methods) methods=$2; shift 2 ;;
    --every) every=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "usage: $0 [--steps K] [--stages S] [--methods LIST] [--every KEYS] [--out DIR] [--build DIR]" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
for spec in $methods; do
  name=${spec%%:*}
  keys=()
  if [[ $spec == *:* ]]; then IFS=, read -ra keys <<< "${spec#*:}"; fi
  dir="$out/${spec//[:,=]/_}"
  rm -rf "$dir"
  args=(launch --quiet --stages "$stages" --replicas 2 --out "$dir" --train.steps="$steps"
        --dp.method="$name" --train.checkpoint_every=0 --train.val_batches=32 --train.log_every=1)
  if [[ -n $every ]]; then IFS=, read -ra common <<< "$every"; keys=("${common[@]}" "${keys[@]}"); fi
  for k in "${keys[@]}"; do args+=("--$k"); done
  start=$(date +%s)
  "$build/tools/pipert" "${args[@]}" > "$dir.log" 2>&1 || { echo "$spec: failed (see $dir.log)"; continue; }
  echo "$spec $(( $(date +%s) - start ))" >> "$out/times.txt"
done
python3 - "$out" $methods <<'PY'
import json, os, sys
out, specs = sys.argv[1], sys.argv[2:]
def load(spec):
    d = os.path.join(out, spec.replace(':', '_').replace(',', '_').replace('=', '_'))
    try:
        val = [json.loads(l)["val_loss"] for l in open(os.path.join(d, "metrics.jsonl")) if "val_loss" in l]
        st = [json.loads(l) for l in open(os.path.join(d, "metrics-stage-0.jsonl"))]
    except OSError:
        return None
    sent = sum(l["dp_bytes"] for l in st) / max(1, len(st))
    return val[-1], sent
rows = {s: load(s) for s in specs}
ref = rows.get("allreduce")
print(f"{'method':<42} {'val_loss':>9} {'vs allreduce':>13} {'bytes/step':>12} {'vs allreduce':>13}")
for s, r in rows.items():
    if r is None:
        print(f"{s:<42} failed"); continue
    v, b = r
    rv = f"{100 * (v / ref[0] - 1):+.2f}%" if ref else "-"
    rb = f"{100 * b / ref[1]:.3f}%" if ref and ref[1] else "-"
    print(f"{s:<42} {v:9.4f} {rv:>13} {b:12.0f} {rb:>13}")
PY
