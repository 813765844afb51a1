#!/usr/bin/env python3
"""PyTorch's training step on the shape bench_cuda times, for a side-by-side figure.

    python3 scripts/bench-torch-gpt2.py [--modes fp32,tf32,bf16,bf16-compile] [--batch 16]
        [--seq 1024] [--layers 12] [--width 768] [--heads 12] [--vocab 50257] [--tied]
        [--steps 10] [--warmup 3] [--device cuda|cpu]

One JSON line per mode: tokens/s over the median timed step (the device synchronized at the end
of each), the step in ms, the peak of the device memory PyTorch allocated, the parameters.
The model is GPT-2's (pre-norm blocks, GELU with tanh, learned positions), written here from
its definition; like bench_cuda: random tokens, AdamW (lr 6e-4, betas 0.9/0.95, weight decay
0.1 on matrices), gradients clipped to norm 1, lm_head its own matrix unless --tied.

Modes (each in a fresh model and optimizer):
    fp32          fp32 everywhere, TF32 off: the exact step, pipert's bench_cuda without --tf32
    tf32          fp32 tensors, TF32 in matrix products (bench_cuda --tf32)
    bf16          autocast to bf16, fused attention (scaled_dot_product_attention), fused AdamW
    bf16-compile  the same under torch.compile
A mode the installed PyTorch lacks (torch.compile before 2.0) is reported as skipped.
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.fc_proj = nn.Linear(4 * width, width)

    def attention(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # PyTorch before 2.0
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.wte = nn.Embedding(args.vocab, args.width)
        self.wpe = nn.Embedding(args.seq, args.width)
        self.blocks = nn.ModuleList(Block(args.width, args.heads) for _ in range(args.layers))
        self.ln_f = nn.LayerNorm(args.width)
        self.lm_head = nn.Linear(args.width, args.vocab, bias=False)
        if args.tied:
            self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * args.layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, tokens, targets):
        positions = torch.arange(tokens.size(1), device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def optimizer_for(model, fused):
    matrices = [p for p in model.parameters() if p.dim() == 2]
    others = [p for p in model.parameters() if p.dim() != 2]
    groups = [{"params": matrices, "weight_decay": 0.1}, {"params": others, "weight_decay": 0.0}]
    options = {"lr": 6e-4, "betas": (0.9, 0.95), "eps": 1e-8}
    if fused:
        options["fused"] = True
    return torch.optim.AdamW(groups, **options)


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_mode(mode, args, device):
    if mode == "bf16-compile" and not hasattr(torch, "compile"):
        return {"mode": mode, "torch": torch.__version__,
                "skipped": "torch.compile needs PyTorch 2.0 or later"}
    torch.manual_seed(1337)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = mode != "fp32"
        torch.backends.cudnn.allow_tf32 = mode != "fp32"
        torch.cuda.reset_peak_memory_stats()
    model = GPT(args).to(device)
    parameters = sum(p.numel() for p in model.parameters())
    bf16 = mode.startswith("bf16")
    optimizer = optimizer_for(model, fused=bf16 and device.type == "cuda")
    step_model = torch.compile(model) if mode == "bf16-compile" else model
    tokens = torch.randint(args.vocab, (args.batch, args.seq + 1), device=device)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    times, losses = [], []
    for step in range(args.warmup + args.steps):
        synchronize(device)
        started = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = step_model(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        if step >= args.warmup:
            times.append(time.perf_counter() - started)
        losses.append(loss.item())
    median = statistics.median(times)
    row = {"mode": mode, "tokens_per_s": args.batch * args.seq / median, "step_ms": 1e3 * median,
           "parameters": parameters, "first_loss": losses[0], "last_loss": losses[-1],
           "batch": args.batch, "seq": args.seq, "torch": torch.__version__}
    if device.type == "cuda":
        row["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 1e9
        row["device"] = torch.cuda.get_device_name()
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", default="fp32,tf32,bf16,bf16-compile")
    for name, default in [("batch", 16), ("seq", 1024), ("layers", 12), ("width", 768),
                          ("heads", 12), ("vocab", 50257), ("steps", 10), ("warmup", 3)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--tied", action="store_true", help="lm_head shares wte (GPT-2's 124M)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    known = {"fp32", "tf32", "bf16", "bf16-compile"}
    modes = args.modes.split(",")
    if not set(modes) <= known or args.width % args.heads or min(args.steps, args.batch) < 1:
        p.error(f"--modes from {sorted(known)}; --width a multiple of --heads; steps, batch >= 1")
    device = torch.device(args.device)
    for mode in modes:
        print(json.dumps(run_mode(mode, args, device)), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
