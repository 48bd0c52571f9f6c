"""A loop whose process has a pure-Python thread that keeps the GIL: the
loop waits for the interpreter lock each time it comes back from a
blocking call.

    python gil_job.py [SECONDS] [DELAY]

With DELAY, the spinning thread starts after DELAY seconds of the loop
(after a profiler has first listed the process's threads).
"""

import sys
import threading
import time


def spin_in_python(stop):
    x = 0
    while not stop.is_set():
        x += 1  # pure Python: holds the GIL but for the switch interval


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    delay = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    stop = threading.Event()
    spinner = threading.Thread(target=spin_in_python, args=(stop,), daemon=True)
    if delay <= 0:
        spinner.start()
    start = time.monotonic()
    steps = 0
    while time.monotonic() - start < seconds:
        if delay > 0 and not spinner.is_alive() and time.monotonic() - start >= delay:
            spinner.start()
        time.sleep(0.001)  # stands for a call that releases the GIL
        steps += 1
    stop.set()
    print(f"{steps} steps", flush=True)


if __name__ == "__main__":
    main()
