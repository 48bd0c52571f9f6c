"""Call-heavy pure Python for overhead benchmarks: recursive fib(N), ROUNDS
times; prints its own elapsed and CPU time ("fib in X s (cpu Y s)"):
its CPU time is what the in-process agent adds to, whatever else runs on
the machine.

    fib_job.py [N] [ROUNDS]
"""
import sys
import time


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


n = int(sys.argv[1]) if len(sys.argv) > 1 else 27
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 10
t, c = time.perf_counter(), time.process_time()
for _ in range(rounds):
    fib(n)
print(
    f"fib in {time.perf_counter() - t:.3f} s (cpu {time.process_time() - c:.3f} s)",
    flush=True,
)
