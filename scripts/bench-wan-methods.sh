#!/usr/bin/env bash
# The link-speed table: every coupling method between two emulated sites
# (pipert launch --sites 2 --wan.bandwidth --wan.latency, docs/RUNNING.md),
# one replica per site, the default model, against the same job with no
# coupling at all (dp.method=none: same processes, cores and links, nothing
# sent), measured in the same run.
#
# For each link and layout (stages per replica), RUNS repetitions; each
# repetition runs every method once, one after the other, so a method and its
# reference `none` see the same state of a shared machine; odd repetitions run
# them in the reverse order (ABBA), so a machine that drifts steadily slower or
# faster favours no method. From replica 0's
# metrics (one line per step) over the steps after the first SKIP and before
# the last: time per step (the sum of the steps' times over their count, so the
# outer steps of diloco and co2 are in it) and the time a step waited on the
# coupling; tokens/s relative to `none` (the median over the repetitions of
# each repetition's ratio); bytes sent between the sites per step (every stage
# of the replica: with one replica per site all coupling traffic crosses); the
# drain: what the last step waited for the exchanges still in flight (the
# asynchronous methods end with nothing on the wire, a one-off cost of the
# run, not of its throughput); and the validation loss at the end. Medians
# over the repetitions. The dense all-reduce over 10 Mbit/s takes ~9 s a step:
# it runs ALLREDUCE_SLOW_STEPS steps there. STEPS must reach 2·dp.period (60
# by default): co2 posts a round only if it falls due within the run.
#
# Usage (root): scripts/bench-wan-methods.sh [--build DIR] [--runs 3] [--steps 70] [--skip 5]
#               [--stages "1 2"] [--links "1gbit:10ms 100mbit:50ms 10mbit:100ms"]
#               [--methods "none allreduce sparse streaming-diloco:overlap=5 ..."] [--out DIR] [--plot]
set -euo pipefail
cd "$(dirname "$0")/.."
build=build runs=3 steps=70 skip=5 stages_list="1 2" plot=0
links="1gbit:10ms 100mbit:50ms 10mbit:100ms"
methods="none allreduce sparse diloco streaming-diloco co2"
out=runs/bench-wan-methods
while (($#)); do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --skip) skip=$2; shift 2 ;;
    --stages) stages_list=$2; shift 2 ;;
    --links) links=$2; shift 2 ;;
    --methods) methods=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --plot) plot=1; shift ;;
    *) echo "usage: $0 [--build DIR] [--runs N] [--steps N] [--skip N] [--stages LIST] [--links LIST] [--methods LIST] [--out DIR] [--plot]" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "$0: needs root (the sites are network namespaces)" >&2; exit 1; }
pipert=$build/tools/pipert
[ -x "$pipert" ] || { echo "$0: no $pipert (build first)" >&2; exit 1; }
ALLREDUCE_SLOW_STEPS=10

# The best compression each method takes (BENCHMARKS.md, coupling methods);
# "method:key=value,key=value" adds dp.* settings (e.g. streaming-diloco:overlap=5).
method_args() {
  local name=${1%%:*} extra=""
  if [[ "$1" == *:* ]]; then extra=$(tr ',' '\n' <<< "${1#*:}" | sed 's/^/--dp./' | tr '\n' ' '); fi
  echo "$(method_base_args "$name") $extra"
}
method_base_args() {
  case "$1" in
    none|allreduce) echo "--dp.method=$1" ;;
    sparse) echo "--dp.method=sparse --dp.fraction=0.05 --dp.compress=e3m0" ;;
    diloco) echo "--dp.method=diloco --dp.compress=e3m0" ;;
    streaming-diloco) echo "--dp.method=streaming-diloco --dp.compress=e3m0" ;;
    co2) echo "--dp.method=co2 --dp.compress=e3m0" ;;
    *) echo "$0: unknown method $1" >&2; exit 2 ;;
  esac
}

