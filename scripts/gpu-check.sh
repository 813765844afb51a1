#!/usr/bin/env bash
# The prepared GPU check of multi-worker jobs (docs/CUDA.md, "Between workers"):
# one call on a GPU machine, under 8 minutes, that prints a short table.
#
#   scripts/gpu-check.sh prepare   # here, on the CPU machine: a portable CUDA build, the
#                                  # host libraries and UCX modules it needs, the corpus, and
#                                  # every case's CPU reference run, all in build-gpu-carry/
#   scripts/gpu-check.sh run       # on the GPU machine (device tool: carry ["build-gpu-carry"])
#   DEVICE=cpu-guarded scripts/gpu-check.sh run   # a dry run of the script on the CPU machine
#                                  # (the cases must then match their references exactly)
#
# Each case runs the default model for STEPS steps on runtime.device=cuda and compares its
# per-step training loss and its final validation loss with the same run on the CPU backend,
# computed beforehand by `prepare` with the same binary and data. Tolerances (relative, worst
# step): the GPU and the CPU sum in other orders (cuBLAS's GEMM tiles against OpenBLAS's, the
# kernels' fixed-order reductions against OpenMP's), about 1e-6 relative per reduction in fp32;
# over 20 steps of Adam that grows to ~1e-5 in the loss. Flush schedules and dense averaging
# (the same mathematical step as the CPU's) must stay within 1e-4; the asynchronous pipeline and
# sparse averaging feed the difference back through stale weights and a 4-bit codec, whose
# rounding of a value near a step of its grid flips with a 1e-6 change: within 1e-3. bf16
# products (runtime.precision=bf16) against the CPU's emulation of them: the operands are
# rounded alike, but from inputs that differ in their last fp32 bits, so some round to the
# neighbouring bf16 (2^-8 of the value) on one side only: within 3e-3, with attention on CUDA
# cores (exact on the rounded q, k, v, as the CPU's emulation). On tensor cores (the default
# for head sizes 32, 64, 128, the default model's 32 included) attention also rounds P, dO and
# dS to bf16, which the CPU does not: its gradient differs by ~2.7e-3 normwise
# (test_attention_mma), every step, fed back through 20 steps of Adam: within 1e-2, where a
# wrong kernel is off by far more (the loss would not fall as the CPU's does).
set -euo pipefail
cd "$(dirname "$0")/.."
carry=build-gpu-carry
DEVICE=${DEVICE:-cuda}
STEPS=20
MODEL="--train.steps=$STEPS --train.log_every=1 --train.val_every=0 --train.val_batches=4 --pipeline.trace=false"

# name | launch arguments | tolerance | environment (optional)
CASES=(
  "stages2-async|--stages 2|1e-3"
  "stages4-async|--stages 4|1e-3"
  "stages4-1f1b|--stages 4 --pipeline.schedule=1f1b|1e-4"
  "replicas2-allreduce|--replicas 2|1e-4"
  "stages2-replicas2-sparse-e3m0|--stages 2 --replicas 2 --dp.method=sparse --dp.compress=e3m0 --dp.delay=2|1e-3"
  "stages2-replicas2-diloco|--stages 2 --replicas 2 --dp.method=diloco --dp.period=5|1e-3"
  "stages3-predict|--stages 3 --pipeline.lookahead=predict|1e-3"
  "stages2-replicas2-streaming-int8|--stages 2 --replicas 2 --dp.method=streaming-diloco --dp.period=5 --dp.compress=int8|1e-3"
  "replicas2-co2-e2m1|--replicas 2 --dp.method=co2 --dp.period=5 --dp.compress=e2m1|1e-3"
  "replicas2-sparse-onebit|--replicas 2 --dp.method=sparse --dp.compress=onebit --dp.delay=2|1e-3"
  "stages2-replicas2-bf16|--stages 2 --replicas 2 --runtime.precision=bf16|3e-3|PIPERT_CUDA_MMA_ATTENTION=0"
  "stages2-replicas2-bf16-tensorcore|--stages 2 --replicas 2 --runtime.precision=bf16|1e-2"
  "replicas4-sites2-sparse|--replicas 4 --sites 2 --dp.method=sparse --dp.delay=2|1e-3"
)

