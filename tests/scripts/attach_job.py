"""A running "training" job for the attach tests.

Two forked workers spend their time in `crunch` (pure Python arithmetic)
from the start; a third worker is forked `late` seconds after the start,
so that a test attached by then sees a process start while it records.
The main process waits for them and exits with `code`.
Usage: attach_job.py SECONDS LATE CODE
"""
import multiprocessing as mp
import sys
import time


def crunch(n):
    acc = 0
    for i in range(n):
        acc = (acc * 31 + i) % 1000003
    return acc


def worker(until):
    while time.monotonic() < until:
        crunch(20000)


def main():
    seconds, late, code = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    ctx = mp.get_context("fork")
    t0 = time.monotonic()
    until = t0 + seconds
    procs = [ctx.Process(target=worker, args=(until,)) for _ in range(2)]
    for p in procs:
        p.start()
    time.sleep(max(0.0, t0 + late - time.monotonic()))
    extra = ctx.Process(target=worker, args=(until,))
    extra.start()
    procs.append(extra)
    for p in procs:
        p.join()
    print("attach_job done", flush=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
