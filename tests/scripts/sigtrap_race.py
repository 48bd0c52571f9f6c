"""The job rewrites its SIGTRAP disposition in a tight loop while its
threads raise SIGTRAPs and compute (sigtrap_race.c, built by the test).

    sigtrap_race.py LIB.so SECONDS

Prints the counts and exits 0 when every SIGTRAP a thread raised at itself
reached the job's handler exactly once, the writer's own were handled,
nothing came back torn, and a handler installed with SA_RESETHAND and a
sa_mask ran once, with its mask, and left SIG_DFL behind.
"""
import ctypes
import sys
import threading
import time


def burn(stop):
    n = 0
    while not stop.is_set():
        n += sum(range(300))


def main():
    lib = ctypes.CDLL(sys.argv[1])
    ms = int(float(sys.argv[2]) * 1000)
    stop = threading.Event()
    # Python threads computing beside the race: sampled with their frames.
    burners = [threading.Thread(target=burn, args=(stop,)) for _ in range(2)]
    for t in burners:
        t.start()
    out = (ctypes.c_long * 8)()
    rc = lib.race(ms, out)
    stop.set()
    for t in burners:
        t.join()
    raised, handled, sent_w, handled_w, bad, swaps = out[:6]
    print(f"raised {raised} handled {handled} sent to writer {sent_w} handled there {handled_w} bad {bad} swaps {swaps}")
    if rc != 0:
        sys.exit("threads could not start")
    if bad or raised != handled or raised < 100 or swaps < 1000:
        sys.exit("the job's SIGTRAPs did not all reach its handlers whole")
    # A thread's pending SIGTRAPs merge: at least one, at most each.
    if not 0 < handled_w <= sent_w:
        sys.exit("the writer's SIGTRAPs were not handled")
    # SA_RESETHAND and sa_mask, as the kernel honours them.
    bad = lib.flags()
    if bad:
        sys.exit(f"the job's SA_RESETHAND/sa_mask handler was not called as installed (bits {bad:#x})")
    print("race ok")


if __name__ == "__main__":
    main()
