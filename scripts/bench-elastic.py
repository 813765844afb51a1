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
With --restarts the launcher starts replica 1 again (--restarts 1) and it
rejoins with a survivor's state; then also:
  death -> back        from the kill to the joiner's "back in the job" line;
  start -> back        from the restarted worker's first log line to it (its
                       start-up, registration, the survivors' switch, the
                       transfer of its stage's state and the restore);
  join stall           the longest gap between two logged steps around the
                       join (the survivors wait at the switch for the transfer),
                       and what it lost: that gap less the median step;
  donor send           the longest a donor (replica 0's rank of a stage) took to
                       give a joiner its stage's state, as it logs it;
  joiner take          the longest a joiner's stage took from the survivors
                       connecting to its state restored, as it logs it.
On a machine with fewer cores than workers the survivors speed up when a
replica's processes stop: read the ratio as what this machine gave.

Usage: scripts/bench-elastic.py [--build DIR] [--steps N] [--kill K]
       [--reps R] [--methods sparse,allreduce] [--replicas R] [--restarts]
       [--no-reference] [-- extra launch args]
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
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--restarts", action="store_true")
    p.add_argument("--no-reference", action="store_true",
                   help="skip the uninterrupted runs (no tok/s kept): half the time")
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


def log_times(out_dir, rank, pattern):
    """Wall clocks (today) of rank's log lines matching pattern, in order."""
    try:
        text = open(os.path.join(out_dir, "logs", f"rank-{rank}.log")).read()
    except FileNotFoundError:
        return []
    now = datetime.now()
    midnight = datetime(now.year, now.month, now.day).timestamp()
    return [midnight + int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
            for m in re.finditer(r"^(\d\d):(\d\d):(\d\d\.\d+) \w+ +(?:\[rank \d+\] )?" + pattern,
                                 text, re.M)]


def regroup_time(out_dir):
    """Wall clock of rank 0's first 'coupling resumes' line, or None."""
    times = log_times(out_dir, 0, ".*the coupling resumes")
    return times[0] if times else None


def run(args, method, kill):
    out_dir = tempfile.mkdtemp(prefix="pipert-elastic-")
    cmd = [os.path.join(args.build, "tools", "pipert"), "launch", "--quiet", "--stages", "2",
           "--replicas", str(args.replicas), "--min-replicas", str(args.replicas - 1),
           "--out", out_dir, f"--dp.method={method}",
           f"--train.steps={args.steps}"] + MODEL + args.extra
    if args.restarts:
        cmd += ["--restarts", "1"]
    env = dict(os.environ, PIPERT_LOG="info")
    job = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        return watch(args, method, kill, job, out_dir)
    finally:
        if job.poll() is None:
            job.terminate()
            job.wait()


def watch(args, method, kill, job, out_dir):
    metrics = os.path.join(out_dir, "metrics.jsonl")
    killed_at = killed_step = next_step_at = None
    seen = {}  # step -> wall clock when this script first saw it logged
    while job.poll() is None:
        logged = steps_logged(metrics)
        last = logged[-1][0] if logged else 0
        now = time.time()
        for step, _, _ in logged[-20:]:
            seen.setdefault(step, now)
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
        if args.restarts:
            result.update(rejoin(out_dir, seen, killed_at))
            result["join_lost"] = result["join_stall"] - before
    shutil.rmtree(out_dir)
    return result


def rejoin(out_dir, seen, killed_at):
    """The joiner's times (rank 2: stage 0 of replica 1), and the longest gap between
    the steps the survivors logged (as this script saw them, wall clock) within 3 s of
    its arrival: the switch waits for the transfer of the state."""
    back = log_times(out_dir, 2, "replica 1 is back in the job")
    starts = log_times(out_dir, 2, "rank 2 of")
    if not back or len(starts) < 2:
        sys.exit(f"{out_dir}: replica 1 did not rejoin (see logs/rank-2.log)")
    times = sorted(seen.values())
    near = [b - a for a, b in zip(times, times[1:]) if abs(b - back[0]) < 3 or abs(a - back[0]) < 3]
    return {"back": back[0] - killed_at, "start_to_back": back[0] - starts[-1],
            "join_stall": max(near) if near else float("nan"),
            "donor_send": logged_seconds(out_dir, DONOR_SENT),
            "joiner_take": logged_seconds(out_dir, JOINER_TOOK)}


# "gave rank 2 (coming back) the state of stage 0 after step 9: 812.3 MB in 0.41 s ..."
DONOR_SENT = re.compile(r"gave rank \d+ \(coming back\).*? MB in ([\d.]+) s")
# "stage 0: received the state of switch 3 (812.3 MB) 0.38 s after the survivors connected,
# restored it in 0.44 s"
JOINER_TOOK = re.compile(r"received the state of switch .*? ([\d.]+) s after the survivors "
                         r"connected, restored it in ([\d.]+) s")


def logged_seconds(out_dir, pattern):
    """The largest sum of the seconds `pattern` captures in any rank's log (nan if none)."""
    found = []
    logs = os.path.join(out_dir, "logs")
    for name in os.listdir(logs):
        with open(os.path.join(logs, name)) as f:
            found += [sum(float(g) for g in m.groups()) for m in pattern.finditer(f.read())]
    return max(found) if found else float("nan")


def main():
    # a timeout or ^C ends the runs too (each launch stops its workers on SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args = parse()
    print(f"# bench-elastic: 2 stages x {args.replicas} replicas, {args.steps} steps, rank 3 killed at step "
          f"{args.kill}; {args.reps} runs each, interleaved; extra: {' '.join(args.extra) or '-'}")
    print("method     death->next step  death->regrouped  stall (median step)  tok/s kept"
          + ("  death->back  start->back  join stall (lost)  donor send  joiner take"
               if args.restarts else ""))
    for method in args.methods.split(","):
        rows = []
        for _ in range(args.reps):
            base = None if args.no_reference else run(args, method, kill=False)
            hit = run(args, method, kill=True)
            rows.append((hit, hit["tokens_per_s"] / base["tokens_per_s"] if base else float("nan")))
        med = lambda key: statistics.median(r[0][key] for r in rows)
        kept = statistics.median(r[1] for r in rows)
        line = (f"{method:10} {1e3 * med('next_step'):13.0f} ms {1e3 * med('regrouped'):13.0f} ms "
                f"{1e3 * med('stall'):8.0f} ms ({1e3 * med('step'):.1f} ms) {100 * kept:9.1f}%")
        if args.restarts:
            line += (f" {med('back'):10.2f} s {med('start_to_back'):10.2f} s "
                     f"{1e3 * med('join_stall'):8.0f} ms ({1e3 * med('join_lost'):.0f} ms) "
                     f"{med('donor_send'):9.2f} s "
                     f"{med('joiner_take'):10.2f} s")
        print(line)


if __name__ == "__main__":
    main()
