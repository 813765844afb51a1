#!/usr/bin/env python3
"""What a replica's death costs an elastic job (issue 11, "Measured").

Runs `pipert launch --stages 2 --replicas 3 --min-replicas 2` and, once
replica 0's last stage has logged step KILL, kills one worker of replica 1
(rank 3) with SIGKILL from outside. Every step is logged (train.log_every=1),
so the script sees, by polling metrics.jsonl:
  death -> next step   wall time from the kill to the first step the
                       survivors complete after it;
  death -> regrouped   from the kill to the survivors' "coupling resumes"
                       log line (the switch to the new groups);
  stall                the longest gap between two logged steps around the
                       kill, against the median step time before it;
  tokens/s             of the whole job over the run, against an
                       uninterrupted run of the same job (same machine, run
                       interleaved), so "throughput lost" is their ratio.
On a machine with fewer cores than workers the survivors speed up when a
replica's processes stop: read the ratio as what this machine gave.

Usage: scripts/bench-elastic.py [--build DIR] [--steps N] [--kill K]
       [--reps R] [--methods sparse,allreduce] [-- extra launch args]
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime

MODEL = ["--train.log_every=1", "--train.val_every=0", "--runtime.threads=1"]


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default="build")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--kill", type=int, default=200)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--methods", default="sparse,allreduce")
    p.add_argument("extra", nargs="*")
    return p.parse_args()


def steps_logged(path):
    """[(step, elapsed_s, tokens)] of metrics.jsonl so far."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    o = json.loads(line)
                except json.JSONDecodeError:
                    break  # a line being written
                out.append((o["step"], o.get("elapsed_s", 0.0), o.get("tokens", 0.0)))
    except FileNotFoundError:
        pass
    return out


def worker_pid(out_dir, rank):
    with open(os.path.join(out_dir, "workers.pid")) as f:
        for line in f:
            r, pid = line.split()
            if int(r) == rank:
                return int(pid)
    raise RuntimeError(f"no pid for rank {rank}")


def regroup_time(out_dir):
    """Wall clock (today) of rank 0's 'coupling resumes' line, or None."""
    try:
        text = open(os.path.join(out_dir, "logs", "rank-0.log")).read()
    except FileNotFoundError:
        return None
    m = re.search(r"^(\d\d):(\d\d):(\d\d\.\d+) warn .*the coupling resumes", text, re.M)
    if not m:
        return None
    now = datetime.now()
    midnight = datetime(now.year, now.month, now.day).timestamp()
    return midnight + int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))


def run(args, method, kill):
    out_dir = tempfile.mkdtemp(prefix="pipert-elastic-")
    cmd = [os.path.join(args.build, "tools", "pipert"), "launch", "--quiet", "--stages", "2",
           "--replicas", "3", "--min-replicas", "2", "--out", out_dir,
           f"--dp.method={method}", f"--train.steps={args.steps}"] + MODEL + args.extra
    env = dict(os.environ, PIPERT_LOG="info")
    job = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    metrics = os.path.join(out_dir, "metrics.jsonl")
    killed_at = killed_step = next_step_at = None
    while job.poll() is None:
        logged = steps_logged(metrics)
        last = logged[-1][0] if logged else 0
        now = time.time()
        if kill and killed_at is None and last >= args.kill:
            os.kill(worker_pid(out_dir, 3), signal.SIGKILL)
            killed_at, killed_step = time.time(), last
        elif killed_at is not None and next_step_at is None and last > killed_step:
            next_step_at = now
        time.sleep(0.002)
    err = job.stderr.read().decode()
    if job.returncode != 0:
        sys.exit(f"{method}: the job failed ({job.returncode}):\n{err}")
    logged = steps_logged(metrics)
    result = {"wall": logged[-1][1], "tokens_per_s": logged[-1][2] / logged[-1][1]}
    if kill:
        gaps = [b[1] - a[1] for a, b in zip(logged, logged[1:])]
        before = statistics.median(gaps[:killed_step - 1])
        around = gaps[max(0, killed_step - 5):killed_step + 50]
        regrouped = regroup_time(out_dir)
        result.update(next_step=next_step_at - killed_at if next_step_at else float("nan"),
                      regrouped=regrouped - killed_at if regrouped else float("nan"),
                      stall=max(around), step=before)
    shutil.rmtree(out_dir)
    return result


def main():
    args = parse()
    print(f"# bench-elastic: 2 stages x 3 replicas, {args.steps} steps, rank 3 killed at step "
          f"{args.kill}; {args.reps} runs each, interleaved; extra: {' '.join(args.extra) or '-'}")
    print("method     death->next step  death->regrouped  stall (median step)  tok/s kept")
    for method in args.methods.split(","):
        rows = []
        for _ in range(args.reps):
            base = run(args, method, kill=False)
            hit = run(args, method, kill=True)
            rows.append((hit, hit["tokens_per_s"] / base["tokens_per_s"]))
        med = lambda key: statistics.median(r[0][key] for r in rows)
        kept = statistics.median(r[1] for r in rows)
        print(f"{method:10} {1e3 * med('next_step'):13.0f} ms {1e3 * med('regrouped'):13.0f} ms "
              f"{1e3 * med('stall'):8.0f} ms ({1e3 * med('step'):.1f} ms) {100 * kept:9.1f}%")


if __name__ == "__main__":
    main()
