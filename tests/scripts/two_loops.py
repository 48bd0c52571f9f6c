"""One function with two hot loops on known lines: the first does 70% of
the work, the second 30% (the same work per iteration), for SECONDS of
this thread's CPU time. Line-number tests (issue 33) check the per-line
shares of the samples in work(). One round of both loops takes ~100 ms
of CPU, many sampling periods: a shorter one, near the sampling period,
aliases with it (measured: 62-76% for loop A at 2 ms rounds).

    two_loops.py SECONDS
"""
import sys
import time


def work(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        for _ in range(700): a = sum(range(10000))  # LOOP_A
        for _ in range(300): b = sum(range(10000))  # LOOP_B
    return a + b


if __name__ == "__main__":
    work(float(sys.argv[1]))
