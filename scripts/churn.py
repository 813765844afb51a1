#!/usr/bin/env python3
"""The churn test bed: a job trains through random failures injected from outside.

A 2-site job (emulated links: 100 Mbit/s, 50 ms one way), 2 stages x 3 replicas, elastic
(--min-replicas 1) with restarts, runs while this driver, for --minutes, at random:
  kill    SIGKILL to one worker (the launcher starts its replica again: --restarts);
  freeze  SIGSTOP to one worker for longer than the heartbeat timeout, then SIGCONT;
  link    the inter-site link of site 1 down for 5-30 s (ip link set wan0 down in its namespace);
  coordinator  SIGKILL to the coordinator's process (DIR/coordinator.pid; the launcher starts it
          again and the workers register with the new one: comm/coordinator_recover.c).
It never takes more replicas out than --min-replicas allows. A replica takes one kill or freeze
at a time; the link may go down again while site 1's replica is still coming back from the last
outage (a flapping link), and then that outage's recovery is the later one's.
Faults come for --minutes of wall time from the job's first step (the job is sized to outlast
them), then the job trains to its end undisturbed; with --stop-when-recovered (the CI form) the
driver ends it (SIGTERM to the launcher, exit 143) as soon as every fault has been recovered from.
It reads the launcher's DIR/status.json (each rank's state, step, pid, exits) four times a second
and reports, per method: the faults injected by kind and survived, the steps and tokens each cost
the replica it hit, the longest stall of the replicas no fault touched, the time from each
restart to the replica training in step again, NaN, exits that no injected fault explains (a
worker dying of UCX 1.13's known assertion, UCX_113_ABORT, is counted apart), and
the final validation loss against an undisturbed run of as many tokens (its own schedule).

  scripts/churn.sh [--minutes 10] [--methods sparse,streaming-diloco] [--build build]
                   [--out runs/churn] [--seed 1] [--gap 1.5] [--no-reference] [--check]
                   [--stop-when-recovered]

--check exits 1 when a target is missed (the CI form: scripts/churn.sh --short). Needs root
(network namespaces). The report: OUT/report.json and a table on stdout.
"""
import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import time

# A model whose steps take long enough that the link's 50 ms do not set the pace: the job steps
# 1.7 times as fast with site 1's replica out, not 10 times (as a 32-wide one does)
MODEL = ["--model.n_layer=2", "--model.n_embd=96", "--model.n_head=2", "--model.block_size=64",
         "--train.batch_size=8", "--train.warmup_steps=20", "--runtime.threads=1",
         "--train.val_batches=20"]
STAGES, REPLICAS, MIN_REPLICAS = 2, 3, 1
HEARTBEAT_S = 6.0          # --heartbeat-timeout: a freeze lasts longer than this
LINK_DOWN_S = (5.0, 30.0)  # the link's outages, log-uniformly (a mean of 14 s)
FREEZE_EXTRA_S = (1.0, 4.0)
POLL_S = 0.25
LINK_LEAD = 2
STALL_LIMIT_S = 60.0       # the target: every untouched replica steps at least this often
RECOVERY_S = HEARTBEAT_S + 30.0  # a fault lifted this close to the job's end may not heal first
DEADLOCK_S = 240.0         # no replica stepping this long: the job is stopped, its stacks shown
LOSS_LIMIT = 0.02          # the target: within 2% of the undisturbed run at equal tokens
KINDS = ("kill", "freeze", "link", "coordinator")
STEPS_FACTOR = 1.4         # the churned job's steps: this many times --minutes at the undisturbed
TAIL_STEPS_S = 10.0        # rate, and this many seconds more: with site 1's replica out the job
LAST_FAULT_AT = 0.97       # steps up to 1.2 times as fast (its link outages fill 70% of the time),
                           # so that --minutes end the faults first; never after this share of the steps
# a coordinator is killed only once it has served this long: one killed every second never
# lives to see a worker fall silent (a freeze), and the bed would test nothing else
COORDINATOR_LIFE_S = 2 * HEARTBEAT_S
# UCX 1.13.1's wrong assertion when an endpoint fails or is purged ("ucp_request.c:684 ... got REP
# message"; issue 29): UCX 1.14 removed it (commit 9ccaf31), Debian 12 has only 1.13.1. A worker
# that dies of it is counted apart, not as an exit no fault explains; its replica leaves and
# comes back as after a kill, and its partners' exits while it does are that leaving's.
UCX_113_ABORT = "got REP message"


