#!/usr/bin/env python3
"""The simulator's device from N copies of `pipert bench` that ran at once.

`pipert simulate` prices a stage's compute at a device's FLOP/s (--flops) times
the share of it the kernels reach (--efficiency); a device is runtime.threads
cores, and ranks dealt to one device take turns. A job of W workers keeps
min(W, D) of the machine's D devices busy at once, and a busy machine is slower
per core than an idle one (shared memory bandwidth and caches, the OS's
scheduling, and whatever else runs on a shared host). So the calibration runs W
bench copies at once — the case's own number of busy workers — and reads the
machine's throughput under that contention:

    busy        = min(W, D)                      devices the copies occupy
    flops       = sum of the copies' GEMM peaks / busy
    efficiency  = sum of their achieved FLOP/s / sum of their peaks

so flops · efficiency, the only product the compute term uses, is the achieved
FLOP/s per busy device. With W > D the copies share the devices and each
reports its share; summing them gives back the devices' whole rate, which the
simulator then shares among the ranks itself. One copy alone (W = 1) is the old
calibration: its peak and its share of it.

If the copies' peaks happened to be measured under more contention than their
steps (efficiency above 1), the product is kept and reported as efficiency 1.

Usage: calibration.py --devices D BENCH_OUTPUT...   prints "FLOPS EFFICIENCY"
"""
import re
import sys

PEAK = re.compile(r"GEMM peak .*: ([0-9.]+) GFLOP/s")
ACHIEVED = re.compile(r"\| ([0-9.]+) GFLOP/s \| [0-9.]+% of peak")


def parse_bench(text):
    """(GEMM peak, achieved training GFLOP/s) from one `pipert bench` output."""
    peak, achieved = PEAK.search(text), ACHIEVED.search(text)
    if not peak or not achieved:
        raise ValueError("not a `pipert bench` output (no GEMM peak or achieved GFLOP/s line)")
    return float(peak[1]), float(achieved[1])


def combine(copies, devices):
    """(FLOP/s, efficiency) of one device, from the copies' (peak, achieved) GFLOP/s."""
    if not copies or devices < 1:
        raise ValueError("need at least one bench copy and one device")
    busy = min(len(copies), devices)
    peak = sum(p for p, _ in copies)
    achieved = sum(a for _, a in copies)
    if achieved > peak:
        return 1e9 * achieved / busy, 1.0
    return 1e9 * peak / busy, achieved / peak


def main(argv):
    if len(argv) < 3 or argv[0] != "--devices":
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    devices = int(argv[1])
    copies = []
    for path in argv[2:]:
        with open(path) as f:
            copies.append(parse_bench(f.read()))
    flops, efficiency = combine(copies, devices)
    print(f"{flops:.6g} {efficiency:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
