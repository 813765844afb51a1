#!/usr/bin/env bash
# The staleness study (issue 10): for each stage count S and corpus, the asynchronous
# pipeline's look-aheads against the same optimizer taking the same steps without any delay
# (one worker, no pipeline: "delay-free") and against 1F1B with flush, at equal tokens.
#
#   delay-free-adamw   1 stage, K*M steps of B sequences, AdamW (0.9, 0.999), decay 0.01
#   delay-free-nadamw  the same with NAdamW, beta1 = 0.99 (the optimizer of `nesterov`)
#   1f1b-flush         S stages, K steps of M microbatches, AdamW (0.9, 0.95), decay 0.1
#   async-none, async-stash, async-predict   AdamW as delay-free-adamw, S stages, K*M steps
#   async-nesterov     stash + NAdamW beta1 = 0.99 (ALGORITHMS.md §3), as delay-free-nadamw
#   async-nesterov-dc  the same with DC-ASGD's delay compensation (lambda = 100, the default)
#   async-nesterov-secant  the same with a measured secant as the compensation's curvature
#   async-predict-nadamw  weight prediction with NAdamW beta1 = 0.99: Nesterov momentum and an
#                      explicit prediction of the S-1-s steps ahead together
#   async-predict-damped  prediction damped by min(1, t/K) in warm-up and bounded per tensor by
#                      tau x the measured update RMS (docs/STALENESS.md)
#   async-pipemare     stash + PipeMare's per-stage step size gamma * tau^-(1 - min(1, t/K))
#   async-dc-asgd      stash + DC-ASGD delay compensation, lambda = 2
#   async-L-nadamw     look-ahead L with NAdamW beta1 = 0.99 (L: predict, predict-damped,
#                      pipemare, dc-asgd)
#   RUN-syncN          any async run with its first N steps synchronous (pipeline.sync_steps=N:
#                      one microbatch at a time through every stage, no staleness; PipeMare's
#                      synchronous warm-up), e.g. async-nesterov-sync64
#   RUN+KEY=VALUE      any run with one more setting, e.g. async-dc-asgd-nadamw+pipeline.dc_lambda=50
#
# Every run: the same peak learning rate, linear warm-up over the first 10% of the tokens,
# cosine decay to 0.1 of it, clipping at norm 1, the same seed, data and validation batches.
# Training is deterministic, so the losses do not depend on the machine's load (wall times
# do). Prints per (S, corpus): final validation loss, its gap to the delay-free run of the
# same optimizer and to 1F1B with flush, and the largest ratio of a run's training loss to
# its delay-free run's at the same logged step (a spike); draws loss curves with `pipert
# plot` into OUT/S-CORPUS/pics/.
#
# Usage: scripts/bench-staleness.sh [options]
#   --stages "S ..."     stage counts (default "4 8"); S = 8 uses an 8-block model, 128 wide
#   --corpora "NAME=PATH ..."  default: fortunes (the built-in corpus) and
#                        licenses=/usr/share/common-licenses (every Debian's license texts)
#   --steps K            flush steps (160); async and delay-free take K*M steps
#   --microbatches M     (4)   --batch B (8)   --lr LR (1e-3)   --val-batches N (32)
#   --runs "NAME ..."    a subset of the runs above
#   --out DIR            (runs/bench-staleness)   --build DIR (build)
#   --seed N             (1337) model initialisation and batches of every run
#   --reuse              keep a run whose output already ends with a val_loss (a study
#                        continued, or the table printed again)
set -euo pipefail
cd "$(dirname "$0")/.."

stages_list="4 8" corpora="fortunes= licenses=/usr/share/common-licenses"
steps=160 microbatches=4 batch=8 lr=1e-3 val_batches=32 out=runs/bench-staleness build=build
all_runs="delay-free-adamw delay-free-nadamw 1f1b-flush async-none async-stash async-nesterov
          async-predict async-predict-nadamw async-predict-damped async-pipemare async-dc-asgd
          async-predict-damped-nadamw async-pipemare-nadamw async-dc-asgd-nadamw"
runs=$all_runs reuse=0 seed=1337
while (($#)); do
  case "$1" in
    --stages) stages_list=$2; shift 2 ;;
    --corpora) corpora=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --microbatches) microbatches=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --val-batches) val_batches=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --reuse) reuse=1; shift ;;
    --seed) seed=$2; shift 2 ;;
    *) sed -n '/^# Usage/,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
pipert=$build/tools/pipert
[[ -x $pipert ]] || { echo "$pipert: not built" >&2; exit 1; }
T=128
async_steps=$((steps * microbatches))
warmup=$(((steps + 9) / 10))
async_warmup=$((warmup * microbatches))
adamw_async=(--train.optimizer=adamw --train.beta1=0.9 --train.beta2=0.999 --train.weight_decay=0.01)
nadamw=(--train.optimizer=nadamw --train.beta1=0.99 --train.beta2=0.999 --train.weight_decay=0.01)
long=(--train.steps="$async_steps" --train.warmup_steps="$async_warmup" --train.log_every=20)

