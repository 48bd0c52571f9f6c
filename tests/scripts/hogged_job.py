"""A CPU-bound job that another program (the hog, outside the job's
tree) competes with on the same CPU. It runs fixed-work steps for a
number of seconds and prints, from the hog's own /proc/PID/stat, the
share of this window's wall time the hog was on a CPU: the job is
always runnable, so that is the share of its runnable time the hog took
when both are pinned to one CPU.

Usage: hogged_job.py HOG_PID SECONDS
"""
import os
import sys
import time


def hog_cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 (state is field 3).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def step():
    acc = 0
    for i in range(200_000):
        acc = (acc * 1103515245 + i) & 0x7FFFFFFF
    return acc


def main():
    hog, seconds = int(sys.argv[1]), float(sys.argv[2])
    t0, c0 = time.monotonic(), hog_cpu_s(hog)
    steps = 0
    while time.monotonic() - t0 < seconds:
        step()
        steps += 1
    t1, c1 = time.monotonic(), hog_cpu_s(hog)
    print(f"steps {steps}")
    print(f"hog share {(c1 - c0) / (t1 - t0):.4f}")


if __name__ == "__main__":
    main()
