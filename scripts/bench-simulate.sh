#!/usr/bin/env bash
# Predicted against measured step time on this machine (the placement issue's
# validation): for each case, `pipert simulate` predicts the median step time
# and a real `pipert launch` measures it (median of metrics.jsonl's
# ms_per_step over the later half of the run; for methods that synchronize every
# dp.period steps — diloco, streaming-diloco, co2 — the mean on both sides, over
# whole periods: the prediction simulates 120 steps, 4 of the default 30). Every worker runs one
# compute thread. Nothing is fitted; the device is calibrated (scripts/calibrate.sh):
#
#   per case, right before its run: `pipert bench` as S·R copies at once, the
#     case's own number of busy workers (calibrate.sh --workers), gives --flops and
#     --efficiency: the compute term is measured under the same contention (cores,
#     memory bandwidth, caches) and the same load of a shared machine as the run
#     it predicts — the "predicted" column;
#   once, at the start: one bench thread alone (the old calibration), for
#     comparison — the "alone" column; and a short 2-replica sparse run gives
#     --sparse-cpu for both.
#
# With --reps N every case is calibrated, predicted and run N times, interleaved
# case by case; the row shows the medians over the N. Prints one row per case and
# the median and worst absolute error of both calibrations.
#
# Site cases (root: emulated sites, tools/wan) put replica r in site r mod 2,
# two sites joined by a link of BANDWIDTH and one-way LATENCY: the real run is
# `pipert launch --sites 2 --wan.bandwidth --wan.latency`, the prediction
# `pipert simulate --plan` of a plan and cluster file saying the same. The test
# bed's rate counts IP packets of its MTU (tools/wan/testbed.h, 9000 bytes), of
# which TCP carries MTU − 52 (IPv4 20, TCP 20, timestamps 12): the cluster file
# states that payload rate. The calibration does not include the launcher's link
# relay thread, which also computes on these cores while bytes cross a link.
#
# Usage: scripts/bench-simulate.sh [--build DIR] [--steps K] [--reps N]
#          [--cases "S:R:SCHEDULE[:LAYERS] ..."] [--site-cases "S:R:METHOD:BANDWIDTH:LATENCY ..."]
set -euo pipefail
cd "$(dirname "$0")/.."
build=build steps=60 reps=1
cases="1:1:async-1f1b 2:1:async-1f1b 4:1:async-1f1b 2:1:1f1b 4:1:1f1b 1:2:async-1f1b
       2:2:async-1f1b 2:2:1f1b 2:1:async-1f1b:2,4 2:1:1f1b:4,2"
site_cases="1:2:allreduce:1gbit:10ms 1:2:allreduce:100mbit:50ms 1:2:sparse:100mbit:50ms
            2:2:allreduce:1gbit:10ms 1:2:diloco:10mbit:100ms"
[ "$(id -u)" = 0 ] || site_cases=""
usage="usage: $0 [--build DIR] [--steps K] [--reps N] [--cases LIST] [--site-cases LIST]"
while (($#)); do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --cases) cases=$2; shift 2 ;;
    --site-cases) site_cases=$2; shift 2 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
pipert=$build/tools/pipert
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# the default model, said explicitly: pipert bench has a reference model of its own
model=(--model.n_layer=6 --model.n_embd=192 --model.n_head=6 --model.block_size=128 --model.vocab_size=256
       --train.batch_size=8)
common=(--runtime.threads=1 "${model[@]}" --train.val_every=0 --train.val_batches=1 --train.log_every=1)
gflops() { python3 -c "print(f'{$1 * $2 / 1e9:.1f}')"; }

read -r flops efficiency sparse_cpu < <(scripts/calibrate.sh --sparse "$pipert" "${common[@]}")
echo "calibration alone (pipert bench, 1 thread, once): GEMM peak $(gflops "$flops" 1) GFLOP/s, efficiency $efficiency; sparse $sparse_cpu s per element"
alone=(--flops "$flops" --efficiency "$efficiency" --sparse-cpu "$sparse_cpu")
mtu=$(awk '/define PT_WAN_MTU/ {print $3}' tools/wan/testbed.h)
periodic() { case "$1" in diloco|streaming-diloco|co2) return 0 ;; *) return 1 ;; esac; }
rows=$out/rows.tsv
: > "$rows"

# Milliseconds a step of the prediction $1 (pipert simulate --json).
predicted_ms() { python3 -c "import json, sys; print(1e3 * json.load(open(sys.argv[1]))['step_s'])" "$1"; }

