#!/usr/bin/env python3
"""A simulated training loop, pure Python (no third-party packages).

Workers (``--workers N``, multiprocessing, like a PyTorch DataLoader) build
batches with ``--augment-ms`` of CPU work each (optionally reading
``--read-mb`` from a data file); the main loop takes a batch and then spends
``--gpu-ms`` "on the GPU" (sleeping, as a host thread does while it waits for
kernels). With ``--workers 0`` the batches are built in the main process.

Prints steps/s at the end. Exits 130 after a clean shutdown on Ctrl-C.
"""

import argparse
import ctypes
import multiprocessing as mp
import os
import signal
import sys
import time


def set_thread_name(name):
    """Name the calling thread like PyTorch names its DataLoader workers."""
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def augment(sample, ms):
    """CPU-bound 'augmentation': arithmetic until `ms` of CPU time is spent."""
    end = time.thread_time() + ms / 1000.0
    acc = sample
    while time.thread_time() < end:
        for i in range(200):
            acc = (acc * 1103515245 + 12345 + i) & 0x7FFFFFFF
    return acc


def read_chunk(path, mb, offset_mb):
    """Read `mb` MiB from the data file, wrapping around its end."""
    if not path or mb <= 0:
        return 0
    size = os.path.getsize(path)
    want = int(mb * 1024 * 1024)
    got = 0
    with open(path, "rb", buffering=0) as f:
        pos = int(offset_mb * 1024 * 1024) % max(size, 1)
        f.seek(pos)
        while got < want:
            buf = f.read(min(1 << 20, want - got))
            if not buf:
                f.seek(0)
                continue
            got += len(buf)
    return got


def make_batch(index, args):
    read_chunk(args.data, args.read_mb, index * args.read_mb)
    return augment(index, args.augment_ms)


def worker_loop(wid, args, tasks, results):
    set_thread_name("pt_data_worker")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process handles Ctrl-C
    while True:
        index = tasks.get()
        if index is None:
            return
        results.put((index, make_batch(index, args)))


def gpu_step(args, log):
    """Stand-in for a training step on the GPU: the host waits `--gpu-ms`.

    With an activity log, the step's start is written before it runs and its
    end after, so a reader (the fake NVML of tests/fake-nvml) knows a step is
    in progress as soon as it starts, like a driver knows a kernel runs."""
    if log is not None:
        log.write(f"B {os.getpid()} {time.clock_gettime_ns(time.CLOCK_MONOTONIC)}\n")
    time.sleep(args.gpu_ms / 1000.0)
    if log is not None:
        log.write(f"E {os.getpid()} {time.clock_gettime_ns(time.CLOCK_MONOTONIC)}\n")


def open_activity_log(args):
    path = args.activity_log or os.environ.get("GPUPROF_ACTIVITY_LOG")
    if not path:
        return None
    # Line-buffered: each line reaches the file when it is complete.
    f = open(path, "a", buffering=1)
    f.write("# gpuprof activity log: B|E PID CLOCK_MONOTONIC-ns (simulated GPU step begins|ends)\n")
    return f


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2, help="input worker processes (0 = build batches in the main process)")
    ap.add_argument("--augment-ms", type=float, default=10.0, help="CPU ms of augmentation per batch")
    ap.add_argument("--gpu-ms", type=float, default=20.0, help="simulated GPU ms per step")
    ap.add_argument("--steps", type=int, default=100, help="training steps")
    ap.add_argument("--read-mb", type=float, default=0.0, help="MiB each batch reads from --data")
    ap.add_argument("--data", default=None, help="data file read by --read-mb (created, 64 MiB, if missing)")
    ap.add_argument("--prefetch", type=int, default=2, help="batches queued per worker")
    ap.add_argument("--activity-log", default=None, help="append the begin/end of each simulated GPU step (CLOCK_MONOTONIC ns) to this file (also $GPUPROF_ACTIVITY_LOG); format in docs/testing.md")
    args = ap.parse_args()

    if args.read_mb > 0 and not args.data:
        ap.error("--read-mb needs --data FILE")
    if args.data and not os.path.exists(args.data):
        with open(args.data, "wb") as f:
            for _ in range(64):
                f.write(os.urandom(1 << 20))

    interrupted = False

    def on_sigint(signum, frame):
        nonlocal interrupted
        interrupted = True

    signal.signal(signal.SIGINT, on_sigint)
    log = open_activity_log(args)
    start = time.monotonic()
    done = 0
    if args.workers == 0:
        for step in range(args.steps):
            if interrupted:
                break
            make_batch(step, args)
            gpu_step(args, log)
            done += 1
    else:
        ctx = mp.get_context("fork")
        tasks, results = ctx.Queue(), ctx.Queue()
        procs = [ctx.Process(target=worker_loop, args=(i, args, tasks, results), daemon=True) for i in range(args.workers)]
        for p in procs:
            p.start()
        queued = 0
        for _ in range(min(args.steps, args.workers * args.prefetch)):
            tasks.put(queued)
            queued += 1
        for step in range(args.steps):
            if interrupted:
                break
            results.get()
            if queued < args.steps:
                tasks.put(queued)
                queued += 1
            gpu_step(args, log)
            done += 1
        for _ in procs:
            tasks.put(None)
        for p in procs:
            p.join(timeout=5)
    elapsed = time.monotonic() - start
    print(f"{done} steps in {elapsed:.2f} s: {done / elapsed if elapsed > 0 else 0:.2f} steps/s", flush=True)
    if interrupted:
        print("interrupted: stopped cleanly", flush=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
