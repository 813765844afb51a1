#!/usr/bin/env python3
"""scripts/calibration.py and scripts/calibrate.sh --workers: the device the
simulator is calibrated with, from bench copies run at once.

The combining is checked against sums worked out by hand; the parsing against
`pipert bench`'s own output (so a change of its format fails here, not in a
benchmark); the script end to end only for its shape (two numbers, a share in
(0, 1]), never for a time."""
import importlib.util
import os
import subprocess
import unittest

ROOT = os.environ.get("PIPERT_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), ".."))
PIPERT = os.environ.get("PIPERT_BIN", os.path.join(ROOT, "build", "tools", "pipert"))
TINY = ["--runtime.threads=1", "--model.n_layer=1", "--model.n_embd=32", "--model.n_head=2",
        "--model.block_size=16", "--model.vocab_size=256", "--train.batch_size=2"]

spec = importlib.util.spec_from_file_location("calibration", os.path.join(ROOT, "scripts", "calibration.py"))
calibration = importlib.util.module_from_spec(spec)
spec.loader.exec_module(calibration)

# What cmd_bench.c prints, written out by hand.
BENCH_OUTPUT = """model n_layer=6 n_embd=192 n_head=6 T=128 B=8 vocab=256 (2.79M params), 1 threads, cpu backend
fp32 GEMM peak (sgemm 2048³, median of 7): 69.4 GFLOP/s
step: median 289.12 ms over 10 steps (after 3 warm-up) | 3542 tokens/s | 64.0 GFLOP/s | 92.2% of peak
"""


class Combine(unittest.TestCase):
    def expect(self, copies, devices, flops, efficiency):
        got = calibration.combine(copies, devices)
        self.assertAlmostEqual(got[0], flops, delta=1e-9 * flops, msg=f"FLOP/s of {copies} on {devices}")
        self.assertAlmostEqual(got[1], efficiency, places=12, msg=f"efficiency of {copies} on {devices}")

    def test_one_copy_alone_is_its_peak_and_share(self):
        self.expect([(50.0, 40.0)], 2, 50e9, 0.8)

    def test_copies_on_their_own_devices_average(self):
        # (40 + 38) / 2 devices; (30 + 28) of (40 + 38) reached
        self.expect([(40.0, 30.0), (38.0, 28.0)], 2, 39e9, 58 / 78)

    def test_copies_sharing_devices_add_up_to_the_devices_rate(self):
        # four copies on two devices each get half of one: 2 × 20 per device, 2 × 15 reached
        self.expect([(20.0, 15.0)] * 4, 2, 40e9, 0.75)

    def test_a_share_above_one_keeps_the_product(self):
        # peaks measured under more contention than the steps: 12 per device reached, reported as 12 at 1
        self.expect([(10.0, 12.0), (10.0, 12.0)], 2, 12e9, 1.0)

    def test_no_copies_is_refused(self):
        with self.assertRaises(ValueError):
            calibration.combine([], 2)


class ParseBench(unittest.TestCase):
    def test_the_printed_format(self):
        self.assertEqual(calibration.parse_bench(BENCH_OUTPUT), (69.4, 64.0))

    def test_something_else_is_refused(self):
        with self.assertRaises(ValueError):
            calibration.parse_bench("usage: pipert bench [--steps N]\n")

    def test_pipert_benchs_own_output(self):
        text = subprocess.run([PIPERT, "bench", "--steps", "2", "--warmup", "0", *TINY], check=True,
                              capture_output=True, text=True).stdout
        peak, achieved = calibration.parse_bench(text)
        self.assertGreater(peak, 0, text)
        self.assertGreater(achieved, 0, text)
        # the share bench prints is the ratio of the two numbers parsed (to its rounding)
        share = float(text.split("% of peak")[0].rsplit("|", 1)[1])
        self.assertAlmostEqual(100 * achieved / peak, share, delta=0.2 + 100 * 0.05 / peak, msg=text)


class CalibrateScript(unittest.TestCase):
    def calibrate(self, *args):
        return subprocess.run([os.path.join(ROOT, "scripts", "calibrate.sh"), *args, PIPERT, *TINY],
                              capture_output=True, text=True)

    def test_two_workers_give_a_device(self):
        result = self.calibrate("--workers", "2")
        self.assertEqual(result.returncode, 0, result.stderr)
        flops, efficiency = (float(x) for x in result.stdout.split())
        self.assertGreater(flops, 0)
        self.assertTrue(0 < efficiency <= 1, result.stdout)

    def test_a_worker_count_below_one_is_refused(self):
        result = self.calibrate("--workers", "0")
        self.assertEqual(result.returncode, 2, result.stdout)
        self.assertIn("--workers", result.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