# Milliseconds a step of the run in $out/run: the median of the later half of
# its steps, or with "mean" their mean.
measured_ms() {
  python3 - "$out/run/metrics.jsonl" "$1" <<'PY'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
ms = [l["ms_per_step"] for l in lines if "ms_per_step" in l]
later = ms[len(ms) // 2:]
print(statistics.mean(later) if sys.argv[2] == "mean" else statistics.median(later))
PY
}

# One repetition of case $1 (a row's name) with $2 = median or mean and $3 busy
# workers: calibrate under them, predict with both calibrations
# (simulate_args[@] + each), run (launch_args[@]), append a line to $rows (with
# the 1-minute load average as the run starts).
measure_case() {
  local name=$1 how=$2 workers=$3 f e
  read -r f e < <(scripts/calibrate.sh --workers "$workers" "$pipert" "${common[@]}")
  "$pipert" simulate "${simulate_args[@]}" --flops "$f" --efficiency "$e" --sparse-cpu "$sparse_cpu" \
    --json "$out/predicted.json" > /dev/null
  local predicted; predicted=$(predicted_ms "$out/predicted.json")
  "$pipert" simulate "${simulate_args[@]}" "${alone[@]}" --json "$out/predicted-alone.json" > /dev/null
  local predicted_alone; predicted_alone=$(predicted_ms "$out/predicted-alone.json")
  rm -rf "$out/run"
  local load; load=$(cut -d' ' -f1 /proc/loadavg)
  "$pipert" launch --quiet --out "$out/run" --train.steps="$steps" "${launch_args[@]}" > /dev/null
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$predicted" "$predicted_alone" "$(measured_ms "$how")" \
    "$(gflops "$f" "$e")" "$load" >> "$rows"
}

# Writes $out/cluster.json and $out/plan.json for site case S R METHOD BANDWIDTH LATENCY.
write_site_plan() {
  local payload
  payload=$(python3 -c "
import re, sys
n, unit = re.fullmatch(r'([0-9.]+)([kmg]?bit)', '$4'.lower()).groups()
print(f'{float(n) * ($mtu - 52) / $mtu:.6g}{unit}')")
  cat > "$out/cluster.json" <<JSON
{"sites": [{"name": "a"}, {"name": "b"}], "default_link": {"bandwidth": "$payload", "latency": "$5"}}
JSON
  python3 - "$out/plan.json" "$1" "$2" "$3" <<'PY'
import json, sys
path, S, R, method = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
placement = [[{"site": "ab"[r % 2]} for s in range(S)] for r in range(R)]
json.dump({"format": "pipert-plan-1", "cluster": "cluster.json", "stages": S, "replicas": R,
           "placement": placement, "config": {"dp": {"method": method}}}, open(path, "w"))
PY
}

for ((rep = 1; rep <= reps; rep++)); do
  for spec in $cases; do
    IFS=: read -r S R schedule layers <<< "$spec"
    simulate_args=(--stages "$S" --replicas "$R" --pipeline.schedule="$schedule" "${common[@]}")
    [ -n "${layers:-}" ] && simulate_args+=(--plan.layers="$layers")
    launch_args=("${simulate_args[@]}")
    measure_case "$spec" median $((S * R))
  done
  for spec in $site_cases; do
    IFS=: read -r S R method bandwidth latency <<< "$spec"
    write_site_plan "$S" "$R" "$method" "$bandwidth" "$latency"
    simulate_args=(--plan "$out/plan.json" "${common[@]}") how=median
    if periodic "$method"; then simulate_args+=(--steps 120) how=mean; fi
    launch_args=(--stages "$S" --replicas "$R" --sites 2 --wan.bandwidth="$bandwidth"
                 --wan.latency="$latency" --dp.method="$method" "${common[@]}")
    measure_case "$spec (sites$([ $how = mean ] && echo ', mean'))" $how $((S * R))
  done
done

python3 - "$rows" "$reps" <<'PY'
import collections, statistics, sys
runs = collections.OrderedDict()
for line in open(sys.argv[1]):
    name, *numbers = line.rstrip("\n").split("\t")
    runs.setdefault(name, []).append([float(x) for x in numbers])
reps = int(sys.argv[2])
print(f"{'case':<40} {'predicted':>10} {'measured':>10} {'error':>7}   {'alone':>8} {'error':>7}"
      f"   {'device GFLOP/s':>14}   {'load':>9}" + ("   (medians of %d runs)" % reps if reps > 1 else ""))
errors, errors_alone = [], []
for name, rows in runs.items():
    predicted, alone, measured, device, _ = (statistics.median(column) for column in zip(*rows))
    loads = [row[-1] for row in rows]
    error, error_alone = (100 * (p - measured) / measured for p in (predicted, alone))
    errors.append(abs(error))
    errors_alone.append(abs(error_alone))
    print(f"{name:<40} {predicted:10.1f} {measured:10.1f} {error:+6.1f}%   {alone:8.1f} {error_alone:+6.1f}%"
          f"   {device:14.1f}   {min(loads):4.1f}-{max(loads):<4.1f}")
for label, e in (("calibrated under the case's workers", errors), ("calibrated alone, once", errors_alone)):
    print(f"absolute error, {label}: median {statistics.median(e):.1f}%, worst {max(e):.1f}%")
PY
