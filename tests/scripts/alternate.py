"""Two Python functions alternating every few milliseconds on one thread,
each spending its time in a different native library: compress_block() in
zlib (deflate), hash_block() in OpenSSL or CPython's own SHA-256. A
profiler that attributes native leaves to the Python function that really
ran them files every zlib sample under compress_block and every SHA-256
sample under hash_block.

    alternate.py SECONDS WORKERS [THREADED] [FRESH]

runs the alternation in the main process and in WORKERS forked worker
processes; with THREADED=1 each worker also runs a multiprocessing.Queue
(whose feeder thread the workers' results go through, as in a PyTorch
DataLoader worker). With FRESH=1 both functions are compiled anew for
every slice and freed after it, so that one function's code object is
often born at the address the other's just left (as code made at run
time is: exec, templates, tracing compilers); it prints how many
addresses the two shared.
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


# Both the same code but for the name and the native work passed in: the
# two code objects are of one size, so the allocator reuses the address.
# The native work runs in a nested function, so that {name} lies below the
# innermost frame, as most of a stack's code objects do.
TEMPLATE = """
def {name}(until, work=work, data=data):
    def step():
        work(data)
    n = 0
    while time.perf_counter() < until:
        step()
        n += 1
    return n
"""


def fresh(name, work, data):
    ns = {"time": time, "work": work, "data": data}
    exec(compile(TEMPLATE.format(name=name), __file__, "exec"), ns)
    # Out of its globals: freed when the caller drops it (no cycle).
    return ns.pop(name)


def alternate(seconds, fresh_code=False):
    end = time.perf_counter() + seconds
    counts = [0, 0]
    ids = [set(), set()]
    while time.perf_counter() < end:
        if not fresh_code:
            counts[0] += compress_block(time.perf_counter() + SLICE)
            counts[1] += hash_block(time.perf_counter() + SLICE)
            continue
        for i, (name, work, data) in enumerate(
            (("compress_block", zlib.compress, ZDATA), ("hash_block", hashlib.sha256, HDATA))
        ):
            f = fresh(name, work, data)
            ids[i].add(id(f.__code__))
            counts[i] += f(time.perf_counter() + SLICE)
            del f
    if fresh_code:
        print("fresh code objects: %d, addresses shared by both functions: %d"
              % (len(ids[0]) + len(ids[1]), len(ids[0] & ids[1])), flush=True)
    return counts


def worker(seconds, q, fresh_code):
    counts = alternate(seconds, fresh_code)
    if q is not None:
        q.put(counts)


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    threaded = len(sys.argv) > 3 and sys.argv[3] == "1"
    fresh_code = len(sys.argv) > 4 and sys.argv[4] == "1"
    ctx = mp.get_context("fork")
    q = ctx.Queue() if threaded else None
    procs = [ctx.Process(target=worker, args=(seconds, q, fresh_code)) for _ in range(workers)]
    for p in procs:
        p.start()
    counts = alternate(seconds, fresh_code)
    if q is not None:
        for _ in procs:
            q.get()
    for p in procs:
        p.join()
        assert p.exitcode == 0, p.exitcode
    print("alternate: zlib calls %d, sha256 calls %d" % tuple(counts))


if __name__ == "__main__":
    main()
