"""A DataLoader-like job without PyTorch: WORKERS forked worker processes
take batch indices from a queue, build each batch in augment() (integer
arithmetic in Python, then zlib), and send it back through a
multiprocessing.Queue, whose feeder thread runs in every worker as it does
in PyTorch DataLoader workers. The main process consumes the batches.

    loader_job.py SECONDS WORKERS
"""
import multiprocessing as mp
import os
import sys
import time
import zlib

PAYLOAD = os.urandom(1 << 12) + bytes(1 << 12)


def augment(i):
    acc = i
    for k in range(3000):
        acc = (acc * 1103515245 + 12345 + k) & 0x7FFFFFFF
    return zlib.compress(PAYLOAD + acc.to_bytes(4, "little"), 6)


def worker(index_q, out_q):
    while True:
        i = index_q.get()
        if i is None:
            return
        out_q.put((i, augment(i)))


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    ctx = mp.get_context("fork")
    index_q, out_q = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(index_q, out_q)) for _ in range(workers)]
    for p in procs:
        p.start()
    end = time.perf_counter() + seconds
    sent = got = 0
    while time.perf_counter() < end:
        while sent - got < 4 * workers:
            index_q.put(sent)
            sent += 1
        out_q.get()
        got += 1
    for _ in procs:
        index_q.put(None)
    while got < sent:
        out_q.get()
        got += 1
    for p in procs:
        p.join()
    print("loader_job: %d batches" % got)


if __name__ == "__main__":
    main()