def pipert_command(build, out, method, steps, val_every, elastic):
    command = [os.path.join(build, "tools", "pipert"), "launch", "--quiet", "--sites", "2",
               "--stages", str(STAGES), "--replicas", str(REPLICAS), "--out", out,
               "--wan.bandwidth=100mbit", "--wan.latency=50ms", "--dp.method=" + method,
               "--train.steps=%d" % steps, "--train.log_every=1",
               "--train.val_every=%d" % val_every, "--train.checkpoint_every=0"] + MODEL
    if elastic:
        command += ["--min-replicas", str(MIN_REPLICAS), "--restarts", "100000",
                    "--heartbeat-timeout", "%g" % HEARTBEAT_S]
    return command


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_metrics(path):
    """metrics.jsonl's lines, those with a loss and those with a validation loss."""
    steps, vals = [], []
    try:
        with open(path) as f:
            for line in f:
                try:
                    m = json.loads(line)
                except ValueError:
                    continue
                (vals if "val_loss" in m else steps).append(m)
    except OSError:
        pass
    return steps, vals


def run_quietly(command, log):
    with open(log, "w") as f:
        return subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT)


class Replica:
    """What the driver knows of one replica from status.json."""

    def __init__(self, index):
        self.index = index
        self.step = -1            # its last stage's latest step
        self.stepped_at = None    # when that step was first seen
        self.training = False     # every rank of it training
        self.fault = None         # the fault at it now (an Event), or None
        self.pids = {}            # rank -> pid
        self.exits = {}           # rank -> exits seen
        self.starts = {}          # rank -> starts seen
        self.reported = -1        # its last stage's step as status.json says now
        self.states = []          # its ranks' states as status.json says now


class Event:
    def __init__(self, kind, replica, rank, at, step, duration=0.0):
        self.kind, self.replica, self.rank, self.at = kind, replica, rank, at
        self.step_before = step   # the replica's step when hit
        self.duration = duration  # freeze and link: how long the fault lasts
        self.ends_at = at + duration
        self.ended = duration == 0.0  # freeze and link end when they are lifted
        self.left = False         # the replica left the job because of it
        self.restarted_at = None  # the launcher started it again
        self.back_at = None       # training in step again
        self.back_step = None     # its first step back
        self.pid = None
        self.pids = {}            # rank -> pid of the replica's processes when hit
        self.cut_by_end = False   # not recovered from, as the job ended too soon after it
        self.superseded = []      # earlier faults at this replica it hit before they healed
        self.superseded_by = None # the later fault that hit before this one healed (an Event)

    def row(self):
        # steps the replica did not take: from the one it was hit at to the donor's step it
        # came back at (to within a poll); none when it stayed in the job
        lost = None if self.back_step is None or self.superseded_by else \
            max(0, self.back_step - 1 - self.step_before) if self.left else 0
        return {"kind": self.kind, "replica": self.replica, "rank": self.rank,
                "at_s": round(self.at, 2), "duration_s": round(self.duration, 2),
                "left": self.left, "step_hit": self.step_before, "step_back": self.back_step,
                "steps_lost": lost,
                "restart_to_training_s": None if self.restarted_at is None or self.back_at is None
                else round(self.back_at - self.restarted_at, 2),
                "recovered_s": None if self.back_at is None else round(self.back_at - self.at, 2),
                "cut_by_end": self.cut_by_end,
                # its recovery is the later fault's, which counts the steps lost since this one
                "superseded_by_at_s": None if self.superseded_by is None
                else round(self.superseded_by.at, 2)}