prepare() {
  scripts/deps.sh
  # -Dnative=false: the device's CPU may lack this one's instructions
  scripts/build.sh build-gpu -Dnative=false -Dcuda=enabled -Dbuildtype=release
  rm -rf "$carry"
  mkdir -p "$carry"/{tools,tests,lib,ucx,ref}
  cp build-gpu/tools/pipert "$carry/tools/"
  cp build-gpu/tests/test_cuda build-gpu/tests/test_cuda_bf16 build-gpu/tests/bench_cuda "$carry/tests/"
  cp build-gpu/tests/test_cudnn_attention "$carry/tests/" # the GPU's own cuDNN description
  strip "$carry/tools/pipert" "$carry/tests/"*
  # host libraries a CUDA image lacks; glibc, libstdc++ and CUDA's stay the device's own
  ldd "$carry/tools/pipert" "$carry/tests/test_cuda" | awk '/=> \// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|libresolv|libz|libcrypto|libffi|libudev|libcom_err|libkeyutils|libkrb5|libkrb5support|libk5crypto|libgssapi_krb5|libpcre2-8)\.so|/usr/local/cuda|libpipert|libcu|libnccl' |
    xargs -I{} cp -L {} "$carry/lib/"
  # the large ones packed (OpenBLAS 36 MB → 4 MB), unpacked there by scripts/unpack-carry.sh
  find "$carry/lib" -type f -size +8M -exec xz -9 -T2 {} +
  cp -L /usr/lib/x86_64-linux-gnu/ucx/*.so.0 "$carry/ucx/"
  cp -r /usr/share/games/fortunes "$carry/corpus"
  for c in "${CASES[@]}"; do
    IFS='|' read -r name args _ <<<"$c"
    echo "reference: $name"
    # shellcheck disable=SC2086
    "$carry/tools/pipert" launch --quiet $args $MODEL --data.path="$carry/corpus" \
      --runtime.device=cpu --out "$carry/ref/$name.run" >/dev/null
    cp "$carry/ref/$name.run/metrics.jsonl" "$carry/ref/$name.jsonl"
    rm -rf "$carry/ref/$name.run"
  done
  # the binaries packed too, now that the references ran them (11 MB each → ~3 MB)
  find "$carry/tools" "$carry/tests" -type f -size +4M -exec xz -9 -T2 {} +
  du -sh "$carry"
}

# The worst relative difference of the per-step losses and of the final validation loss.
compare() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
def losses(path):
    train, val = {}, None
    for line in open(path):
        o = json.loads(line)
        if "val_loss" in o: val = o["val_loss"]
        elif "loss" in o: train[o["step"]] = o["loss"]
    return train, val
(gt, gv), (rt, rv), tol = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3])
steps = sorted(rt)
worst = max(abs(gt[s] - rt[s]) / abs(rt[s]) for s in steps) if set(steps) <= set(gt) else float("inf")
vdiff = abs(gv - rv) / abs(rv) if gv is not None and rv is not None else float("inf")
ok = worst <= tol and vdiff <= tol
print(f"{len(gt):5d} {worst:10.2e} {vdiff:10.2e} {tol:8.0e}  {'ok' if ok else 'FAIL'}")
PY
}

# From a 2-stage job's trace, what moving tensors between the stages costs a step: the
# staging copies (device to host before a send, host to device after a receive; compute spans
# end when the device finished, so a copy span is the copy) and each transfer, from the start
# of the send to the end of its receive, or from the start of the receive when it began later
# (the wait for the other stage's compute before that is not the transfer's). Medians over the
# steps after the first 4, set against a one-process step of the same model ($2 ms).
transfer_share() {
  python3 - "$1" "$2" <<'PY'
import json, sys, statistics as st
events = json.load(open(sys.argv[1]))
events = events["traceEvents"] if isinstance(events, dict) else events
one_step_ms = float(sys.argv[2].split()[0])
spans = {}
for e in events:
    if e.get("ph") != "X" or e["args"].get("step", 0) < 4: continue
    key = (e["name"].split(" ")[0], e["pid"], e["args"].get("microbatch"))
    spans.setdefault(key, []).append((e["ts"], e["ts"] + e["dur"]))
def med(values): return st.median(values) / 1000 if values else float("nan")
# each rank's copies in a step, summed: staging copies, and in bf16 the rounding before a send
# and the widening after a receive (none: device to device in fp32)
per_step = {}
for e in events:
    if e.get("ph") == "X" and e["name"].split(" ")[0] == "copy" and e["args"].get("step", 0) >= 4:
        key = (e["pid"], e["args"]["step"])
        per_step[key] = per_step.get(key, 0) + e["dur"]
copies = {pid: med([v for (p, _), v in per_step.items() if p == pid] or [0.0]) for pid in (0, 1)}
transfer = {}
for sender, receiver, what in ((0, 1, "activations"), (1, 0, "gradients")):
    lat = []
    for (n, p, mb), v in spans.items():
        if n == "send" and p == sender and ("recv", receiver, mb) in spans:
            (s0, _), (r0, r1) = v[0], spans[("recv", receiver, mb)][0]
            lat.append(r1 - max(s0, r0))
    transfer[what] = med(lat)
# a step moves one microbatch's activations forward and its gradient back
total = copies[0] + copies[1] + transfer["activations"] + transfer["gradients"]
print(f"  copies: rank 0 {copies[0]:.2f} ms, rank 1 {copies[1]:.2f} ms a step (median); transfer: "
      f"activations {transfer['activations']:.2f} ms, gradients {transfer['gradients']:.2f} ms")
print(f"  moving tensors between the stages: {total:.2f} ms a step = {100 * total / one_step_ms:.1f}% "
      f"of a one-process step ({one_step_ms:.1f} ms; target at most 5%)")
PY
}

# Seconds left of the check's budget (BUDGET, default 420), at most $1: each part's timeout, so
# that the whole call ends in time and prints what it did.
left() {
  local rest=$((deadline - SECONDS))
  ((rest < 5)) && rest=1 # (timeout 0 would mean none)
  echo $((rest < $1 ? rest : $1))
}

# A failed job's last words: the launcher's, then each rank's first error and last line.
why() {
  tail -n 2 "$1.err" | tr '\n' ' '
  echo
  for log in "$1"/logs/rank-*.log; do
    [ -f "$log" ] || continue
    echo "    $(basename "$log"): $(grep -m1 -E 'error|fault|SIG|fail' "$log" | cut -c1-200) | $(tail -n 1 "$log" | cut -c1-160)"
  done
}

# The checksum a rank's log gives on the line saying `marker` ("... checksum HEX").
logged_checksum() {
  { grep -h -m1 "$2" "$1" 2>/dev/null || true; } | sed -n 's/.*checksum \([0-9a-f]*\).*/\1/p'
}

