#!/usr/bin/env bash
# The dense all-reduce (dp.method=allreduce) between two emulated sites: two
# network namespaces joined by a veth pair shaped to RATE in each direction
# (tc tbf), one `pipert worker` in each, UCX over TCP. It prints the time each
# step waits for the averaging of the default model's gradients, as medians
# over RUNS runs (steps 2.. of each), beside the link's limit: a 2-rank ring
# sends the whole buffer once in each direction, both directions at once, so
# the limit is bytes·8/RATE. Two rows: UCX's default protocol choice
# (UCX_RNDV_THRESH=auto: rendezvous for large messages) and pipert's (eager).
#
# Usage (root): scripts/bench-wan-allreduce.sh [--rate 100mbit] [--runs 3] [--steps 6] [--build build]
set -euo pipefail
cd "$(dirname "$0")/.."
rate=100mbit runs=3 steps=6 build=build
while (($#)); do
  case "$1" in
    --rate) rate=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "usage: $0 [--rate R] [--runs N] [--steps N] [--build DIR]" >&2; exit 2 ;;
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

# One job: prints the median dp_wait_ms of steps 2.. and the bytes each step sent.
run_job() {
  local dir=$out/job port=$((29800 + RANDOM % 100))
  rm -rf "$dir"; mkdir -p "$dir"
  local common=(env PIPERT_SECRET=0123456789abcdef0123456789abcdef PIPERT_COORD=10.231.0.1:$port
                UCX_TLS=tcp PIPERT_LOG=warn "$@" OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=0)
  local args=(worker --out "$dir" --quiet --train.steps="$steps" --train.log_every=1 --runtime.threads=1)
  ip netns exec $a "${common[@]}" OMPI_COMM_WORLD_RANK=0 "$build/tools/pipert" "${args[@]}" > "$dir/r0.log" 2>&1 &
  ip netns exec $b "${common[@]}" OMPI_COMM_WORLD_RANK=1 "$build/tools/pipert" "${args[@]}" > "$dir/r1.log" 2>&1
  wait
  python3 - "$dir/metrics-stage-0.jsonl" <<'PY'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1])][1:]
print(statistics.median(l["dp_wait_ms"] for l in lines), lines[0]["dp_bytes"])
PY
}

bits_per_s=$(python3 -c "import re,sys; m=re.fullmatch(r'([0-9.]+)([kmg]?)bit','$rate'); print(float(m[1])*{'':1,'k':1e3,'m':1e6,'g':1e9}[m[2]])")
printf '%-26s %12s %12s %12s\n' protocol "wait ms" "link ms" "of link"
for protocol in "UCX_RNDV_THRESH=auto" "PIPERT_DEFAULT=1"; do
  waits=()
  for ((i = 0; i < runs; i++)); do
    read -r wait bytes < <(run_job "$protocol")
    waits+=("$wait")
  done
  python3 - "$protocol" "$bytes" "$bits_per_s" "${waits[@]}" <<'PY'
import statistics, sys
name, sent, rate = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
waits = [float(w) for w in sys.argv[4:]]
# the ring sends `sent` bytes from each rank, both directions at once
limit_ms = 1e3 * sent * 8 / rate
label = "rendezvous (UCX default)" if "RNDV" in name else "eager (pipert default)"
median = statistics.median(waits)
print(f"{label:<26} {median:12.0f} {limit_ms:12.0f} {100 * limit_ms / median:11.0f}%   runs: {', '.join(f'{w:.0f}' for w in waits)}")
PY
done