class Driver:
    def __init__(self, args, out, launcher, rng):
        self.args, self.out, self.launcher, self.rng = args, out, launcher, rng
        self.replicas = [Replica(r) for r in range(REPLICAS)]
        self.events, self.unexpected, self.killed_pids = [], [], set()
        self.cut_off_exits = 0    # replacements that could not get back in: their site's link was
                                  # down, or the coordinator was killed while they rejoined
        self.ucx_aborts = []      # workers that died of UCX 1.13's assertion (UCX_113_ABORT)
        self.ucx_abort_at = {}    # replica -> when one of its workers last did
        self.longest_stall = 0.0
        self.longest_stall_at = None
        self.started = time.monotonic()
        self.first_step_at = None
        self.link_down = None  # the link Event in progress
        self.coordinator = None  # the coordinator's kill not yet recovered from (an Event)
        self.coordinator_new_at = 0.0   # when the newest coordinator's pid appeared
        self.coordinator_steps = None   # the untouched replicas' steps then
        self.namespace = None
        self.status = None
        self.churn_seconds = 0.0  # from the first step to the last fault's chance
        self.deadlock = None      # seconds without a step when the driver stopped the job
        self.stopped_at = None    # when the driver stopped the job, every fault recovered from

    # ---- reading the job --------------------------------------------------------------
    def now(self):
        return time.monotonic() - self.started

    def site1_namespace(self):
        if self.namespace:
            return self.namespace
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        prefix = "pipert-%d-s1" % self.launcher.pid
        for line in names.splitlines():
            if line.split()[0] == prefix:
                self.namespace = prefix
        return self.namespace

    def observe(self):
        status = read_json(os.path.join(self.out, "status.json"))
        if not status or "ranks" not in status:
            return
        self.status = status
        now = self.now()
        for rep in self.replicas:
            ranks = [r for r in status["ranks"] if r["replica"] == rep.index]
            last = max(ranks, key=lambda r: r["stage"])
            rep.reported = last["step"]  # as reported now: -1 for a new process before its step
            training = all(r["state"] == "training" for r in ranks)
            rep.states = [r["state"] for r in ranks]
            for r in ranks:
                self.note_process(rep, r, now)
            if last["step"] > rep.step or (training and not rep.training and last["step"] >= 0):
                if rep.stepped_at is not None and rep.fault is None and rep.training and training:
                    self.note_gap(now - rep.stepped_at, rep.index)
                if last["step"] > rep.step:
                    rep.step, rep.stepped_at = last["step"], now
                    if self.first_step_at is None:
                        self.first_step_at = now
            rep.training = training
            self.note_recovery(rep, ranks, now)
        self.note_coordinator(status, now)
        # a replica no fault touches must step on: its stall so far counts too
        for rep in self.replicas:
            if rep.fault is None and rep.training and rep.stepped_at is not None and \
                    status.get("phase") == "running" and rep.step < status.get("total_steps", 0):
                self.note_gap(now - rep.stepped_at, rep.index)

    def note_gap(self, gap, replica):
        if gap > self.longest_stall:
            self.longest_stall, self.longest_stall_at = gap, (round(self.now(), 1), replica)

    def note_process(self, rep, r, now):
        rank = r["rank"]
        if r["starts"] > rep.starts.get(rank, 1) and rep.fault and rep.fault.restarted_at is None:
            rep.fault.restarted_at = now
        rep.starts[rank] = r["starts"]
        if r["exits"] > rep.exits.get(rank, 0):
            self.judge_exit(rep, r)
        rep.exits[rank] = r["exits"]
        rep.pids[rank] = r["pid"]

    def judge_exit(self, rep, r):
        if self.stopped_at is not None:
            return  # the driver's stop
        how = r.get("last_exit", "")
        pid = rep.pids.get(r["rank"], r["pid"])
        if how == "signal 9" and pid in self.killed_pids:
            return  # our kill
        if how == "exit 3" and rep.fault is not None:
            rep.fault.left = True  # its replica left the job: the fault's doing
            return
        if how == "exit 1" and rep.fault is not None and rep.fault.kind == "link":
            # a replacement started while its site's link was down: it cannot start (UCX finds
            # no device) or reach the coordinator; the launcher starts it again later
            rep.fault.left = True
            self.cut_off_exits += 1
            return
        if how == "exit 1" and rep.fault is not None and r["state"] in ("registering", "joining") \
                and any(e.kind == "coordinator" and e.at >= rep.fault.at for e in self.events):
            # a replacement rejoining when the coordinator was killed: the one started again
            # does not take back a replica that was coming back (comm/coordinator_recover.c);
            # its new processes give up (a registration it never answered, a partner that gave
            # up first) and the launcher starts them again later
            rep.fault.left = True
            self.cut_off_exits += 1
            return
        if how == "exit 0" and r["state"] == "done":
            return
        if how == "signal 6" and any(UCX_113_ABORT in line for line in self.last_words(r["rank"], 40)):
            self.ucx_aborts.append({"at_s": round(self.now(), 2), "rank": r["rank"], "pid": pid})
            self.ucx_abort_at[rep.index] = self.now()
            print("churn: rank %d died of UCX 1.13's endpoint assertion (issue 29), counted apart"
                  % r["rank"], flush=True)
            return
        if how == "exit 3" and self.now() - self.ucx_abort_at.get(rep.index, -RECOVERY_S) < RECOVERY_S:
            return  # its replica left: a worker of it died of UCX's assertion just before
        self.unexpected.append({"at_s": round(self.now(), 2), "rank": r["rank"], "pid": pid,
                                "how": how, "state": r["state"], "last_words": self.last_words(r["rank"])})

    def last_words(self, rank, lines=3):
        """The end of a rank's log (its processes' logs, one after another): why it exited."""
        try:
            with open(os.path.join(self.out, "logs", "rank-%d.log" % rank), errors="replace") as f:
                return [line.rstrip()[:300] for line in f.readlines()[-lines:]]
        except OSError:
            return []

    def note_recovery(self, rep, ranks, now):
        """A fault is recovered from once it is lifted and its replica steps again with every
        rank training, and still so a heartbeat timeout later (a link back within the timeout
        may yet cost the replica its place). A replica that left must be back with new
        processes that took the donor's state and reported a step of their own."""
        e = rep.fault
        if e is None:
            return
        if any(r["state"] in ("left", "joining") for r in ranks):
            e.left = True
            e.back_at = e.back_step = None
        training = all(r["state"] == "training" for r in ranks)
        if not e.ended or not training or rep.stepped_at is None:
            return
        if e.left:
            renewed = all(r["pid"] != e.pids.get(r["rank"]) for r in ranks)
            if not renewed or rep.reported < 0:
                return
        elif e.kind == "kill" or rep.stepped_at <= e.ends_at:
            return  # a kill takes the replica out first; so does a freeze past the heartbeat,
            # unless no coordinator lived through the silence (it was killed meanwhile)
        if e.back_at is None:
            for hit in [e] + e.superseded:
                hit.back_at, hit.back_step = now, rep.reported
        # back with new processes, the replica is whole again; one that stayed in must still
        # be in a heartbeat timeout after the fault was lifted
        if e.left or now - e.ends_at >= HEARTBEAT_S + 1.0:
            rep.fault = None

    def coordinator_pid(self):
        try:
            with open(os.path.join(self.out, "coordinator.pid")) as f:
                return int(f.read())
        except (OSError, ValueError):
            return None

    def note_coordinator(self, status, now):
        """A coordinator's kill is recovered from once a new one runs and every replica no fault
        touches trains at a step past the one it was killed at."""
        e = self.coordinator
        if e is None:
            return
        pid = self.coordinator_pid()
        steps = [rep.reported for rep in self.untouched_training()]
        if pid and pid != e.pid and self.coordinator_steps is None and steps:
            self.coordinator_new_at, self.coordinator_steps = now, min(steps)
        if self.coordinator_steps is not None and status.get("phase") == "running" and steps \
                and min(steps) > max(e.step_before, self.coordinator_steps):
            e.back_at, e.back_step = now, min(steps)
            self.coordinator = None

    # ---- injecting --------------------------------------------------------------------
    def untouched_training(self):
        return [rep for rep in self.replicas if rep.fault is None and rep.training]

    def can_take_out(self, rep):
        others = [r for r in self.untouched_training() if r is not rep]
        return rep.fault is None and rep.training and rep.step >= 0 and \
            len(others) >= MIN_REPLICAS

    def can_cut_link(self, rep):
        """The link may go down while site 1's replica is in, or again while it is out after a
        fault already lifted and none of its processes has registered to rejoin yet (a flapping
        link). Not during a join: UCX 1.13 aborts a survivor whose endpoint to the joiner fails
        with a wireup message pending (openucx/ucx#8175, fixed in 1.14; NOTES.md)."""
        if rep.fault is None:
            return self.can_take_out(rep)
        return rep.fault.ended and not self.args.one_at_a_time and \
            all(state == "left" for state in rep.states)

    def inject(self, counts):
        """One fault of the kind least injected so far that can be injected now."""
        if self.args.one_at_a_time and (any(rep.fault for rep in self.replicas) or
                                        self.coordinator):
            return None
        # the link is one resource, down for 14 s on average: it goes first while it is no more
        # than LINK_LEAD faults ahead, or it falls behind the others for good
        for kind in sorted(KINDS, key=lambda k: (counts[k] - (LINK_LEAD if k == "link" else 0),
                                                 self.rng.random())):
            if kind == "coordinator":
                if self.coordinator is None and self.untouched_training() and \
                        self.now() - self.coordinator_new_at >= COORDINATOR_LIFE_S:
                    e = self.kill_coordinator()
                    if e:
                        return e
                continue
            if kind == "link":
                rep = self.replicas[1]  # site 1 holds replica 1 (replica r: site r mod 2)
                if self.link_down is None and self.can_cut_link(rep) and self.site1_namespace():
                    return self.take_link_down(rep)
                continue
            candidates = [rep for rep in self.replicas if self.can_take_out(rep)]
            if not candidates:
                continue
            rep = self.rng.choice(candidates)
            rank = rep.index * STAGES + self.rng.randrange(STAGES)
            pid = rep.pids.get(rank)
            if not pid:
                continue
            return self.signal_rank(kind, rep, rank, pid)
        return None

    def signal_rank(self, kind, rep, rank, pid):
        duration = HEARTBEAT_S + self.rng.uniform(*FREEZE_EXTRA_S) if kind == "freeze" else 0.0
        e = Event(kind, rep.index, rank, self.now(), rep.reported, duration)
        e.pid = pid
        try:
            os.kill(pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
        except ProcessLookupError:
            return None
        if kind == "kill":
            self.killed_pids.add(pid)
        e.pids = dict(rep.pids)
        rep.fault = e
        self.events.append(e)
        return e

    def kill_coordinator(self):
        pid = self.coordinator_pid()
        if not pid:
            return None
        step = min(rep.reported for rep in self.untouched_training())
        e = Event("coordinator", None, None, self.now(), step)
        e.pid = pid
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        self.coordinator, self.coordinator_steps = e, None
        self.events.append(e)
        return e

    def take_link_down(self, rep):
        low, high = (math.log(x) for x in LINK_DOWN_S)
        e = Event("link", rep.index, None, self.now(), rep.reported,
                  math.exp(self.rng.uniform(low, high)))
        if subprocess.run(["ip", "-n", self.namespace, "link", "set", "wan0", "down"]).returncode:
            return None
        self.link_down = e
        e.pids = dict(rep.pids)
        earlier = rep.fault
        if earlier is not None:  # still coming back from it: the two heal as one
            earlier.superseded_by = e
            e.superseded = [earlier] + earlier.superseded
            e.pids, e.left, e.step_before = earlier.pids, earlier.left, earlier.step_before
        rep.fault = e
        self.events.append(e)
        return e

    def churning(self, until):
        """Faults still come: within --minutes of the first step, and before the last steps."""
        total = self.status.get("total_steps", 0)
        done = max(rep.step for rep in self.replicas)
        elapsed = self.now() - self.first_step_at
        if elapsed < until and total > 0 and done < LAST_FAULT_AT * total:
            self.churn_seconds = elapsed
            return True
        return False

    def lift_faults(self):
        now = self.now()
        for e in self.events:
            if e.ended or now < e.ends_at:
                continue
            if e.kind == "freeze":
                try:
                    os.kill(e.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            elif e.kind == "link":
                subprocess.run(["ip", "-n", self.namespace, "link", "set", "wan0", "up"])
                self.link_down = None
            e.ended = True

    def lift_all(self):
        for e in self.events:
            e.ends_at = min(e.ends_at, self.now())
        self.lift_faults()

    def all_recovered(self):
        """Every fault injected was recovered from. Until then the job trains on: a fault that
        is never recovered from is judged at the job's own end, as without the option."""
        if any(rep.fault for rep in self.replicas) or self.coordinator:
            return False
        return self.events and all(e.back_at is not None or e.superseded_by is not None
                                   for e in self.events)

    def stop_recovered(self):
        """Ends the job once its faults are over and recovered from (--stop-when-recovered): the
        steps it has left test nothing more. SIGTERM to the launcher: it exits 128 + 15."""
        self.stopped_at = self.now()
        print("churn: faults over and recovered from at %.0f s: the job is stopped" %
              self.stopped_at, flush=True)
        self.launcher.send_signal(signal.SIGTERM)

    # ---- the run ----------------------------------------------------------------------
    def stuck_for(self):
        """Seconds since any replica last stepped (0 before the first step)."""
        seen = [rep.stepped_at for rep in self.replicas if rep.stepped_at is not None]
        return self.now() - max(seen) if seen else 0.0

    def stop_deadlocked(self):
        """Shows each worker's stacks and the launcher's, then stops the job (SIGINT)."""
        self.deadlock = round(self.stuck_for(), 1)
        print("churn: deadlock: no replica stepped for %.0f s; the workers' stacks:" %
              self.deadlock, flush=True)
        for r in (self.status or {}).get("ranks", []):
            if not r.get("running"):
                continue
            print("---- rank %d (pid %d, %s, step %d)" % (r["rank"], r["pid"], r["state"],
                                                         r["step"]), flush=True)
            subprocess.run("gdb -p %d -batch -nx -ex 'thread apply all bt 12' 2>/dev/null | "
                           "grep -E '^#' | grep -v -E 'libc|libuc|clone|start_thread'" % r["pid"],
                           shell=True)
        self.launcher.send_signal(signal.SIGINT)

    def run(self, minutes, gap):
        counts = {k: 0 for k in KINDS}
        until = minutes * 60.0
        next_at = None
        while self.launcher.poll() is None:
            self.observe()
            self.lift_faults()
            now = self.now()
            if self.deadlock is None and self.stuck_for() > DEADLOCK_S:
                self.lift_all()
                self.stop_deadlocked()
            running = self.status and self.status.get("phase") == "running" and \
                self.first_step_at is not None
            if running and next_at is None:
                next_at = now + self.rng.expovariate(1.0 / gap)
            churning = running and self.churning(until)
            if churning and now >= next_at:
                e = self.inject(counts)
                if e:
                    counts[e.kind] += 1
                next_at = now + self.rng.expovariate(1.0 / gap)
            if self.args.stop_when_recovered and running and not churning and \
                    self.stopped_at is None and self.deadlock is None and self.all_recovered():
                self.stop_recovered()
            time.sleep(POLL_S)
        self.lift_all()
        self.observe()
        ended = self.now()
        for e in self.events:
            e.cut_by_end = e.back_at is None and ended - e.ends_at < RECOVERY_S
        # a flapping link's earlier outages heal with its last one: cut short with it
        for e in self.events:
            if e.cut_by_end:
                for hit in e.superseded:
                    hit.cut_by_end = hit.back_at is None
        return self.launcher.returncode


def calibrate(args, method):
    """Steps per second of the undisturbed job, from a short run."""
    out = os.path.join(args.out, method + "-calibration")
    subprocess.run(["rm", "-rf", out])
    steps = 400
    p = run_quietly(pipert_command(args.build, out, method, steps, 0, False), out + ".log")
    if p.wait() != 0:
        sys.exit("churn: the calibration run of %s failed: see %s.log" % (method, out))
    lines, _ = read_metrics(os.path.join(out, "metrics.jsonl"))
    later = [m for m in lines if m["step"] > 100]
    rate = (later[-1]["step"] - later[0]["step"]) / (later[-1]["elapsed_s"] - later[0]["elapsed_s"])
    return rate


def reference_run(args, method, result, val_every):
    """The undisturbed job at equal tokens: the churned run's tokens in steps of every replica,
    on its own learning-rate schedule (the same shape, over fewer steps)."""
    steps = int(round(result["tokens"] / (REPLICAS * result["tokens_per_replica_step"])))
    ref = os.path.join(args.out, method + "-undisturbed")
    subprocess.run(["rm", "-rf", ref])
    print("churn: %s: the undisturbed run at equal tokens: %d steps" % (method, steps), flush=True)
    p = run_quietly(pipert_command(args.build, ref, method, steps, val_every, False), ref + ".log")
    if p.wait() != 0:
        sys.exit("churn: the undisturbed run of %s failed: see %s.log" % (method, ref))
    ref_lines, ref_vals = read_metrics(os.path.join(ref, "metrics.jsonl"))
    result["undisturbed_steps"] = steps
    result["undisturbed_tokens"] = ref_lines[-1]["tokens"]
    result["undisturbed_val_loss"] = ref_vals[-1]["val_loss"]


def churn_method(args, method, rng):
    rate = calibrate(args, method)
    # more than --minutes of steps at the undisturbed rate (STEPS_FACTOR), so --minutes end the
    # faults
    steps = int(rate * (args.minutes * 60 * STEPS_FACTOR + TAIL_STEPS_S)) + 200
    val_every = max(50, steps // 40)
    print("churn: %s: %.1f steps/s undisturbed; %d steps, a validation every %d" %
          (method, rate, steps, val_every), flush=True)
    out = os.path.join(args.out, method)
    subprocess.run(["rm", "-rf", out])
    launcher = run_quietly(pipert_command(args.build, out, method, steps, val_every, True),
                           out + ".log")
    driver = Driver(args, out, launcher, rng)
    status = driver.run(args.minutes, args.gap)
    lines, vals = read_metrics(os.path.join(out, "metrics.jsonl"))
    result = {"method": method, "steps": steps, "exit": status,
              "stopped_s": None if driver.stopped_at is None else round(driver.stopped_at, 1),
              "seconds": round(driver.now(), 1),
              "churn_seconds": round(driver.churn_seconds, 1),
              "events": [e.row() for e in driver.events],
              "unexpected_exits": driver.unexpected,
              "cut_off_exits": driver.cut_off_exits,
              "ucx_1_13_aborts": driver.ucx_aborts,
              "longest_stall_s": round(driver.longest_stall, 2),
              "deadlock_s": driver.deadlock,
              "longest_stall_at": driver.longest_stall_at,
              "nan": any(not math.isfinite(m.get("loss", 0.0)) for m in lines) or
              any(not math.isfinite(v["val_loss"]) for v in vals),
              "tokens": lines[-1]["tokens"] if lines else None,
              "final_val_loss": vals[-1]["val_loss"] if vals else None,
              "tokens_per_replica_step": lines[0]["tokens"] / REPLICAS if lines else None}
    if args.reference and lines and status == 0 and driver.stopped_at is None:
        reference_run(args, method, result, val_every)
    return result


def summarize(r):
    ev = r["events"]
    s = {"method": r["method"], "exit": r["exit"], "stopped_s": r["stopped_s"],
         "churn_s": r["churn_seconds"]}
    for kind in KINDS:
        mine = [e for e in ev if e["kind"] == kind]
        s[kind] = len(mine)
        s[kind + "_left"] = sum(e["left"] for e in mine)
        s[kind + "_survived"] = sum(e["recovered_s"] is not None for e in mine)
        s[kind + "_cut_by_end"] = sum(e["cut_by_end"] for e in mine)
    lost = [e["steps_lost"] for e in ev if e["steps_lost"] is not None]
    s["steps_lost_mean"] = round(sum(lost) / len(lost), 1) if lost else 0
    s["steps_lost_max"] = max(lost) if lost else 0
    s["tokens_lost"] = sum(lost) * (r["tokens_per_replica_step"] or 0)
    back = sorted(e["restart_to_training_s"] for e in ev if e["restart_to_training_s"] is not None)
    s["restart_to_training_median_s"] = back[len(back) // 2] if back else None
    s["restart_to_training_max_s"] = back[-1] if back else None
    s["longest_stall_s"] = r["longest_stall_s"]
    s["unexpected_exits"] = len(r["unexpected_exits"])
    s["cut_off_exits"] = r["cut_off_exits"]
    s["ucx_1_13_aborts"] = len(r.get("ucx_1_13_aborts", []))
    s["nan"] = r["nan"]
    s["final_val_loss"] = r["final_val_loss"]
    ref = r.get("undisturbed_val_loss")
    s["undisturbed_val_loss"] = ref
    s["val_loss_vs_undisturbed"] = None if ref is None or r["final_val_loss"] is None else \
        round(r["final_val_loss"] / ref - 1, 4)
    return s


def misses(s, r, args):
    why = []
    if r["deadlock_s"] is not None:
        why.append("deadlock: no replica stepped for %.0f s (stacks above)" % r["deadlock_s"])
    # stopped by the driver: 128 + SIGTERM, or 0 when the job reached its end as it was stopped
    expected = (0,) if s["stopped_s"] is None else (0, 128 + signal.SIGTERM)
    if s["exit"] not in expected:
        why.append("the job exited %d%s" % (s["exit"], "" if s["stopped_s"] is None else
                                           " after the driver's SIGTERM (not 143)"))
    injected = sum(s[k] - s[k + "_cut_by_end"] for k in KINDS)
    survived = sum(s[k + "_survived"] for k in KINDS)
    if survived < injected:
        why.append("%d of %d faults not recovered from" % (injected - survived, injected))
    if s["longest_stall_s"] > STALL_LIMIT_S:
        why.append("a replica no fault touched stalled %.1f s (at %s)" %
                   (s["longest_stall_s"], r["longest_stall_at"]))
    if s["nan"]:
        why.append("NaN in the metrics")
    if s["unexpected_exits"]:
        why.append("exits no fault explains: %s" % r["unexpected_exits"])
    if s["val_loss_vs_undisturbed"] is not None and s["val_loss_vs_undisturbed"] > LOSS_LIMIT:
        why.append("validation loss %+.2f%% against the undisturbed run" %
                   (100 * s["val_loss_vs_undisturbed"]))
    if s["churn_s"] < args.minutes * 60 - 2 * POLL_S:
        why.append("faults came for %.0f s, not %g minutes: the job ran out of steps first" %
                   (s["churn_s"], args.minutes))
    for kind in KINDS:
        if s[kind] < args.at_least:
            why.append("only %d %s faults injected (%d wanted)" % (s[kind], kind, args.at_least))
    return why


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="runs/churn")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--methods", default="sparse,streaming-diloco")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--gap", type=float, default=1.5, help="mean seconds between tries to inject")
    ap.add_argument("--at-least", type=int, default=30, help="faults of each kind wanted")
    ap.add_argument("--one-at-a-time", action="store_true",
                    help="no fault while a replica is still recovering from one (the CI form: "
                         "overlapping faults can still stall a join for 300 s, NOTES.md)")
    ap.add_argument("--no-reference", dest="reference", action="store_false")
    ap.add_argument("--stop-when-recovered", action="store_true",
                    help="end the job once the faults are over and recovered from, not at its last "
                         "step (the CI form; not with the reference run: its loss is compared at "
                         "the churned job's end)")
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args()
    if args.stop_when_recovered and args.reference:
        ap.error("--stop-when-recovered needs --no-reference (the loss is compared at the job's end)")
    if os.geteuid() != 0:
        print("churn: skipped: the emulated sites need root (network namespaces)", file=sys.stderr)
        return 77  # what meson counts as a skipped test

    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(args.seed)
    results, summaries, failed = [], [], []
    for method in args.methods.split(","):
        r = churn_method(args, method, rng)
        s = summarize(r)
        results.append(r)
        summaries.append(s)
        for why in misses(s, r, args):
            failed.append("%s: %s" % (method, why))
    with open(os.path.join(args.out, "report.json"), "w") as f:
        json.dump({"minutes": args.minutes, "seed": args.seed, "gap_s": args.gap,
                   "summaries": summaries, "runs": results}, f, indent=1)
    keys = ["method", "exit", "stopped_s", "churn_s"]
    for kind in KINDS:
        keys += [kind, kind + "_left", kind + "_survived", kind + "_cut_by_end"]
    keys += ["steps_lost_mean", "steps_lost_max",
            "tokens_lost", "longest_stall_s", "restart_to_training_median_s",
            "restart_to_training_max_s", "unexpected_exits", "cut_off_exits", "ucx_1_13_aborts", "nan",
            "final_val_loss",
            "undisturbed_val_loss", "val_loss_vs_undisturbed"]
    for k in keys:
        print("%-38s" % k + "".join("%-20s" % s[k] for s in summaries))
    if failed:  # what happened, for a run nobody can look into afterwards (CI)
        for r in results:
            for e in r["events"]:
                print("churn: %s: fault %s" % (r["method"], json.dumps(e)))
            log = os.path.join(args.out, r["method"] + ".log")
            sys.stdout.flush()
            subprocess.run(["tail", "-n", "40", log])
    # last, where a CI log cut to its end still shows them
    for why in failed:
        print("churn: missed:", why)
    print("churn: report in", os.path.join(args.out, "report.json"))
    return 1 if failed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
