"""A pure-Python CPU-bound job (no native leaf work): unwinding coverage."""
import sys
import time


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 1.5
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        fib(18)


main()
