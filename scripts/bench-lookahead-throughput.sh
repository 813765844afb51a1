#!/usr/bin/env bash
# Paired throughput of two look-aheads of the asynchronous pipeline: the default
# model on a 2-stage async-1F1B pipeline (one worker per core), ROUNDS rounds in
# ABBA order (odd rounds A then B, even rounds B then A, so drift favours neither).
# Prints each round's steady tokens/s (median of the logged windows after the
# first) and their ratio B/A, then the mean of each and the median ratio.
# Usage: scripts/bench-lookahead-throughput.sh [A] [B] [ROUNDS] [pipert options...]
#   defaults: A = nesterov, B = nesterov-dc, ROUNDS = 8; PIPERT=path/to/pipert (./build/tools/pipert)
#   KEY=section.key compares two values of another setting (default pipeline.lookahead) and
#   STAGES=S another depth (default 2), e.g. two splits of 4 stages:
#   KEY=plan.layers STAGES=4 scripts/bench-lookahead-throughput.sh 2,2,1,1 1,2,2,1 8
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/metrics.sh
a=${1:-nesterov} b=${2:-nesterov-dc} rounds=${3:-8}
shift $(($# < 3 ? $# : 3))
pipert=${PIPERT:-./build/tools/pipert} key=${KEY:-pipeline.lookahead} stages=${STAGES:-2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--train.steps=160 --train.log_every=20 --train.val_every=0 --train.val_batches=1
        --train.warmup_steps=10 "$@")

run() {
  rm -rf "$work/$1"
  "$pipert" launch --quiet --stages "$stages" --replicas 1 --out "$work/$1" \
    --pipeline.schedule=async-1f1b --pipeline.trace=false --"$key"="$1" "${common[@]}" 2>/dev/null
  steady_tokens_per_s "$work/$1/metrics.jsonl"
}
for ((i = 1; i <= rounds; i++)); do
  if ((i % 2)); then ta=$(run "$a"); tb=$(run "$b"); else tb=$(run "$b"); ta=$(run "$a"); fi
  echo "round $i: $a $ta tokens/s | $b $tb tokens/s | ratio $(awk -v x="$ta" -v y="$tb" 'BEGIN { printf "%.4f", y / x }')"
done | tee "$work/rounds"
median_ratio=$(awk '{ print $NF }' "$work/rounds" | median_of_lines)
awk -v a="$a" -v b="$b" -v m="$median_ratio" '{ sa += $4; sb += $8 }
  END { printf "%d rounds: mean %s %.0f tokens/s, %s %.0f tokens/s, ratio of means %.3f, median ratio %.3f\n",
               NR, a, sa / NR, b, sb / NR, sb / sa, m }' "$work/rounds"
