"""Two operators that PyTorch's intra-op pool (two threads) works for,
alternating, each called from its own Python function: matrix products
(BLAS `sgemm` on the pool) and an element-wise sigmoid (ATen's
`TensorIterator` loops on the pool). A pool thread's sample tells by its
native leaf which operator it worked for: the ground truth for where the
Python view places it.

A fixed number of rounds, not seconds: the pool's samples (on CPU time)
are as many on a loaded machine as on an idle one.

Usage: torch_pool_ops.py [rounds]
"""
import sys

import torch


def products(a, b, n):
    for _ in range(n):
        a @ b


def sigmoids(x, n):
    for _ in range(n):
        torch.sigmoid(x)


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    torch.set_num_threads(2)
    a, b = torch.rand(512, 512), torch.rand(512, 512)
    x = torch.rand(1 << 20)
    for _ in range(rounds):
        products(a, b, 5)
        sigmoids(x, 40)


if __name__ == "__main__":
    main()
