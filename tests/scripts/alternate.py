"""Two Python functions alternating every few milliseconds on one thread,
each spending its time in a different native library: compress_block() in
zlib (deflate), hash_block() in OpenSSL or CPython's own SHA-256. A
profiler that attributes native leaves to the Python function that really
ran them files every zlib sample under compress_block and every SHA-256
sample under hash_block.

    alternate.py SECONDS WORKERS [THREADED]

runs the alternation in the main process and in WORKERS forked worker
processes; with THREADED=1 each worker also runs a multiprocessing.Queue
(whose feeder thread the workers' results go through, as in a PyTorch
DataLoader worker).
"""
import hashlib
import multiprocessing as mp
import os
import sys
import time
import zlib

ZDATA = os.urandom(1 << 13) + bytes(1 << 13)
HDATA = os.urandom(1 << 16)
SLICE = 0.003


def compress_block(until):
    n = 0
    while time.perf_counter() < until:
        zlib.compress(ZDATA, 6)
        n += 1
    return n


def hash_block(until):
    n = 0
    while time.perf_counter() < until:
        hashlib.sha256(HDATA).digest()
        n += 1
    return n


def alternate(seconds):
    end = time.perf_counter() + seconds
    counts = [0, 0]
    while time.perf_counter() < end:
        counts[0] += compress_block(time.perf_counter() + SLICE)
        counts[1] += hash_block(time.perf_counter() + SLICE)
    return counts


def worker(seconds, q):
    counts = alternate(seconds)
    if q is not None:
        q.put(counts)


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    threaded = len(sys.argv) > 3 and sys.argv[3] == "1"
    ctx = mp.get_context("fork")
    q = ctx.Queue() if threaded else None
    procs = [ctx.Process(target=worker, args=(seconds, q)) for _ in range(workers)]
    for p in procs:
        p.start()
    counts = alternate(seconds)
    if q is not None:
        for _ in procs:
            q.get()
    for p in procs:
        p.join()
        assert p.exitcode == 0, p.exitcode
    print("alternate: zlib calls %d, sha256 calls %d" % tuple(counts))


if __name__ == "__main__":
    main()
