"""A loop whose process has a pure-Python thread that keeps the GIL: the
loop waits for the interpreter lock each time it comes back from a
blocking call.

    python gil_job.py [SECONDS]
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
    stop = threading.Event()
    threading.Thread(target=spin_in_python, args=(stop,), daemon=True).start()
    start = time.monotonic()
    steps = 0
    while time.monotonic() - start < seconds:
        time.sleep(0.001)  # stands for a call that releases the GIL
        steps += 1
    stop.set()
    print(f"{steps} steps", flush=True)


if __name__ == "__main__":
    main()