run() {
  [ -d "$carry" ] || { echo "no $carry: run 'scripts/gpu-check.sh prepare' on the CPU machine and carry it" >&2; exit 2; }
  scripts/unpack-carry.sh "$carry"
  out=${OUT:-/tmp/gpu-check}
  deadline=$((SECONDS + ${BUDGET:-420}))
  mkdir -p "$out"
  nccl=$(python3 -c 'import nvidia.nccl as n; print(n.__path__[0])' 2>/dev/null || true)
  # cuDNN (PyTorch's wheel): test_cuda_bf16's cuDNN attention test, PIPERT_CUDA_CUDNN_ATTENTION=1
  cudnn=$(python3 -c 'import nvidia.cudnn as n; print(n.__path__[0])' 2>/dev/null || true)
  export LD_LIBRARY_PATH=$PWD/$carry:$PWD/$carry/lib:/usr/local/cuda/lib64${nccl:+:$nccl/lib}${cudnn:+:$cudnn/lib}
  export UCX_MODULE_DIR=$PWD/$carry/ucx PIPERT_LOG=warn
  local pipert=$carry/tools/pipert corpus=$PWD/$carry/corpus
  nvidia-smi -L || true
  if ldd "$pipert" | grep 'not found'; then echo "missing libraries" >&2; exit 2; fi
  jobs=$out/jobs
  mkdir -p "$jobs"
  # every job's logs and metrics (not its checkpoints) come back as one file
  # (a dry run here also packs the carry's libraries again: it is carried next)
  trap 'tar -C "$jobs" --exclude="*.safetensors" -czf "$out/jobs.tar.gz" . 2>/dev/null || true
        [ "$DEVICE" = cuda ] || scripts/unpack-carry.sh --remove "$carry"' EXIT

  if [ "$DEVICE" = cuda ]; then
    # first: the kernels no GPU has run yet (sessions 28-32) are checked before anything uses them
    # (test_cudnn_attention: cuDNN's graphs for the described H100 here too, and this device's own
    # description printed, for tests/test_cudnn_attention.c to keep)
    for binary in test_cuda test_cuda_bf16 test_cudnn_attention; do
      echo "== $binary"
      timeout "$(left 150)" "$carry/tests/$binary" -j1 >"$jobs/$binary.log" 2>&1 && echo "$binary: pass" ||
        { echo "$binary: FAIL"; grep -E "FAIL|CRASH" "$jobs/$binary.log" | head; }
      tail -n 1 "$jobs/$binary.log"
      grep -h -E "normwise error|as cuDNN describes it" "$jobs/$binary.log" | sed 's/^/  /'
    done
    echo "== compute-sanitizer memcheck: the tensor-core attention, the bf16 classifier, cuDNN's attention"
    for filter in 'cuda/bf16_attention_on_tensor_cores*' 'cuda/bf16_logits_and_crossentropy*' \
      'cuda/bf16_attention_through_cudnn*'; do
      log="$jobs/memcheck-${filter//[^a-z0-9_]/}.log"
      timeout "$(left 60)" compute-sanitizer --tool memcheck "$carry/tests/test_cuda_bf16" -j1 \
        --filter "$filter" >"$log" 2>&1 &&
        grep -h "ERROR SUMMARY" "$log" || { echo "memcheck $filter: FAIL"; tail -n 5 "$log"; }
    done
  fi

  echo "== $DEVICE against cpu ($STEPS steps; worst relative difference of a step's loss, of the validation loss)"
  printf '%-34s %5s %10s %10s %8s\n' case steps "train" "val" tol
  for c in "${CASES[@]}"; do
    IFS='|' read -r name args tol environment <<<"$c"
    printf '%-34s ' "$name"
    # shellcheck disable=SC2086
    if env $environment timeout "$(left 90)" "$pipert" launch --quiet $args $MODEL --data.path="$corpus" \
        --runtime.device="$DEVICE" --out "$jobs/$name" >"$jobs/$name.err" 2>&1; then
      compare "$jobs/$name/metrics.jsonl" "$carry/ref/$name.jsonl" "$tol"
    else
      echo "FAIL: $(why "$jobs/$name")"
    fi
  done

  echo "== checkpoint and resume on $DEVICE: 2 stages, $STEPS steps with a checkpoint at 10; resumed from it"
  # (as tests/test_resume.c: a copy of the run without its last checkpoint is a run that died after step 10)
  # shellcheck disable=SC2086
  if timeout "$(left 60)" "$pipert" launch --quiet --stages 2 $MODEL --train.checkpoint_every=10 \
      --data.path="$corpus" --runtime.device="$DEVICE" --out "$jobs/resume-whole" >"$jobs/resume.err" 2>&1 &&
    cp -r "$jobs/resume-whole" "$jobs/resume" && rm "$jobs/resume/ckpt-00000020"* &&
    timeout "$(left 60)" "$pipert" launch --quiet --stages 2 $MODEL --resume \
      --data.path="$corpus" --runtime.device="$DEVICE" --out "$jobs/resume" >>"$jobs/resume.err" 2>&1; then
    printf '%-34s ' "resumed-vs-uninterrupted"
    compare "$jobs/resume/metrics.jsonl" "$jobs/resume-whole/metrics.jsonl" 1e-5
  else
    echo "resume: FAIL: $(why "$jobs/resume")"
  fi

  # (a GPU runs the default model at a few ms a step, and the killed rank's replacement must
  # start, reach the device and take the state before the job ends)
  local elastic_steps=150
  [ "$DEVICE" = cuda ] && elastic_steps=3000
  echo "== elastic on $DEVICE: 2 stages x 2 replicas (allreduce), rank 3 killed at step 15, --restarts 1"
  # shellcheck disable=SC2086
  if PIPERT_LOG=info PIPERT_TEST_DIE_AT_STEP=15 PIPERT_TEST_DIE_RANK=3 timeout "$(left 90)" "$pipert" launch \
      --stages 2 --replicas 2 --min-replicas 1 --restarts 1 $MODEL --train.steps=$elastic_steps --train.log_every=10 \
      --data.path="$corpus" --runtime.device="$DEVICE" --out "$jobs/elastic" >"$jobs/elastic.err" 2>&1; then
    for stage in 0 1; do
      local got gave
      got=$(logged_checksum "$jobs/elastic/logs/rank-$((2 + stage)).log" "is back in the job")
      gave=$(logged_checksum "$jobs/elastic/logs/rank-$stage.log" "gave rank")
      echo "  stage $stage: the joiner took checksum ${got:-none}, the donor gave ${gave:-none}:" \
        "$([ -n "$got" ] && [ "$got" = "$gave" ] && echo ok || echo FAIL)"
    done
    { grep -c "rejoins the job" "$jobs/elastic.err" || true; } | sed 's/^/  joins the launcher logged: /'
  else
    echo "elastic: FAIL: $(why "$jobs/elastic")"
  fi

  if [ "$DEVICE" != cuda ]; then return; fi
  echo "== the quickstart job on cuda (2 stages, 700 steps)"
  timeout "$(left 120)" "$pipert" launch --stages 2 --replicas 1 --runtime.device=cuda \
    --data.path="$corpus" --out "$jobs/quickstart" 2>&1 | tail -n 2 || echo "quickstart: FAIL"

  echo "== GPT-2 124M (T = 1024, B = 8), one process and 2 stages sharing the GPU: where the time goes"
  export PIPERT_LOG=info # the workers' logs say their arena's size and high-water mark
  gpt2="--model.n_layer=12 --model.n_embd=768 --model.n_head=12 --model.block_size=1024 --model.vocab_size=50257
        --train.batch_size=8 --train.steps=12 --train.log_every=1 --train.val_every=0 --data.path=$corpus"
  median_step='import json,statistics as s,sys;print("%.1f ms/step" % s.median([json.loads(l)["ms_per_step"] for l in open(sys.argv[1]) if "ms_per_step" in l][4:]))'
  # shellcheck disable=SC2086
  timeout "$(left 90)" "$pipert" launch --quiet --stages 1 $gpt2 --runtime.device=cuda --out "$jobs/gpt2-one" \
    >"$jobs/gpt2-one.err" 2>&1 && echo "  one process: $(python3 -c "$median_step" "$jobs/gpt2-one/metrics.jsonl")" ||
    echo "  one process: FAIL: $(why "$jobs/gpt2-one")"
  # shellcheck disable=SC2086
  timeout "$(left 90)" "$pipert" launch --quiet --stages 2 $gpt2 --runtime.device=cuda --out "$jobs/gpt2-two" \
    >"$jobs/gpt2-two.err" 2>&1 &&
    { echo "  2 stages: $(python3 -c "$median_step" "$jobs/gpt2-two/metrics.jsonl")"
      transfer_share "$jobs/gpt2-two/trace.json" "$(python3 -c "$median_step" "$jobs/gpt2-one/metrics.jsonl")"
      grep -h "go device to device" "$jobs"/gpt2-two/logs/*.log | sed 's/^[0-9:.]* info  /  /' ||
        echo "  the tensors between the stages went through host copies (no CUDA IPC)"; } ||
    echo "  2 stages: FAIL: $(why "$jobs/gpt2-two")"
  # the same through host copies (as before CUDA IPC), to hold the two paths side by side
  # shellcheck disable=SC2086
  PIPERT_DEVICE_PAYLOADS=0 timeout "$(left 90)" "$pipert" launch --quiet --stages 2 $gpt2 --runtime.device=cuda \
    --out "$jobs/gpt2-two-staged" >"$jobs/gpt2-two-staged.err" 2>&1 &&
    { echo "  2 stages through host copies (PIPERT_DEVICE_PAYLOADS=0): $(python3 -c "$median_step" "$jobs/gpt2-two-staged/metrics.jsonl")"
      transfer_share "$jobs/gpt2-two-staged/trace.json" "$(python3 -c "$median_step" "$jobs/gpt2-one/metrics.jsonl")"; } ||
    echo "  2 stages through host copies: FAIL: $(why "$jobs/gpt2-two-staged")"
  echo "  2 replicas sharing the GPU, each dp.method's step against none's (allreduce: the mean in device memory,"
  echo "  and through host copies with PIPERT_DEVICE_PAYLOADS=0; sparse: its partition through the host; diloco:"
  echo "  fragments at outer steps):"
  for method in none allreduce allreduce-staged sparse diloco; do
    payloads=1; [ "$method" = allreduce-staged ] && payloads=0
    # shellcheck disable=SC2086
    PIPERT_DEVICE_PAYLOADS=$payloads timeout "$(left 90)" "$pipert" launch --quiet --replicas 2 \
      --dp.method=${method%-staged} $gpt2 --runtime.device=cuda \
      --out "$jobs/gpt2-dp-$method" >"$jobs/gpt2-dp-$method.err" 2>&1 &&
      echo "    $method: $(python3 -c "$median_step" "$jobs/gpt2-dp-$method/metrics.jsonl")" ||
      echo "    $method: FAIL: $(why "$jobs/gpt2-dp-$method")"
  done
  grep -h "replicas average their gradients" "$jobs"/gpt2-dp-allreduce/logs/rank-0.log |
    sed 's/^[0-9:.]* info  /    /' || echo "    allreduce: no word of where the replicas averaged"
  echo "  device memory per rank: the cost model's need (what pipert simulate says) and the arena's high-water mark"
  grep -h -E "by the cost model|high-water" "$jobs"/gpt2-*/logs/*.log 2>/dev/null | sed 's/^[0-9:.]* info  /  /'

  echo "== GPT-2 124M in bf16 at B = 16, one process: the memory of a step (issue 27: at most 9.1 GB)"
  # shellcheck disable=SC2086
  timeout "$(left 90)" "$pipert" launch --quiet --stages 1 ${gpt2/--train.batch_size=8/--train.batch_size=16} \
    --runtime.precision=bf16 --runtime.device=cuda --out "$jobs/bf16-b16" >"$jobs/bf16-b16.err" 2>&1 &&
    { echo "  $(python3 -c "$median_step" "$jobs/bf16-b16/metrics.jsonl")"
      grep -h -E "by the cost model|high-water" "$jobs"/bf16-b16/logs/*.log | sed 's/^[0-9:.]* info  /  /'; } ||
    echo "  bf16 at B = 16: FAIL: $(why "$jobs/bf16-b16")"
  # the same step with attention on CUDA cores (attention.cu) rather than tensor cores (attention_mma.cuh)
  # shellcheck disable=SC2086
  PIPERT_CUDA_MMA_ATTENTION=0 timeout "$(left 90)" "$pipert" launch --quiet --stages 1 \
    ${gpt2/--train.batch_size=8/--train.batch_size=16} --runtime.precision=bf16 --runtime.device=cuda \
    --out "$jobs/bf16-b16-simt" >"$jobs/bf16-b16-simt.err" 2>&1 &&
    echo "  attention on CUDA cores (PIPERT_CUDA_MMA_ATTENTION=0): $(python3 -c "$median_step" "$jobs/bf16-b16-simt/metrics.jsonl")" ||
    echo "  bf16 at B = 16, attention on CUDA cores: FAIL: $(why "$jobs/bf16-b16-simt")"
  echo "== GPT-2 124M in bf16 at B = 8, one process and 2 stages: the stages exchange bf16 (pipeline.transfer)"
  # shellcheck disable=SC2086
  timeout "$(left 90)" "$pipert" launch --quiet --stages 1 $gpt2 --runtime.precision=bf16 --runtime.device=cuda \
    --out "$jobs/bf16-one" >"$jobs/bf16-one.err" 2>&1 &&
    echo "  one process: $(python3 -c "$median_step" "$jobs/bf16-one/metrics.jsonl")" ||
    echo "  one process: FAIL: $(why "$jobs/bf16-one")"
  # shellcheck disable=SC2086
  timeout "$(left 90)" "$pipert" launch --quiet --stages 2 $gpt2 --runtime.precision=bf16 --runtime.device=cuda \
    --out "$jobs/bf16-two" >"$jobs/bf16-two.err" 2>&1 &&
    { echo "  2 stages: $(python3 -c "$median_step" "$jobs/bf16-two/metrics.jsonl")"
      transfer_share "$jobs/bf16-two/trace.json" "$(python3 -c "$median_step" "$jobs/bf16-one/metrics.jsonl")"; } ||
    echo "  2 stages in bf16: FAIL: $(why "$jobs/bf16-two")"

  echo "== $((SECONDS)) s"
}

case "${1:-}" in
  prepare) prepare ;;
  run) # the table on stdout and in $OUT/gpu-check.log; a failed check makes the exit status 1
    mkdir -p "${OUT:-/tmp/gpu-check}"
    run 2>&1 | tee "${OUT:-/tmp/gpu-check}/gpu-check.log"
    if grep -q FAIL "${OUT:-/tmp/gpu-check}/gpu-check.log"; then echo "gpu-check: a check failed (above)" >&2; exit 1; fi ;;
  *) echo "usage: scripts/gpu-check.sh prepare|run" >&2; exit 2 ;;
esac
