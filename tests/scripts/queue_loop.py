"""A single-process training loop that waits: for batches from a queue fed
by a slow producer thread (``batch``), or in a stand-in for GPU
synchronization (``sync``). Logs its own time waiting and its loop's time.

    python queue_loop.py batch|sync OUT_JSON [SECONDS]
"""

import json
import os
import queue
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin"))
import torch.cuda  # noqa: E402  (the stand-in)


def produce(q, stop):
    while not stop.is_set():
        time.sleep(0.03)  # a slow input pipeline, off the GIL
        q.put(b"x" * 1024)


def compute(ms):
    end = time.thread_time() + ms / 1000.0
    x = 0
    while time.thread_time() < end:
        x += 1
    return x


def main():
    mode, out = sys.argv[1], sys.argv[2]
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 3.0
    q, stop = queue.Queue(maxsize=2), threading.Event()
    threading.Thread(target=produce, args=(q, stop), daemon=True).start()
    waited = 0.0
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        t0 = time.monotonic()
        if mode == "batch":
            q.get()
        else:
            torch.cuda.synchronize(0.02)
        waited += time.monotonic() - t0
        compute(5)
    loop = time.monotonic() - start
    stop.set()
    with open(out, "w") as f:
        json.dump({"waited_s": waited, "loop_s": loop}, f)


if __name__ == "__main__":
    main()
