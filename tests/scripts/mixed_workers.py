"""Python worker functions calling native library code (zlib, OpenSSL's
SHA-256 through hashlib), in the main process and in forked workers.

Each process runs `work`, which alternates `compress_block` (zlib's
deflate) and `hash_block` (hashlib.sha256) every few milliseconds, with a
little pure-Python arithmetic in `checksum` between them. Used by the
flamegraph-view tests and the perf-trampoline test.

Usage: mixed_workers.py [seconds] [workers]
"""
import hashlib
import multiprocessing as mp
import os
import sys
import time
import zlib


def compress_block(data):
    return len(zlib.compress(data, 6))


def hash_block(data):
    h = hashlib.sha256()
    for _ in range(8):
        h.update(data)
    return h.digest()


def checksum(n):
    acc = 0
    for i in range(n):
        acc = (acc * 31 + i) & 0xFFFFFF
    return acc


def work(seconds):
    data = os.urandom(1 << 15) + bytes(1 << 15)
    end = time.monotonic() + seconds
    rounds = 0
    while time.monotonic() < end:
        compress_block(data)
        hash_block(data)
        checksum(3000)
        rounds += 1
    return rounds


def worker(seconds, q):
    q.put(work(seconds))


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(seconds, q)) for _ in range(workers)]
    for p in procs:
        p.start()
    rounds = work(seconds)
    rounds += sum(q.get() for _ in procs)
    for p in procs:
        p.join()
    print(f"rounds: {rounds}", file=sys.stderr)


if __name__ == "__main__":
    main()
