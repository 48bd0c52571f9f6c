#!/usr/bin/env python3
"""A simulated training loop, pure Python (no third-party packages).

Workers (``--workers N``, multiprocessing, like a PyTorch DataLoader) build
batches with ``--augment-ms`` of CPU work each (optionally reading
``--read-mb`` from a data file); the main loop takes a batch and then spends
``--gpu-ms`` "on the GPU" (sleeping, as a host thread does while it waits for
kernels). With ``--workers 0`` the batches are built in the main process.

What the training loop itself does between steps: ``--loop-ms`` of Python
CPU work per step (metrics, logging), ``--wait-ms`` of waiting for something
outside the job, ``--checkpoint-every``/``--checkpoint-mb``
a checkpoint written (and fsync'ed) from the loop. ``--epochs`` splits the
steps into epochs; like a PyTorch DataLoader without ``persistent_workers``
the workers are started anew each epoch (each spending ``--worker-start-ms``
of CPU getting ready, like imports and dataset set-up) unless
``--persistent-workers``.

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


def augment_fixed(sample, iters):
    """The same arithmetic a fixed number of times: a real decoder's fixed
    work, which any CPU taken from the worker (a profiler's signal handler,
    the kernel's sampling) makes take longer, where `augment` would absorb
    it in its CPU-time budget."""
    acc = sample
    for _ in range(iters):
        for i in range(200):
            acc = (acc * 1103515245 + 12345 + i) & 0x7FFFFFFF
    return acc


def make_batch(index, args):
    read_chunk(args.data, args.read_mb, index * args.read_mb)
    if args.augment_iters > 0:
        return augment_fixed(index, args.augment_iters)
    return augment(index, args.augment_ms)


def worker_init(ms):
    """A worker getting ready: imports, opening the dataset."""
    augment(0, ms)


def die_with_parent(parent):
    """Exit when the main process dies (killed, or OOM-killed in a memory
    limit) instead of waiting on its queue forever, like PyTorch's workers."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)


def worker_loop(wid, args, tasks, results, parent):
    set_thread_name("pt_data_worker")
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process handles Ctrl-C
    worker_init(args.worker_start_ms)
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


def compute_metrics(step, ms):
    """Host-side work of the training loop itself: metrics, logging."""
    return augment(step, ms)


def log_step(step, ms):
    if ms > 0:
        compute_metrics(step, ms)


def wait_for_peer(ms):
    """The loop waits for something outside the job's CPU work: a remote
    service, a lock held elsewhere, another rank."""
    time.sleep(ms / 1000.0)


def save_checkpoint(args, step):
    """Write a checkpoint from the training loop and wait for it to reach the disk."""
    path = os.path.join(args.checkpoint_dir, "checkpoint.bin")
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for _ in range(int(args.checkpoint_mb)):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())


def touch_memory(buf, step, mb):
    """The loop reads and writes `mb` MiB of its host memory each step, in
    turn through all of it (a replay buffer, an in-memory dataset): pages
    swapped out must come back."""
    n = len(buf)
    want = n if mb <= 0 else min(n, int(mb * 1024 * 1024))
    start = (step * want) % n
    for k in range(0, want, 4096):
        i = (start + k) % n
        buf[i] = (buf[i] + 1) & 0xFF


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
    ap.add_argument("--augment-iters", type=int, default=0, help="fixed augmentation work per batch instead of --augment-ms (iterations of 200 operations; ~0.02 ms each on a 2026 VM core with Python 3.11)")
    ap.add_argument("--gpu-ms", type=float, default=20.0, help="simulated GPU ms per step")
    ap.add_argument("--steps", type=int, default=100, help="training steps")
    ap.add_argument("--read-mb", type=float, default=0.0, help="MiB each batch reads from --data")
    ap.add_argument("--data", default=None, help="data file read by --read-mb (created, 64 MiB, if missing)")
    ap.add_argument("--prefetch", type=int, default=2, help="batches queued per worker")
    ap.add_argument("--loop-ms", type=float, default=0.0, help="CPU ms of Python work in the training loop per step (metrics, logging)")
    ap.add_argument("--wait-ms", type=float, default=0.0, help="ms the training loop waits per step for something outside the job (sleeping)")
    ap.add_argument("--hold-mb", type=float, default=0.0, help="MiB of host memory the training loop holds")
    ap.add_argument("--touch-mb", type=float, default=0.0, help="MiB of the held memory touched each step, in turn through all of it (0: all)")
    ap.add_argument("--epochs", type=int, default=1, help="split the steps into this many epochs")
    ap.add_argument("--persistent-workers", action="store_true", help="keep the workers across epochs (else they are started anew each epoch)")
    ap.add_argument("--worker-start-ms", type=float, default=0.0, help="CPU ms a worker spends getting ready when it starts")
    ap.add_argument("--checkpoint-every", type=int, default=0, help="write a checkpoint every N steps (0: never)")
    ap.add_argument("--checkpoint-mb", type=float, default=16.0, help="MiB per checkpoint")
    ap.add_argument("--checkpoint-dir", default=".", help="where checkpoints are written")
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
    held = bytearray(int(args.hold_mb * 1024 * 1024)) if args.hold_mb > 0 else None

    def after_step(step):
        log_step(step, args.loop_ms)
        if held is not None:
            touch_memory(held, step, args.touch_mb)
        if args.wait_ms > 0:
            wait_for_peer(args.wait_ms)
        if args.checkpoint_every > 0 and (step + 1) % args.checkpoint_every == 0:
            save_checkpoint(args, step)

    if args.workers == 0:
        for step in range(args.steps):
            if interrupted:
                break
            make_batch(step, args)
            gpu_step(args, log)
            after_step(step)
            done += 1
    else:
        ctx = mp.get_context("fork")
        epochs = max(1, args.epochs)
        per_epoch = [args.steps // epochs + (1 if e < args.steps % epochs else 0) for e in range(epochs)]
        procs = []
        tasks = results = None
        step = 0

        def start_workers():
            t, r = ctx.Queue(), ctx.Queue()
            ps = [ctx.Process(target=worker_loop, args=(i, args, t, r, os.getpid()), daemon=True) for i in range(args.workers)]
            for p in ps:
                p.start()
            return t, r, ps

        def stop_workers(t, ps):
            for _ in ps:
                t.put(None)
            for p in ps:
                p.join(timeout=5)

        for epoch, n in enumerate(per_epoch):
            if interrupted:
                break
            if tasks is None or not args.persistent_workers:
                if tasks is not None:
                    stop_workers(tasks, procs)
                tasks, results, procs = start_workers()
            first, last = step, step + n
            queued = first
            for _ in range(min(n, args.workers * args.prefetch)):
                tasks.put(queued)
                queued += 1
            for _ in range(n):
                if interrupted:
                    break
                results.get()
                if queued < last:
                    tasks.put(queued)
                    queued += 1
                gpu_step(args, log)
                after_step(step)
                step += 1
                done += 1
        if tasks is not None:
            stop_workers(tasks, procs)
    elapsed = time.monotonic() - start
    print(f"{done} steps in {elapsed:.2f} s: {done / elapsed if elapsed > 0 else 0:.2f} steps/s", flush=True)
    if args.augment_iters > 0:
        # Fixed work: its CPU time says what else ran in the job's threads
        # (the workers were joined, so their CPU is in the children's).
        t = os.times()
        cpu = t.user + t.system + t.children_user + t.children_system
        print(f"cpu {cpu:.3f} s (this process and its workers)", flush=True)
    if interrupted:
        print("interrupted: stopped cleanly", flush=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
