"""A small CPU-bound "training" job for the stack-sampling tests.

The main process runs `train_loop`, two forked workers spend their time
(CPU seconds) in `augment` (pure Python arithmetic) and `compress_batch`
(zlib.compress, a native routine), and a short-lived child (`blip`) forks, burns CPU for
about 150 ms and exits. Usage: stacks_job.py [seconds] [workers] [exit code].
"""
import multiprocessing as mp
import os
import sys
import time
import zlib


def augment(n):
    acc = 0
    for i in range(n):
        acc = (acc * 31 + i) % 1000003
    return acc


def compress_batch(data):
    return len(zlib.compress(data, 9))


def worker(seconds, q):
    data = os.urandom(1 << 16) + bytes(1 << 16)
    # CPU seconds, not wall: the tests count its samples (cpu-clock), and on
    # a loaded machine a wall-clock second holds less CPU.
    end = time.process_time() + seconds
    done = 0
    while time.process_time() < end:
        augment(20000)
        compress_batch(data)
        done += 1
    q.put(done)


def blip():
    end = time.monotonic() + 0.15
    while time.monotonic() < end:
        augment(2000)


def train_loop(seconds):
    end = time.monotonic() + seconds
    steps = 0
    while time.monotonic() < end:
        acc = 0
        for i in range(3000):
            acc += i * i
        steps += 1
        time.sleep(0.002)
    return steps


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    code = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(seconds, q)) for _ in range(workers)]
    for p in procs:
        p.start()
    b = ctx.Process(target=blip)
    b.start()
    train_loop(seconds)
    b.join()
    total = sum(q.get() for _ in procs)
    for p in procs:
        p.join()
    print(f"steps done: {total}", file=sys.stderr)
    sys.exit(code)


if __name__ == "__main__":
    main()