# The arguments of run NAME for S stages.
run_args() {
  local name=$1 S=$2
  if [[ $name =~ ^([^+]*)\+([a-z0-9_.]+)=([^+]+)(.*)$ ]]; then
    echo "$(run_args "${BASH_REMATCH[1]}${BASH_REMATCH[4]}" "$S") --${BASH_REMATCH[2]}=${BASH_REMATCH[3]}"
    return
  fi
  if [[ $name =~ ^(.*)-sync([0-9]+)$ ]]; then
    echo "$(run_args "${BASH_REMATCH[1]}" "$S") --pipeline.sync_steps=${BASH_REMATCH[2]}"
    return
  fi
  case $name in
    delay-free-adamw) echo --stages 1 "${long[@]}" "${adamw_async[@]}" ;;
    delay-free-nadamw) echo --stages 1 "${long[@]}" "${nadamw[@]}" ;;
    1f1b-flush) echo --stages "$S" --pipeline.schedule=1f1b --pipeline.microbatches="$microbatches" \
      --train.steps="$steps" --train.warmup_steps="$warmup" --train.log_every=5 \
      --train.optimizer=adamw --train.beta1=0.9 --train.beta2=0.95 --train.weight_decay=0.1 ;;
    async-nesterov | async-nesterov-dc | async-nesterov-secant) echo --stages "$S" --pipeline.schedule=async-1f1b \
      --pipeline.lookahead="${name#async-}" "${long[@]}" "${nadamw[@]}" ;;
    async-*-nadamw) local lookahead=${name#async-}
      echo --stages "$S" --pipeline.schedule=async-1f1b --pipeline.lookahead="${lookahead%-nadamw}" \
      "${long[@]}" "${nadamw[@]}" ;;
    async-*) echo --stages "$S" --pipeline.schedule=async-1f1b --pipeline.lookahead="${name#async-}" \
      "${long[@]}" "${adamw_async[@]}" ;;
    *) echo "unknown run $name" >&2; exit 2 ;;
  esac
}

# Which delay-free run a run is measured against.
reference_of() {
  case ${1%-sync*} in
    async-nesterov | async-nesterov-dc | async-nesterov-secant | *-nadamw) echo delay-free-nadamw ;;
    *) echo delay-free-adamw ;;
  esac
}

for S in $stages_list; do
  if ((S > 6)); then model=(--model.n_layer="$S" --model.n_embd=128 --model.n_head=4)
  else model=(--model.n_layer=6 --model.n_embd=192 --model.n_head=6); fi
  for corpus in $corpora; do
    cname=${corpus%%=*} cpath=${corpus#*=}
    dir=$out/$S-$cname
    mkdir -p "$dir"
    for name in $runs; do
      args_text=$(run_args "$name" "$S") || continue # run_args named what it did not know
      read -r -a args <<< "$args_text"
      if ((reuse)) && grep -q val_loss "$dir/$name/metrics.jsonl" 2>/dev/null; then
        echo "== $S stages, $cname, $name: kept" >&2
        continue
      fi
      rm -rf "${dir:?}/$name"
      echo "== $S stages, $cname, $name" >&2
      start=$(date +%s)
      "$pipert" launch --quiet --replicas 1 "${model[@]}" --model.block_size=$T \
        --train.batch_size="$batch" --train.lr="$lr" --train.min_lr_ratio=0.1 --train.grad_clip=1.0 \
        --train.val_every=0 --train.val_batches="$val_batches" --train.checkpoint_every=0 \
        --train.keep_checkpoints=1 --seed="$seed" --data.path="$cpath" "${args[@]}" \
        --out "$dir/$name" >&2 || echo "== $name FAILED" >&2
      echo $(($(date +%s) - start)) > "$dir/$name/wall_s" 2>/dev/null || true
    done
    "$pipert" plot --out "$dir/pics" $(for n in $runs; do [ -d "$dir/$n" ] && echo "$dir/$n"; done) \
      > /dev/null 2>&1 || echo "(pipert plot failed for $dir)" >&2
    python3 - "$dir" "$S" "$cname" $runs <<'PY'
import json, os, re, sys
d, S, corpus, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
def lines(name):
    path = f"{d}/{name}/metrics.jsonl"
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []
def val(name):
    v = [l["val_loss"] for l in lines(name) if "val_loss" in l]
    return v[-1] if v else None
def train(name):  # loss by tokens, so runs of different step sizes line up
    return {l["tokens"]: l["loss"] for l in lines(name) if "loss" in l and "tokens" in l}
def ref(name):
    name = re.sub(r"-sync[0-9]+$", "", re.sub(r"\+.*", "", name))
    return "delay-free-nadamw" if name in ("async-nesterov", "async-nesterov-dc", "async-nesterov-secant") or name.endswith("-nadamw") \
        else "delay-free-adamw"
print(f"\n{S} stages, corpus {corpus}")
print(f"{'run':<28} {'val_loss':>9} {'vs delay-free':>14} {'vs 1f1b':>8} {'max loss ratio':>15} {'wall s':>7}")
flush = val("1f1b-flush")
for n in names:
    v = val(n)
    if v is None:
        print(f"{n:<28} {'-':>9}")
        continue
    r = val(ref(n))
    mine, theirs = train(n), train(ref(n))
    ratios = [mine[t] / theirs[t] for t in mine if t in theirs and theirs[t] > 0]
    wall = open(f"{d}/{n}/wall_s").read().strip() if os.path.exists(f"{d}/{n}/wall_s") else "-"
    gap = f"{100 * (v / r - 1):+.2f}%" if r else "-"
    vs_flush = f"{100 * (v / flush - 1):+.2f}%" if flush else "-"
    spike = f"{max(ratios):.3f}" if ratios and not n.startswith("delay-free") else "-"
    print(f"{n:<28} {v:9.4f} {gap:>14} {vs_flush:>8} {spike:>15} {wall:>7}")
PY
  done
done
