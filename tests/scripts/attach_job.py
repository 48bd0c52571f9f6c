"""A running "training" job for the attach tests, steered through files.

Two forked workers spend their time in `crunch` (pure Python arithmetic)
from the start. When the file DIR/fork-late appears, the main process forks
a third worker (a process that starts while gpuprof records); when DIR/stop
appears, every worker ends and the main process exits with CODE.
Usage: attach_job.py DIR CODE
"""
import multiprocessing as mp
import os
import sys
import time


def crunch(n):
    acc = 0
    for i in range(n):
        acc = (acc * 31 + i) % 1000003
    return acc


def worker(stop):
    while not os.path.exists(stop):
        crunch(20000)


def main():
    ctl, code = sys.argv[1], int(sys.argv[2])
    stop, late = os.path.join(ctl, "stop"), os.path.join(ctl, "fork-late")
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=worker, args=(stop,)) for _ in range(2)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 120
    forked = False
    while not os.path.exists(stop) and time.monotonic() < deadline:
        if not forked and os.path.exists(late):
            extra = ctx.Process(target=worker, args=(stop,))
            extra.start()
            procs.append(extra)
            forked = True
        time.sleep(0.02)
    open(stop, "a").close()
    for p in procs:
        p.join()
    print("attach_job done", flush=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
