#!/usr/bin/env python3
"""gpuprof's fixed cost per run: paired runs of a short job, bare and under
gpuprof, interleaved so that the machine's load falls on both alike.

The job writes the wall-clock time of its first and last Python statement
into a file, so each run's extra time is split into start-up (gpuprof's
start to the job's first statement, against the same span bare) and tail
(the job's last statement to gpuprof's exit, against bare).

    scripts/bench_fixed_cost.py [--gpuprof target/release/gpuprof] [--runs 10]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

JOB = r"""
import sys, time
t0 = time.time()
time.sleep(float(sys.argv[2]))
t1 = time.time()
with open(sys.argv[1], "w") as f:
    f.write(f"{t0} {t1}\n")
"""


def one(cmd_prefix, python, stamp, sleep_s):
    start = time.time()
    subprocess.run(
        cmd_prefix + [python, "-c", JOB, stamp, str(sleep_s)],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    end = time.time()
    t0, t1 = (float(x) for x in open(stamp).read().split())
    return end - start, t0 - start, end - t1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpuprof", default="target/release/gpuprof")
    ap.add_argument("--python", default=shutil.which("python3") or "python3")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--sleep", type=float, default=1.0)
    args = ap.parse_args()
    python = os.path.realpath(args.python)
    tmp = tempfile.mkdtemp(prefix="gpuprof-fixed-cost-")
    stamp = os.path.join(tmp, "stamp")
    rows = []
    for i in range(args.runs + 1):
        out = os.path.join(tmp, f"run{i}")
        bare = one([], python, stamp, args.sleep)
        prof = one([args.gpuprof, "-q", "-o", out, "--"], python, stamp, args.sleep)
        shutil.rmtree(out, ignore_errors=True)
        if i == 0:
            continue  # warm-up: page cache, pyc files
        rows.append((prof[0] - bare[0], prof[1] - bare[1], prof[2] - bare[2]))
        print(
            f"run {i:2d}: extra {rows[-1][0]*1000:7.1f} ms"
            f" (start-up {rows[-1][1]*1000:6.1f} ms, tail {rows[-1][2]*1000:6.1f} ms)",
            flush=True,
        )
    shutil.rmtree(tmp, ignore_errors=True)
    for name, k in (("extra", 0), ("start-up", 1), ("tail", 2)):
        v = sorted(r[k] for r in rows)
        print(
            f"{name:9s} median {statistics.median(v)*1000:7.1f} ms,"
            f" min {v[0]*1000:7.1f} ms, max {v[-1]*1000:7.1f} ms over {len(v)} paired runs"
        )
    try:
        print(f"load average: {os.getloadavg()}")
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main())
