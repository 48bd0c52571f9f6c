"""A loop that blocks every step in nested Python calls, for the wall-clock
sampler's two readers of Python frames (the agent's layout and py-spy) to
read the same blocked frames:

- a method and a nested function (qualified names), and a function whose
  name is not ASCII (a Latin-1 string);
- functions compiled anew each step from one of two sources, whose code
  objects are freed and often reborn at the address of the other one;
- with THREADS > 0, that many helper threads blocked in a condition wait,
  started 0.4 s into the loop: after a reader first walked the
  interpreter's thread list, so that it must notice threads started later.

    python blocked_frames.py [SECONDS] [THREADS]
"""

import sys
import threading
import time

SOURCES = [
    "def fresh_a(wait):\n    wait(0.003)\n",
    "def fresh_b(wait):\n    wait(0.003)\n",
]


class Loader:
    def next_batch(self):
        def wait_for_it():
            time.sleep(0.004)

        wait_for_it()


def wärte():
    time.sleep(0.002)


def helper(cond, stop):
    def idle():
        with cond:
            cond.wait(0.05)

    while not stop.is_set():
        idle()


def step(i, loader):
    loader.next_batch()
    wärte()
    ns = {}
    exec(compile(SOURCES[i % 2], f"<fresh {i % 2}>", "exec"), ns)
    ns["fresh_a" if i % 2 == 0 else "fresh_b"](time.sleep)
    x = 0
    for k in range(2000):  # a little CPU between the waits
        x += k
    return x


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    stop = threading.Event()
    cond = threading.Condition()
    helpers = [threading.Thread(target=helper, args=(cond, stop)) for _ in range(threads)]
    loader = Loader()
    start = time.monotonic()
    i, started = 0, False
    while time.monotonic() - start < seconds:
        if not started and time.monotonic() - start >= 0.4:
            for t in helpers:
                t.start()
            started = True
        step(i, loader)
        i += 1
    stop.set()
    for t in helpers:
        t.join()
    print(f"{i} steps", flush=True)


if __name__ == "__main__":
    main()
