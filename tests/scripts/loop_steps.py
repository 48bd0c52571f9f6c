"""A CPU-bound training-like loop without NVTX, for tests/nvtx.rs: each
step loads a batch (`load_batch`) and then computes on it (`train_step`),
so the loop's period shows in the main thread's stacks.

    python loop_steps.py STEPS
"""
import sys
import time


def spin(seconds):
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1
    return x


def load_batch():
    return spin(0.02)


def train_step(batch):
    return spin(0.05) + batch


def main():
    steps = int(sys.argv[1])
    t0 = time.perf_counter()
    for _ in range(steps):
        train_step(load_batch())
    dt = time.perf_counter() - t0
    print(f"{steps} steps in {dt:.2f} s: {steps / dt:.2f} steps/s", flush=True)


main()
