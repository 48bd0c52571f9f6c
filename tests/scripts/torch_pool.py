"""A conv net trained on the CPU with two intra-op threads and no
DataLoader: PyTorch's OpenMP pool runs the convolutions that
`Conv2d.forward` and `Tensor.backward` on the main thread ask for.

It trains until the process has spent CPU_SECONDS of CPU time (both pool
threads) in the loop, not for a number of steps: a step is ~7 ms on a
recent core and ~50 ms on an old one, and the pool's samples (on CPU
time) should be as many on either, loaded or not.

Usage: torch_pool.py [cpu_seconds] [threads]
"""
import sys
import time

import torch
import torch.nn as nn


def main():
    cpu_s = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(512, 10),
    )
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x = torch.rand(8, 3, 32, 32)
    y = torch.randint(0, 10, (8,))
    steps, t0 = 0, time.process_time()
    while steps == 0 or time.process_time() - t0 < cpu_s:
        loss = nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
    print(steps)


if __name__ == "__main__":
    main()
