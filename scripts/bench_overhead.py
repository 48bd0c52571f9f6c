#!/usr/bin/env python3
"""Overhead of gpuprof on a job, measured side by side in one run.

Runs `samples/train_sim.py` bare and under `gpuprof` (release build) at
default settings, interleaved, N times each, and prints:
- median wall time bare vs profiled and their ratio (target <= 1.02),
- gpuprof's own CPU time as % of one core (from report.json; target <= 2%),
- gpuprof's peak RSS,
- recording size per minute of run.

With --attach, a third variant starts the job bare and attaches
`gpuprof attach PID` as soon as its workers run, until it exits: what
attaching to a job at full speed costs it, beside a launched recording.

Usage: scripts/bench_overhead.py [--runs 5] [--steps 300] [--workers 4] [--attach] [-- extra gpuprof flags, e.g. --no-stacks]
Machines here are noisy: compare the ratio within one run, not absolute times.
"""

import argparse
import json
import re
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--augment-ms", type=float, default=8.0)
    ap.add_argument("--gpu-ms", type=float, default=10.0)
    ap.add_argument("--bin", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "gpuprof"))
    ap.add_argument("--attach", action="store_true", help="also measure `gpuprof attach` on the running job")
    ap.add_argument("gpuprof_flags", nargs="*")
    a = ap.parse_args()
    if not os.path.exists(a.bin):
        subprocess.run(["cargo", "build", "--release"], cwd=ROOT, check=True)
    job = [sys.executable, os.path.join(ROOT, "samples", "train_sim.py"), "--workers", str(a.workers),
           "--steps", str(a.steps), "--augment-ms", str(a.augment_ms), "--gpu-ms", str(a.gpu_ms)]
    bare, prof, cpu_pct, rss, rec_per_min = [], [], [], [], []
    job_bare, job_prof = [], []  # the job's own measure of its training loop
    job_att, att_cpu = [], []

    def job_time(stdout):
        m = re.search(r"steps in ([0-9.]+) s", stdout)
        return float(m.group(1)) if m else float("nan")

    with tempfile.TemporaryDirectory(prefix="gpuprof-bench-") as tmp:
        for i in range(a.runs):
            t = time.perf_counter()
            o = subprocess.run(job, check=True, stdout=subprocess.PIPE, text=True)
            bare.append(time.perf_counter() - t)
            job_bare.append(job_time(o.stdout))
            out = os.path.join(tmp, f"run{i}")
            t = time.perf_counter()
            o = subprocess.run([a.bin, "-q", "-o", out, *a.gpuprof_flags, "--", *job], check=True, stdout=subprocess.PIPE, text=True)
            prof.append(time.perf_counter() - t)
            job_prof.append(job_time(o.stdout))
            r = json.load(open(os.path.join(out, "report.json")))
            p = r["profiler"]
            cpu_pct.append(p["cpu_pct_of_one_core"])
            rss.append(p["max_rss_bytes"])
            rec_per_min.append(p.get("recording_bytes", 0) / max(r["duration_s"], 1e-9) * 60)
            if a.attach:
                out = os.path.join(tmp, f"att{i}")
                jp = subprocess.Popen(job, stdout=subprocess.PIPE, text=True)
                # Attach as soon as the workers run (the loop is then at speed).
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    try:
                        kids = open(f"/proc/{jp.pid}/task/{jp.pid}/children").read().split()
                    except OSError:
                        kids = []
                    if len(kids) >= a.workers:
                        break
                    time.sleep(0.01)
                g = subprocess.run([a.bin, "attach", str(jp.pid), "-q", "-o", out, *a.gpuprof_flags], stdout=subprocess.DEVNULL)
                stdout, _ = jp.communicate()
                job_att.append(job_time(stdout))
                if g.returncode == 0:
                    r = json.load(open(os.path.join(out, "report.json")))
                    att_cpu.append(r["profiler"]["cpu_pct_of_one_core"])
    mb, mp = statistics.median(bare), statistics.median(prof)
    print(f"job: {' '.join(job[1:])}")
    print(f"runs: {a.runs} each, interleaved")
    print(f"wall bare     median {mb:.3f} s  (all: {', '.join(f'{x:.2f}' for x in bare)})")
    print(f"wall gpuprof  median {mp:.3f} s  (all: {', '.join(f'{x:.2f}' for x in prof)})")
    print(f"slowdown ratio {mp / mb:.4f}  (whole command: includes gpuprof's start-up and its analysis/export after the job)")
    jb, jp = statistics.median(job_bare), statistics.median(job_prof)
    print(f"job's own loop time: bare {jb:.3f} s, under gpuprof {jp:.3f} s, ratio {jp / jb:.4f}  (target <= 1.02)")
    print(f"gpuprof CPU   median {statistics.median(cpu_pct):.2f}% of one core while recording (target <= 2%)")
    if job_att:
        ja = statistics.median(job_att)
        print(f"attached:     job's own loop time {ja:.3f} s, ratio to bare {ja / jb:.4f}, to launched {ja / jp:.4f}; "
              f"gpuprof CPU median {statistics.median(att_cpu) if att_cpu else float('nan'):.2f}% of one core")
    print(f"gpuprof RSS   max {max(rss) / 1e6:.1f} MB")
    print(f"recording     {statistics.median(rec_per_min) / 1e3:.1f} kB per minute of run")


if __name__ == "__main__":
    main()
