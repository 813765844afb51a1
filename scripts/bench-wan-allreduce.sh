#!/usr/bin/env bash
# The dense all-reduce (dp.method=allreduce) between two emulated sites: two
# network namespaces joined by a veth pair shaped to RATE in each direction
# (tc tbf), one `pipert worker` in each, UCX over TCP. It prints the time each
# step waits for the averaging of the default model's gradients, and the time
# the transfer itself took (from the trace: not counting a wait for the other
# replica's compute), as medians over RUNS runs (steps 2.. of each), beside
# the link's limit: a 2-rank ring
# sends the whole buffer once in each direction, both directions at once, so
# the limit is bytes·8/RATE. Two rows: UCX's default protocol choice
# (UCX_RNDV_THRESH=auto: rendezvous for large messages) and pipert's (eager).
# With --baseline DIR, two rows instead: eager with DIR's pipert (e.g. a build
# of an earlier commit) and with --build's, their runs interleaved so that
# both see the same machine.
#
# Usage (root): scripts/bench-wan-allreduce.sh [--rate 100mbit] [--runs 3] [--steps 6] [--build build]
#                                              [--baseline DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
rate=100mbit runs=3 steps=6 build=build baseline=
while (($#)); do
  case "$1" in
    --rate) rate=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --baseline) baseline=$2; shift 2 ;;
    *) echo "usage: $0 [--rate R] [--runs N] [--steps N] [--build DIR] [--baseline DIR]" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "$0: needs root (network namespaces)" >&2; exit 1; }
a=pt-bench-a b=pt-bench-b
out=$(mktemp -d)
cleanup() { ip netns del $a 2>/dev/null || true; ip netns del $b 2>/dev/null || true; rm -rf "$out"; }
trap cleanup EXIT
cleanup; out=$(mktemp -d)
ip netns add $a; ip netns add $b
ip link add pt-bench-va type veth peer name pt-bench-vb
ip link set pt-bench-va netns $a; ip link set pt-bench-vb netns $b
ip -n $a addr add 10.231.0.1/24 dev pt-bench-va; ip -n $b addr add 10.231.0.2/24 dev pt-bench-vb
for ns in $a $b; do ip -n $ns link set lo up; done
ip -n $a link set pt-bench-va up; ip -n $b link set pt-bench-vb up
ip netns exec $a tc qdisc add dev pt-bench-va root tbf rate $rate burst 64kb latency 50ms
ip netns exec $b tc qdisc add dev pt-bench-vb root tbf rate $rate burst 64kb latency 50ms

# One job (BUILD ENV...): prints the median dp_wait_ms of steps 2.., the bytes
# each step sent, and the median transfer time (below).
run_job() {
  local build=$1; shift
  local dir=$out/job port=$((29800 + RANDOM % 100))
  rm -rf "$dir"; mkdir -p "$dir"
  local common=(env PIPERT_SECRET=0123456789abcdef0123456789abcdef PIPERT_COORD=10.231.0.1:$port
                UCX_TLS=tcp PIPERT_LOG=warn "$@" OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=0)
  local args=(worker --out "$dir" --quiet --train.steps="$steps" --train.log_every=1 --runtime.threads=1
              --pipeline.trace=true)
  ip netns exec $a "${common[@]}" OMPI_COMM_WORLD_RANK=0 "$build/tools/pipert" "${args[@]}" > "$dir/r0.log" 2>&1 &
  ip netns exec $b "${common[@]}" OMPI_COMM_WORLD_RANK=1 "$build/tools/pipert" "${args[@]}" > "$dir/r1.log" 2>&1
  wait
  python3 - "$dir" <<'PY'
import json, statistics, sys
d = sys.argv[1]
lines = [json.loads(l) for l in open(f"{d}/metrics-stage-0.jsonl")][1:]
# The transfer alone: each rank's waits for the all-reduces (the trace's
# "couple" spans, two a step: the all-reduces, then after the step), paired in order; a
# transfer runs from the later rank's start to the later end, so the other
# rank's wait for a slower replica's compute is not counted.
waits = []
for r in (0, 1):
    events = json.load(open(f"{d}/trace-rank-{r}.json"))["traceEvents"]
    waits.append([e for e in events if e.get("name") == "couple" and e.get("ph") == "X"])
pairs = list(zip(*waits))[2::2]  # the gradients' all-reduces, steps 2..
transfer = [(max(a["ts"] + a["dur"], b["ts"] + b["dur"]) - max(a["ts"], b["ts"])) / 1e3 for a, b in pairs]
print(statistics.median(l["dp_wait_ms"] for l in lines), lines[0]["dp_bytes"], statistics.median(transfer))
PY
}

bits_per_s=$(python3 -c "import re,sys; m=re.fullmatch(r'([0-9.]+)([kmg]?)bit','$rate'); print(float(m[1])*{'':1,'k':1e3,'m':1e6,'g':1e9}[m[2]])")
# Rows: label, build, environment.
if [ -n "$baseline" ]; then
  labels=("eager, $baseline" "eager, $build") builds=("$baseline" "$build") envs=(PIPERT_DEFAULT=1 PIPERT_DEFAULT=1)
else
  labels=("rendezvous (UCX default)" "eager (pipert default)") builds=("$build" "$build")
  envs=(UCX_RNDV_THRESH=auto PIPERT_DEFAULT=1)
fi
declare -a waits0 waits1 transfers0 transfers1
for ((i = 0; i < runs; i++)); do
  for k in 0 1; do
    read -r w bytes x < <(run_job "${builds[$k]}" "${envs[$k]}")
    unset -n waits transfers; declare -n waits=waits$k transfers=transfers$k
    waits+=("$w") transfers+=("$x")
  done
done
printf '%-34s %9s %11s %9s %8s %8s\n' row "wait ms" "transfer ms" "link ms" "of link" "(wait)"
for k in 0 1; do
  unset -n waits transfers; declare -n waits=waits$k transfers=transfers$k
  python3 - "${labels[$k]}" "$bytes" "$bits_per_s" "${waits[*]}" "${transfers[*]}" <<'PY'
import statistics, sys
label, sent, rate = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
waits = [float(w) for w in sys.argv[4].split()]
transfers = [float(w) for w in sys.argv[5].split()]
# the ring sends `sent` bytes from each rank, both directions at once
limit_ms = 1e3 * sent * 8 / rate
w, x = statistics.median(waits), statistics.median(transfers)
print(f"{label:<34} {w:9.0f} {x:11.0f} {limit_ms:9.0f} {100 * limit_ms / x:7.0f}% {100 * limit_ms / w:7.0f}%"
      f"   transfers: {', '.join(f'{t:.0f}' for t in transfers)}")
PY
done
