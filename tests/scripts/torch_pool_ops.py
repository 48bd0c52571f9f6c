"""Two operators that PyTorch's intra-op pool (two threads) works for,
alternating, each called from its own Python function: matrix products
(BLAS `sgemm` on the pool) and an element-wise sigmoid (ATen's
`TensorIterator` loops on the pool). A pool thread's sample tells by its
native leaf which operator it worked for: the ground truth for where the
Python view places it.

A fixed number of rounds, not seconds: the pool's samples (on CPU time)
are as many on a loaded machine as on an idle one. Each phase lasts
PHASE_CPU_S of the process's CPU time, whatever the machine's speed (one
512x512 product is ~1 ms on a recent core): placement is by time, so a
phase much shorter than the 10 ms sampling period has no ground truth to
check it against.

The pool waits passively between regions (`OMP_WAIT_POLICY=PASSIVE`, set
before torch loads its OpenMP runtime): a spinning pool thread's samples
tell no operator, and under load the spinning took three quarters of the
pool's samples and of the process CPU time the phases are measured in,
leaving ~50 samples that tell their operator instead of ~170. Passive,
the count is the same on a loaded machine as on an idle one.

Usage: torch_pool_ops.py [rounds]
"""
import os
import sys
import time

os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

import torch  # noqa: E402  (after the OpenMP setting it reads at load)


def products(a, b, n):
    for _ in range(n):
        a @ b


def sigmoids(x, n):
    for _ in range(n):
        torch.sigmoid(x)


PHASE_CPU_S = 0.2


def calls_per_phase(op):
    """How many calls of `op` take PHASE_CPU_S of process CPU time (both
    pool threads), measured here: CPU time, so a loaded machine gives the
    same count."""
    op()
    n, t0 = 0, time.process_time()
    while time.process_time() - t0 < 0.05:
        op()
        n += 1
    per_call = (time.process_time() - t0) / n
    return max(1, round(PHASE_CPU_S / per_call))


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    torch.set_num_threads(2)
    a, b = torch.rand(512, 512), torch.rand(512, 512)
    x = torch.rand(1 << 20)
    n_products = calls_per_phase(lambda: a @ b)
    n_sigmoids = calls_per_phase(lambda: torch.sigmoid(x))
    for _ in range(rounds):
        products(a, b, n_products)
        sigmoids(x, n_sigmoids)


if __name__ == "__main__":
    main()
