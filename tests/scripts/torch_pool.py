"""A conv net trained on the CPU with two intra-op threads and no
DataLoader: PyTorch's OpenMP pool runs the convolutions that
`Conv2d.forward` and `Tensor.backward` on the main thread ask for.

Usage: torch_pool.py [steps] [threads]
"""
import sys

import torch
import torch.nn as nn


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
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
    for _ in range(steps):
        loss = nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(steps)


if __name__ == "__main__":
    main()
