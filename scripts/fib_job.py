"""Call-heavy pure Python for overhead benchmarks: recursive fib(N), ROUNDS
times; prints its own elapsed time ("fib in X s").

    fib_job.py [N] [ROUNDS]
"""
import sys
import time


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


n = int(sys.argv[1]) if len(sys.argv) > 1 else 27
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 10
t = time.perf_counter()
for _ in range(rounds):
    fib(n)
print(f"fib in {time.perf_counter() - t:.3f} s", flush=True)
