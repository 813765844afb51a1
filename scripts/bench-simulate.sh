#!/usr/bin/env bash
# Predicted against measured step time on this machine (the placement issue's
# validation): for each case, `pipert simulate` predicts the median step time
# and a real `pipert launch` measures it (median of metrics.jsonl's
# ms_per_step over the later half of the run; for methods that synchronize every
# dp.period steps — diloco, streaming-diloco, co2 — the mean on both sides, over
# whole periods: the prediction simulates 120 steps, 4 of the default 30). Every worker runs one
# compute thread. The device is calibrated once (scripts/calibrate.sh --sparse):
# `pipert bench` on one thread gives --flops (its fp32 GEMM peak) and --efficiency
# (its "% of peak"), a short 2-replica sparse run gives --sparse-cpu; nothing else
# is fitted. Prints one row per case and the median and worst absolute error.
#
# Site cases (root: emulated sites, tools/wan) put replica r in site r mod 2,
# two sites joined by a link of BANDWIDTH and one-way LATENCY: the real run is
# `pipert launch --sites 2 --wan.bandwidth --wan.latency`, the prediction
# `pipert simulate --plan` of a plan and cluster file saying the same. The test
# bed's rate counts IP packets of its MTU (tools/wan/testbed.h, 9000 bytes), of
# which TCP carries MTU − 52 (IPv4 20, TCP 20, timestamps 12): the cluster file
# states that payload rate.
#
# Usage: scripts/bench-simulate.sh [--build DIR] [--steps K] [--cases "S:R:SCHEDULE[:LAYERS] ..."]
#          [--site-cases "S:R:METHOD:BANDWIDTH:LATENCY ..."]
set -euo pipefail
cd "$(dirname "$0")/.."
build=build steps=60
cases="1:1:async-1f1b 2:1:async-1f1b 4:1:async-1f1b 2:1:1f1b 4:1:1f1b 1:2:async-1f1b
       2:2:async-1f1b 2:2:1f1b 2:1:async-1f1b:2,4 2:1:1f1b:4,2"
site_cases="1:2:allreduce:1gbit:10ms 1:2:allreduce:100mbit:50ms 1:2:sparse:100mbit:50ms
            2:2:allreduce:1gbit:10ms 1:2:diloco:10mbit:100ms"
[ "$(id -u)" = 0 ] || site_cases=""
while (($#)); do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --cases) cases=$2; shift 2 ;;
    --site-cases) site_cases=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--steps K] [--cases LIST] [--site-cases LIST]" >&2; exit 2 ;;
  esac
done
pipert=$build/tools/pipert
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# the default model, said explicitly: pipert bench has a reference model of its own
model=(--model.n_layer=6 --model.n_embd=192 --model.n_head=6 --model.block_size=128 --model.vocab_size=256
       --train.batch_size=8)
common=(--runtime.threads=1 "${model[@]}" --train.val_every=0 --train.val_batches=1 --train.log_every=1)

read -r flops efficiency sparse_cpu < <(scripts/calibrate.sh --sparse "$pipert" "${common[@]}")
echo "calibration (pipert bench, 1 thread): GEMM peak $(python3 -c "print(f'{$flops/1e9:.1f}')") GFLOP/s, efficiency $efficiency; sparse $sparse_cpu s per element"
calibrated=(--flops "$flops" --efficiency "$efficiency" --sparse-cpu "$sparse_cpu")
mtu=$(awk '/define PT_WAN_MTU/ {print $3}' tools/wan/testbed.h)
periodic() { case "$1" in diloco|streaming-diloco|co2) return 0 ;; *) return 1 ;; esac; }

# One row: the prediction in $out/predicted.json against the run in $out/run.
# A second argument "mean": the mean of the later half, else its median.
compare() {
  python3 - "$out/predicted.json" "$out/run/metrics.jsonl" "$1" "${2:-median}" <<'PY'
import json, statistics, sys
predicted = 1e3 * json.load(open(sys.argv[1]))["step_s"]
lines = [json.loads(l) for l in open(sys.argv[2])]
ms = [l["ms_per_step"] for l in lines if "ms_per_step" in l]
later = ms[len(ms) // 2:]
measured = statistics.mean(later) if sys.argv[4] == "mean" else statistics.median(later)
error = (predicted - measured) / measured
print(f"{sys.argv[3]:<36} {predicted:12.1f} {measured:12.1f} {100 * error:+7.1f}%")
PY
}

printf '%-36s %12s %12s %8s\n' case "predicted ms" "measured ms" error
errors=()
record() { echo "$1"; errors+=("$(awk '{print $NF}' <<< "$1" | tr -d '%+')"); }
for spec in $cases; do
  IFS=: read -r S R schedule layers <<< "$spec"
  args=(--stages "$S" --replicas "$R" --pipeline.schedule="$schedule" "${common[@]}")
  [ -n "${layers:-}" ] && args+=(--plan.layers="$layers")
  "$pipert" simulate "${args[@]}" "${calibrated[@]}" --json "$out/predicted.json" > /dev/null
  rm -rf "$out/run"
  "$pipert" launch --quiet --out "$out/run" --train.steps="$steps" "${args[@]}" > /dev/null
  record "$(compare "$spec")"
done
for spec in $site_cases; do
  IFS=: read -r S R method bandwidth latency <<< "$spec"
  payload=$(python3 -c "
import re, sys
n, unit = re.fullmatch(r'([0-9.]+)([kmg]?bit)', '$bandwidth'.lower()).groups()
print(f'{float(n) * ($mtu - 52) / $mtu:.6g}{unit}')")
  cat > "$out/cluster.json" <<JSON
{"sites": [{"name": "a"}, {"name": "b"}], "default_link": {"bandwidth": "$payload", "latency": "$latency"}}
JSON
  python3 - "$out/plan.json" "$S" "$R" "$method" <<'PY'
import json, sys
path, S, R, method = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
placement = [[{"site": "ab"[r % 2]} for s in range(S)] for r in range(R)]
json.dump({"format": "pipert-plan-1", "cluster": "cluster.json", "stages": S, "replicas": R,
           "placement": placement, "config": {"dp": {"method": method}}}, open(path, "w"))
PY
  sim_steps=() how=median
  if periodic "$method"; then sim_steps=(--steps 120) how=mean; fi
  "$pipert" simulate --plan "$out/plan.json" "${common[@]}" "${calibrated[@]}" "${sim_steps[@]}" \
    --json "$out/predicted.json" > /dev/null
  rm -rf "$out/run"
  "$pipert" launch --quiet --out "$out/run" --train.steps="$steps" --stages "$S" --replicas "$R" \
    --sites 2 --wan.bandwidth="$bandwidth" --wan.latency="$latency" --dp.method="$method" \
    "${common[@]}" > /dev/null
  record "$(compare "$spec (sites$([ $how = mean ] && echo ', mean'))" $how)"
done
python3 - "${errors[@]}" <<'PY'
import statistics, sys
e = [abs(float(x)) for x in sys.argv[1:]]
print(f"absolute error: median {statistics.median(e):.1f}%, worst {max(e):.1f}%")
PY
