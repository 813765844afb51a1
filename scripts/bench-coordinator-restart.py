#!/usr/bin/env python3
"""What killing the coordinator costs a job (issue 29 item 5).

Runs a `pipert launch` job of 2 stages x 2 replicas undisturbed, then the same job while this
script kills the coordinator's process (DIR/coordinator.pid, SIGKILL) --kills times, --every
seconds apart, and again in each of --reps rounds (ABAB: undisturbed, killed). Reports, as
medians over the rounds: the job's wall time killed against undisturbed (a ratio, measured in the
same round), the time from each kill to the new coordinator having taken the job over (every
worker registered again; the launcher's log), and the steps lost: the killed run's losses must
equal the undisturbed run's at every step (exactly), so any step that differs or is missing counts.

  scripts/bench-coordinator-restart.py [--build build] [--steps 6000] [--kills 5] [--every 2]
                                       [--reps 3] [--out runs/coordinator-restart]
"""
import argparse
import datetime
import json
import os
import re
import signal
import statistics
import subprocess
import time

MODEL = ["--model.n_layer=2", "--model.n_embd=32", "--model.n_head=2", "--model.block_size=32",
         "--train.batch_size=4", "--train.warmup_steps=1", "--train.val_every=0",
         "--train.log_every=1", "--runtime.threads=1", "--train.checkpoint_every=0"]


def launch(args, out):
    subprocess.run(["rm", "-rf", out])
    os.makedirs(out)
    command = [os.path.join(args.build, "tools", "pipert"), "launch", "--quiet", "--stages", "2",
               "--replicas", "2", *MODEL, "--train.steps=%d" % args.steps, "--out", out]
    env = dict(os.environ, PIPERT_LOG="info")
    log = open(os.path.join(out, "launch.out"), "w")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)


def losses(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return {m["step"]: m["loss"] for m in map(json.loads, f) if "loss" in m}


def log_times(out, needle):
    """UTC seconds of the day of each launcher log line holding `needle`."""
    times = []
    with open(os.path.join(out, "launch.out")) as f:
        for line in f:
            m = re.match(r"(\d\d):(\d\d):(\d\d\.\d+) ", line)
            if m and needle in line:
                times.append(int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3]))
    return times


def seconds_of_day_utc():
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.hour * 3600 + now.minute * 60 + now.second + now.microsecond / 1e6


def wait_or_end(p, seconds):
    """Sleeps `seconds`, or until the job ends."""
    try:
        p.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        pass


def killed_run(args, out):
    started = time.monotonic()
    p = launch(args, out)
    kills = []
    pid_file = os.path.join(out, "coordinator.pid")
    wait_or_end(p, args.every)
    while len(kills) < args.kills and p.poll() is None:
        try:
            with open(pid_file) as f:
                os.kill(int(f.read()), signal.SIGKILL)
            kills.append(seconds_of_day_utc())
        except (OSError, ValueError):
            pass
        wait_or_end(p, args.every)
    status = p.wait()
    return status, time.monotonic() - started, kills


def undisturbed_run(args, out):
    started = time.monotonic()
    status = launch(args, out).wait()
    return status, time.monotonic() - started


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--every", type=float, default=2.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="runs/coordinator-restart")
    args = ap.parse_args()
    ratios, takeovers, lost, kills_done = [], [], [], []
    for rep in range(args.reps):
        ref_dir = os.path.join(args.out, "undisturbed-%d" % rep)
        dir_ = os.path.join(args.out, "killed-%d" % rep)
        ref_status, ref_s = undisturbed_run(args, ref_dir)
        status, wall_s, kills = killed_run(args, dir_)
        if ref_status or status:
            raise SystemExit("a run failed (%d, %d): see %s/launch.out" % (ref_status, status, dir_))
        taken = log_times(dir_, "took the running job over")
        for k in kills:
            later = [t - k for t in taken if t >= k]
            if later:
                takeovers.append(min(later))
        want, got = losses(ref_dir), losses(dir_)
        lost.append(sum(1 for s, v in want.items() if got.get(s) != v))
        ratios.append(wall_s / ref_s)
        kills_done.append(len(kills))
        print("round %d: %d kills, wall %.2f s killed vs %.2f s undisturbed, %d steps differ" %
              (rep, len(kills), wall_s, ref_s, lost[-1]), flush=True)
    print("kills per run            %s" % kills_done)
    print("steps lost (all runs)    %d of %d" % (sum(lost), args.steps * args.reps))
    print("wall time, killed/undisturbed: median %.3f (min %.3f, max %.3f)" %
          (statistics.median(ratios), min(ratios), max(ratios)))
    if takeovers:
        print("kill -> new coordinator took the job over: median %.3f s, max %.3f s (%d kills)" %
              (statistics.median(takeovers), max(takeovers), len(takeovers)))


if __name__ == "__main__":
    main()
