#!/usr/bin/env bash
# Scale of the solver (placement issue): `pipert plan --cluster big.json --spanning
# --dp.method=sparse` for 8 sites of 128 A100 (1,024 devices), 1 Gbit/s and 30 ms between
# every pair of sites. Times each build given (medians of --reps runs, builds interleaved)
# and checks that they all write the same plan file.
#
# Usage: scripts/bench-plan-scale.sh [--reps N] [--sites N] [--per-site N] BUILD_DIR...
set -euo pipefail
reps=3 sites=8 per_site=128
while (($#)); do
  case "$1" in
    --reps) reps=$2; shift 2 ;;
    --sites) sites=$2; shift 2 ;;
    --per-site) per_site=$2; shift 2 ;;
    -*) echo "usage: $0 [--reps N] [--sites N] [--per-site N] BUILD_DIR..." >&2; exit 2 ;;
    *) break ;;
  esac
done
(($#)) || { echo "usage: $0 [--reps N] [--sites N] [--per-site N] BUILD_DIR..." >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
python3 - "$out/big.json" "$sites" "$per_site" <<'PY'
import json, sys
path, n, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
group = {"name": "a100", "kind": "cuda", "count": per, "fp32_flops": 1.95e13, "bf16_flops": 3.12e14,
         "memory": "40gb", "memory_bytes_per_s": 1.555e12,
         "link": {"bandwidth": "100gbit", "latency": "10us"}}
sites = [{"name": f"site{i}", "groups": [group]} for i in range(n)]
json.dump({"description": f"{n} sites of {per} A100, 1 Gbit/s and 30 ms between every pair",
           "sites": sites, "default_link": {"bandwidth": "1gbit", "latency": "30ms"}},
          open(path, "w"), indent=1)
PY
for rep in $(seq "$reps"); do
  for b in "$@"; do
    tag=$(echo "$b" | tr / _)
    start=$(date +%s.%N)
    "$b/tools/pipert" plan --cluster "$out/big.json" --spanning --dp.method=sparse \
      --out "$out/plan-$tag.json" > "$out/stdout-$tag" 2>&1
    end=$(date +%s.%N)
    echo "$b $(python3 -c "print(f'{$end - $start:.2f}')")" >> "$out/times"
  done
done
python3 - "$out/times" <<'PY'
import collections, statistics, sys
t = collections.defaultdict(list)
for line in open(sys.argv[1]):
    b, s = line.split()
    t[b].append(float(s))
for b, s in t.items():
    print(f"{b:<40} median {statistics.median(s):7.2f} s   runs {', '.join(f'{x:.2f}' for x in s)}")
PY
first=""
for f in "$out"/plan-*.json; do
  if [ -z "$first" ]; then first=$f; continue; fi
  if cmp -s "$first" "$f"; then echo "same plan: $(basename "$first") = $(basename "$f")"
  else echo "DIFFERENT plans: $(basename "$first") and $(basename "$f")"; diff "$first" "$f" | head -20; fi
done
[ -n "${KEEP_PLAN:-}" ] && cp "$first" "$KEEP_PLAN"
exit 0
