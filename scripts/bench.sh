#!/usr/bin/env bash
# Runs `pipert bench` several times (default 5) and prints each run's summary
# line and the medians of ms/step and % of peak. Each run measures the GEMM
# peak itself, so every percentage is a ratio taken within one run.
# Usage: scripts/bench.sh [RUNS] [pipert bench options...]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
shift || true
lines=()
for ((i = 0; i < runs; i++)); do
  line=$(./build/tools/pipert bench "$@" | grep '^step:')
  echo "$line"
  lines+=("$line")
done
printf '%s\n' "${lines[@]}" | awk '
  { for (i = 1; i <= NF; i++) { if ($i == "ms") ms[NR] = $(i-1); if ($i == "of" && $(i+1) == "peak") pct[NR] = $(i-1) } }
  function median(a, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
                                      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
  END { gsub("%", "", pct[1]); for (i = 1; i <= NR; i++) { sub("%", "", pct[i]); p[i] = pct[i] + 0; m[i] = ms[i] + 0 }
        printf "median of %d runs: %.2f ms/step, %.1f%% of the fp32 GEMM peak\n", NR, median(m, NR), median(p, NR) }'
