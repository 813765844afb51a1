#!/usr/bin/env bash
# Throughput of the asynchronous pipeline against one worker: the default
# model trained by (a) one worker on one core and (b) a 2-stage async-1F1B
# pipeline, one worker per core. Runs the pair RUNS times (default 3),
# interleaved, and prints the median tokens/s of each and their ratio.
# Usage: scripts/bench-pipeline-throughput.sh [RUNS] [pipert options...]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/metrics.sh
runs=${1:-3}
shift || true
pipert=${PIPERT:-./build/tools/pipert}  # PIPERT=path/to/pipert for another build
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--train.steps=120 --train.log_every=20 --train.val_every=0 --train.val_batches=1
        --train.warmup_steps=10 "$@")

single=() pipeline=()
for ((i = 0; i < runs; i++)); do
  rm -rf "$work/a" "$work/b"
  taskset -c 0 "$pipert" train --quiet --out "$work/a" --runtime.threads=1 "${common[@]}" 2>/dev/null
  "$pipert" launch --quiet --stages 2 --replicas 1 --out "$work/b" \
    --pipeline.schedule=async-1f1b --pipeline.trace=false "${common[@]}" 2>/dev/null
  a=$(steady_tokens_per_s "$work/a/metrics.jsonl")
  b=$(steady_tokens_per_s "$work/b/metrics.jsonl")
  echo "run $((i + 1)): one worker on one core $a tokens/s | 2-stage async pipeline on 2 cores $b tokens/s"
  single+=("$a") pipeline+=("$b")
done
median() { printf '%s\n' "$@" | median_of_lines; }
ms=$(median "${single[@]}") mp=$(median "${pipeline[@]}")
awk -v s="$ms" -v p="$mp" -v n="$runs" 'BEGIN { printf "median of %d runs: one worker %.0f tokens/s, 2-stage pipeline %.0f tokens/s, ratio %.2f\n", n, s, p, p / s }'
