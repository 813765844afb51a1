#!/usr/bin/env python3
"""Why the tests of a meson build failed, in a few lines each, from BUILD/meson-logs/testlog.json.

scripts/test.sh prints this last when a suite fails, where a log cut to its end (CI's) still
shows it: meson's --print-errorlogs prints each failing test's whole output, and the output of
a test that failed early in the suite is cut off by the tests after it.

Usage: failure-digest.py BUILD [--lines N]"""
import argparse
import json
import os
import re
import sys

# Criterion's failed assertions and tests, a crash, a test bed's own verdict, an error logged
WHY = re.compile(r"\[----\]|\[FAIL\]|\bFAIL\b|missed|error|Assertion|Sanitizer|Segmentation|"
                 r"Timeout|timed out|crash|signal")


def digest(entry, lines):
    # meson keeps a test's stderr apart when it has any (Criterion writes there)
    out = ((entry.get("stdout") or "") + (entry.get("stderr") or "")).splitlines()
    hits = [line for line in out if WHY.search(line)]
    # the first hits name the cause; the last ones what the test concluded
    half = lines // 2
    shown = hits if len(hits) <= lines else hits[:half] + ["..."] + hits[-(lines - half):]
    if not shown:
        shown = out[-lines:]
    return [line if len(line) <= 400 else line[:400] + " ..." for line in shown]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("--lines", type=int, default=24)
    args = ap.parse_args()
    path = os.path.join(args.build, "meson-logs", "testlog.json")
    try:
        with open(path) as f:
            entries = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        print("failure digest: cannot read %s: %s" % (path, e), file=sys.stderr)
        return 1
    failed = [e for e in entries if e.get("result") not in ("OK", "SKIP", "EXPECTEDFAIL")]
    print("==== failure digest of %s: %d of %d tests failed" %
          (args.build, len(failed), len(entries)))
    for e in failed:
        print("---- %s: %s (%.0f s)" % (e.get("name"), e.get("result"), e.get("duration", 0)))
        for line in digest(e, args.lines):
            print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
