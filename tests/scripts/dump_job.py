"""A job of two processes, each blocked in a function of its own, for
`gpuprof dump`: the parent sleeps, the child waits on a pipe whose write
end only the parent holds (so the child ends when the parent does)."""

import os
import sys
import time


def child_waits(r):
    os.read(r, 1)


def parent_waits():
    time.sleep(120)


def main():
    r, w = os.pipe()
    if os.fork() == 0:
        os.close(w)
        child_waits(r)
        os._exit(0)
    os.close(r)
    print("ready", flush=True)
    parent_waits()


if __name__ == "__main__":
    sys.exit(main())
