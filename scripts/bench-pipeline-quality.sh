#!/usr/bin/env bash
# Quality of the asynchronous pipeline against 1F1B with flush, at equal tokens
# (BENCHMARKS.md, "Asynchronous pipeline quality"). S stages x 1 replica on the
# default corpus (fortunes) and the default model (6 layers, 192 wide, 6 heads,
# T=128, byte vocabulary):
#
#   baseline   pipeline.schedule=1f1b, M microbatches of B sequences per step,
#              K steps: K*M*B*T tokens, one optimizer step per M microbatches
#   async      pipeline.schedule=async-1f1b, one optimizer step per microbatch
#              of B sequences, K*M steps: the same tokens, M times more steps,
#              once per lookahead (nesterov, stash, predict, none)
#
# Settings (why: BENCHMARKS.md). Every run: the same peak learning rate LR,
# linear warm-up over the first 10% of the tokens, cosine decay to 0.1*LR,
# clipping at norm 1.0, the same seed, data and validation batches.
#   baseline   AdamW beta=(0.9, 0.95), weight decay 0.1 (the project's defaults)
#   async      the asynchronous recipe's beta2=0.999 and weight decay 0.01;
#              nesterov switches to NAdamW with beta1=0.99 itself, the other
#              lookaheads keep AdamW with beta1=0.9
#
# Prints one table: final validation loss (mean over VAL_BATCHES batches, the
# same batches for every run), its ratio to the baseline, the last training
# loss, tokens, wall time, mean tokens/s (of the logged windows); then per run
# and stage the mean measured staleness and the bubble fraction at the end
# (from DIR/metrics-stage-N.jsonl; with more stages than cores, workers share
# cores, so "bubble" there also holds time spent waiting for a core).
#
# Usage: scripts/bench-pipeline-quality.sh [options]
#   --steps K          flush steps of the baseline (160)
#   --microbatches M   microbatches per flush step (4)
#   --batch B          sequences per microbatch (8)
#   --stages S         pipeline stages (4)
#   --lr LR            peak learning rate of every run (1e-3)
#   --val-batches N    validation batches (32)
#   --lookaheads LIST  async lookaheads to run ("nesterov stash predict none")
#   --out DIR          where the runs go (runs/bench-pipeline-quality)
#   --build DIR        build directory holding tools/pipert (build)
set -euo pipefail
cd "$(dirname "$0")/.."

steps=160
microbatches=4
batch=8
stages=4
lr=1e-3
val_batches=32
lookaheads="nesterov stash predict none"
out=runs/bench-pipeline-quality
build=build
while (($#)); do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --microbatches) microbatches=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --stages) stages=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --val-batches) val_batches=$2; shift 2 ;;
    --lookaheads) lookaheads=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) sed -n '/^# Usage/,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done

pipert=$build/tools/pipert
[[ -x $pipert ]] || { echo "$pipert: not built (meson setup $build && ninja -C $build)" >&2; exit 1; }
T=128
async_steps=$((steps * microbatches))
tokens=$((steps * microbatches * batch * T))
warmup=$(((steps + 9) / 10))
async_warmup=$((warmup * microbatches))

common=(--stages "$stages" --replicas 1 --quiet
        --model.n_layer=6 --model.n_embd=192 --model.n_head=6 --model.block_size=$T
        --train.batch_size="$batch" --train.lr="$lr" --train.min_lr_ratio=0.1 --train.grad_clip=1.0
        --train.val_every=0 --train.val_batches="$val_batches" --train.checkpoint_every=0
        --train.keep_checkpoints=1 --pipeline.trace=true --seed=1337)

names=() seconds=()
run() { # NAME ARGS...: one launch into $out/NAME, its wall time in seconds
  local name=$1
  shift
  rm -rf "${out:?}/$name"
  echo "== $name: $pipert launch ${common[*]} $* --out $out/$name" >&2
  local start end rc=0
  start=$(date +%s.%N)
  "$pipert" launch "${common[@]}" "$@" --out "$out/$name" >&2 || rc=$?
  end=$(date +%s.%N)
  names+=("$name")
  if ((rc)); then
    echo "== $name FAILED (exit $rc); last log lines:" >&2
    tail -n 5 "$out/$name"/logs/*.log >&2 || true
    seconds+=(failed)
  else
    seconds+=("$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.0f", b - a }')")
  fi
}

mkdir -p "$out"
run 1f1b-flush --pipeline.schedule=1f1b --pipeline.microbatches="$microbatches" \
  --train.steps="$steps" --train.warmup_steps="$warmup" --train.log_every=5 \
  --train.optimizer=adamw --train.beta1=0.9 --train.beta2=0.95 --train.weight_decay=0.1
for lookahead in $lookaheads; do
  run "async-$lookahead" --pipeline.schedule=async-1f1b --pipeline.lookahead="$lookahead" \
    --train.steps="$async_steps" --train.warmup_steps="$async_warmup" --train.log_every=20 \
    --train.optimizer=adamw --train.beta1=0.9 --train.beta2=0.999 --train.weight_decay=0.01
done

# The value of KEY in flat JSON lines on stdin (sed, so no jq needed).
value_of() { sed -n "s/.*\"$1\":\([-0-9.eE+naif]*\).*/\1/p"; }

echo
echo "$stages stages x 1 replica, default model and corpus, B=$batch T=$T, lr=$lr, val over $val_batches batches;"
echo "baseline 1f1b: $steps steps x $microbatches microbatches; async-1f1b: $async_steps steps; $tokens tokens each"
echo
printf '%-16s %9s %9s %10s %10s %8s %10s\n' run val_loss "vs 1f1b" train_loss tokens wall_s "tokens/s"
base=""
for i in "${!names[@]}"; do
  name=${names[$i]} dir=$out/${names[$i]}
  val=$(grep '"val_loss"' "$dir/metrics.jsonl" 2>/dev/null | tail -n 1 | value_of val_loss)
  train=$(grep '"loss"' "$dir/metrics.jsonl" 2>/dev/null | tail -n 1 | value_of loss)
  tps=$(grep '"tokens_per_s"' "$dir/metrics.jsonl" 2>/dev/null | value_of tokens_per_s |
        awk '{ s += $1; n++ } END { if (n) printf "%.0f", s / n; else print "-" }')
  [[ $name == 1f1b-flush && -n $val ]] && base=$val
  ratio=$(awk -v v="${val:-nan}" -v b="${base:-nan}" \
          'BEGIN { if (v == "nan" || b == "nan") print "-"; else printf "%.4f", v / b }')
  printf '%-16s %9s %9s %10s %10s %8s %10s\n' "$name" "${val:--}" "$ratio" "${train:--}" "$tokens" \
         "${seconds[$i]}" "$tps"
done

echo
echo "per stage: mean measured staleness / bubble fraction at the end of the run"
header=$(for ((s = 0; s < stages; s++)); do printf ' %15s' "stage $s"; done)
printf '%-16s%s\n' run "$header"
for name in "${names[@]}"; do
  line=$(for ((s = 0; s < stages; s++)); do
    f=$out/$name/metrics-stage-$s.jsonl
    st=$(value_of staleness <"$f" 2>/dev/null | awk '{ s += $1; n++ } END { if (n) printf "%.2f", s / n; else print "-" }')
    bu=$(value_of bubble <"$f" 2>/dev/null | tail -n 1 | awk '{ printf "%.2f", $1 }')
    printf ' %15s' "${st:--} / ${bu:--}"
  done)
  printf '%-16s%s\n' "$name" "$line"
done
