#!/usr/bin/env bash
# Prints "FLOPS EFFICIENCY" for the simulator from `pipert bench` (one compute
# thread given in the arguments): this machine's fp32 GEMM peak in FLOP/s and
# the share of it a training step reaches. Used by bench-simulate.sh and
# bench-slow-site.sh. Usage: scripts/calibrate.sh PIPERT [bench arguments...]
set -euo pipefail
pipert=$1
shift
"$pipert" bench "$@" 2>/dev/null | python3 -c '
import re, sys
text = sys.stdin.read()
peak = float(re.search(r"GEMM peak .*: ([0-9.]+) GFLOP/s", text)[1])
share = float(re.search(r"([0-9.]+)% of peak", text)[1])
print(peak * 1e9, round(share / 100, 4))'
