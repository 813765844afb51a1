#!/usr/bin/env bash
# pipert's training step against PyTorch's (and llm.c's, when given) on one GPU, in one call, so
# that the ratios in BENCHMARKS.md are measured side by side (issue 27).
#
#   scripts/bench-gpu-compare.sh [BUILD]       BUILD: a folder with tests/bench_cuda (default
#                                              build-gpu-carry, from `scripts/gpu-check.sh prepare`;
#                                              LD_LIBRARY_PATH as gpu-check.sh run sets it)
#   SHAPE="--batch 16 --seq 1024 ..."          the shape (default GPT-2 124M at B = 16, T = 1024)
#   MODES=fp32,tf32,bf16,bf16-compile          PyTorch's modes (scripts/bench-torch-gpt2.py)
#   LLMC_CMD="..."                             optional: a command that trains llm.c on the same
#                                              shape; its median "N tok/s" is reported
#
# Prints each system's tokens/s over its median timed step, the ratio to pipert's exact fp32
# step, and the peak device memory where the system reports it (pipert bf16 four times: as it
# runs by default, with attention on CUDA cores, with cuDNN's fused attention
# (PIPERT_CUDA_CUDNN_ATTENTION=1), and with the products' epilogues as kernels of ours,
# PIPERT_CUDA_LT=0), then pipert bf16's step kernel by kernel; the
# raw outputs go to $OUT (or a temporary folder).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu-carry}
[ -d "$build/lib" ] && scripts/unpack-carry.sh "$build"
shape=${SHAPE:---batch 16 --seq 1024 --layers 12 --width 768 --heads 12 --vocab 50257}
modes=${MODES:-fp32,tf32,bf16,bf16-compile}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
python=${PYTHON:-python3}

# bench_cuda's "median step X ms, Y tokens/s" line, and its "peak device memory X GB" one
pipert_rate() { sed -n 's/^median step [0-9.]* ms, \([0-9]*\) tokens\/s.*/\1/p' "$1" | tail -n 1; }
pipert_memory() { sed -n 's/^peak device memory \([0-9.]*\) GB.*/\1 GB/p' "$1" | tail -n 1; }

rows=()
# name|environment|bench_cuda's flag|log: the three precisions, each beside itself without one
# of its speed-ups (fp32: attention on CUDA cores rather than cuBLAS, attention_gemm.cu; bf16:
# attention on CUDA cores rather than tensor cores, attention_mma.cuh, and the products'
# epilogues as kernels of ours after cuBLAS, matmul.cu), so that each one's share is measured
# in the same call; and bf16 with cuDNN's attention instead of ours (attention_cudnn.cu)
variants=(
  "pipert fp32|||pipert"
  "pipert fp32, attention on CUDA cores|PIPERT_CUDA_GEMM_ATTENTION=0||pipert-fp32-simt"
  "pipert tf32||--tf32|pipert-tf32"
  "pipert bf16||--bf16|pipert-bf16"
  "pipert bf16, CUDA-core attention|PIPERT_CUDA_MMA_ATTENTION=0|--bf16|pipert-bf16-simt"
  "pipert bf16, cuDNN attention|PIPERT_CUDA_CUDNN_ATTENTION=1|--bf16|pipert-bf16-cudnn"
  "pipert bf16, epilogues as kernels|PIPERT_CUDA_LT=0|--bf16|pipert-bf16-no-lt"
)
for variant in "${variants[@]}"; do
  IFS='|' read -r name environment flag logname <<<"$variant"
  log="$out/$logname.log"
  # shellcheck disable=SC2086
  if env $environment "$build/tests/bench_cuda" $shape --steps 10 $flag >"$log" 2>&1; then
    rows+=("$name|$(pipert_rate "$log")|$(pipert_memory "$log")")
  else
    rows+=("$name|failed (see $log)|")
  fi
done
# where a bf16 step's time goes, kernel by kernel (synchronised one by one), printed after the table
# shellcheck disable=SC2086
"$build/tests/bench_cuda" $shape --steps 4 --bf16 --profile >"$out/pipert-bf16-profile.log" 2>&1 || true

# shellcheck disable=SC2086
if "$python" scripts/bench-torch-gpt2.py $shape --modes "$modes" >"$out/torch.jsonl" 2>"$out/torch.err"; then
  while IFS= read -r line; do
    rows+=("$("$python" -c 'import json, sys
r = json.loads(sys.argv[1])
name = "PyTorch " + r.get("torch", "") + " " + r["mode"]
if "skipped" in r:
    print(name + "|skipped: " + r["skipped"] + "|")
else:
    memory = "%.1f GB" % r["peak_memory_gb"] if "peak_memory_gb" in r else ""
    print("%s|%.0f|%s" % (name, r["tokens_per_s"], memory))' "$line")")
  done <"$out/torch.jsonl"
else
  rows+=("PyTorch|failed (see $out/torch.err)|")
fi

if [ -n "${LLMC_CMD:-}" ]; then
  if bash -c "$LLMC_CMD" >"$out/llmc.log" 2>&1; then
    rate=$("$python" -c 'import re, statistics, sys
rates = [float(m) for m in re.findall(r"([0-9]+) tok/s", open(sys.argv[1]).read())]
print(f"{statistics.median(rates[3:] or rates):.0f}" if rates else "no tok/s in its output")' "$out/llmc.log")
    rows+=("llm.c|$rate|")
  else
    rows+=("llm.c|failed (see $out/llmc.log)|")
  fi
fi

reference=$(pipert_rate "$out/pipert.log")
device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || echo "?")
echo "$device, $(date -u +%Y-%m-%d), shape: $shape"
printf '%-34s %12s %10s %12s\n' system tokens/s "vs fp32" "peak memory"
for row in "${rows[@]}"; do
  IFS='|' read -r name rate memory <<<"$row"
  ratio=""
  if [[ "$rate" =~ ^[0-9]+$ && "$reference" =~ ^[0-9]+$ && "$reference" -gt 0 ]]; then
    ratio=$(awk -v a="$rate" -v b="$reference" 'BEGIN { printf "%.1fx", a / b }')
  fi
  printf '%-34s %12s %10s %12s\n' "$name" "$rate" "$ratio" "$memory"
done
echo "raw outputs: $out"
echo "pipert bf16, per kernel (bench_cuda --bf16 --profile):"
sed -n '/^kernel  *calls/,/^product /p' "$out/pipert-bf16-profile.log" | grep -v '^product ' | head -n 24
echo "pipert bf16, the products by shape (is the classifier's, N x 768 -> 50257, at the blocks' rate?):"
sed -n '/^product /,$p' "$out/pipert-bf16-profile.log" | head -n 24