# One run: prints "ms_per_step dp_bytes_per_step dp_wait_ms_per_step drain_ms val_loss".
run_one() {
  local dir=$1 bandwidth=$2 latency=$3 stages=$4 method=$5 n=$6 skip_steps=$7
  rm -rf "$dir"
  # shellcheck disable=SC2046
  "$pipert" launch --quiet --stages "$stages" --replicas 2 --sites 2 --out "$dir" \
    --wan.bandwidth="$bandwidth" --wan.latency="$latency" $(method_args "$method") \
    --train.steps="$n" --train.log_every=1 --train.val_every=0 --train.checkpoint_every=0 \
    --pipeline.trace=false > "$dir.log" 2>&1 || { echo "$0: run failed, see $dir.log" >&2; tail -5 "$dir.log" >&2; exit 1; }
  python3 - "$dir" "$stages" "$skip_steps" <<'PY'
import glob, json, sys
d, stages, skip = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def rows(path):
    return [json.loads(l) for l in open(path)]
last = [r for r in rows(f"{d}/metrics-stage-{stages - 1}.jsonl") if r["step"] > skip]
steady, final = last[:-1], last[-1]
ms = sum(r["ms_per_step"] for r in steady) / len(steady)
wait = sum(r["dp_wait_ms"] for r in steady) / len(steady)
drain = max(r["dp_wait_ms"] for r in
            (rows(f"{d}/metrics-stage-{s}.jsonl")[-1] for s in range(stages)))
sent = 0.0
for s in range(stages):
    r = [x for x in rows(f"{d}/metrics-stage-{s}.jsonl") if x["step"] > skip]
    sent += sum(x["dp_bytes"] for x in r) / len(r)
val = [r["val_loss"] for r in rows(f"{d}/metrics.jsonl") if "val_loss" in r]
print(ms, sent, wait, drain, val[-1] if val else float("nan"))
PY
}

mkdir -p "$out"
: > "$out/ratios.txt"
table=$out/table.md
{
  echo "| link | stages | method | ms/step | tokens/s vs none | MB between sites/step | wait ms/step | drain ms | val loss |"
  echo "|---|---|---|---|---|---|---|---|---|"
} > "$table"
for link in $links; do
  bandwidth=${link%%:*} latency=${link##*:}
  for stages in $stages_list; do
    declare -A results=()
    forward=($methods) backward=()
    for ((k = ${#forward[@]} - 1; k >= 0; k--)); do backward+=("${forward[k]}"); done
    for ((i = 0; i < runs; i++)); do
      if ((i % 2)); then order=("${backward[@]}"); else order=("${forward[@]}"); fi
      for method in "${order[@]}"; do
        n=$steps k=$skip
        if [ "$method" = allreduce ] && [ "$bandwidth" = 10mbit ]; then n=$ALLREDUCE_SLOW_STEPS k=2; fi
        results[$method]+="$(run_one "$out/$bandwidth-$latency-s$stages-${method//[:=,]/-}-$i" "$bandwidth" "$latency" "$stages" "$method" "$n" "$k");"
      done
    done
    for method in $methods; do
      python3 - "$bandwidth" "$latency" "$stages" "$method" "${results[none]:-}" "${results[$method]}" <<'PY' 2>> "$out/ratios.txt" | tee -a "$table"
import statistics, sys
bw, lat, stages, method, none, mine = sys.argv[1:7]
def runs(text):
    return [[float(x) for x in r.split()] for r in text.split(";") if r.strip()]
own = runs(mine)
ms, sent, wait, drain, val = (statistics.median(c) for c in zip(*own))
if method == "none":
    rel = "100% (reference)"
elif none:
    ratios = [n[0] / m[0] for n, m in zip(runs(none), own)]  # the same repetition's reference
    rel = f"{100 * statistics.median(ratios):.1f}%"
    print(f"{bw}, {lat}, {method}, {stages} stage(s): per-repetition ratios " +
          " ".join(f"{100 * r:.1f}" for r in ratios), file=sys.stderr)
else:
    rel = "—"
print(f"| {bw}, {lat} | {stages} | {method} | {ms:.0f} | {rel} | {sent / 1e6:.3f} | {wait:.0f} | {drain:.0f} | {val:.4f} |")
PY
    done
    unset results
  done
done
echo "table: $table; per-repetition ratios: $out/ratios.txt"
if [ "$plot" = 1 ]; then
  # shellcheck disable=SC2046
  "$pipert" plot --out "$out/plots" $(ls -d "$out"/*-s1-*-0)
fi
