"""A real PyTorch training loop without NVTX or a GPU, for the step
estimate from stacks: a small conv net, fed by a DataLoader whose two
workers spend CPU on each batch, so that batches arrive unevenly
(one waited for, the next ready). Prints the number of steps it ran.

Usage: torch_train.py [steps] [workers]
"""
import sys
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


def busy(ms):
    end = time.thread_time() + ms / 1000.0
    acc = 0
    while time.thread_time() < end:
        acc = (acc * 1103515245 + 12345) & 0x7FFFFFFF
    return acc


class Batches(Dataset):
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        busy(6)
        g = torch.Generator().manual_seed(i)
        return torch.rand(3, 64, 64, generator=g), i % 10


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    torch.set_num_threads(1)
    torch.manual_seed(0)
    # The backward pass takes 34-60 ms of CPU here (median 46): three
    # samples or more at 99 Hz, so no step goes unsampled. With 32 channels
    # (17-36 ms) a CI run missed 5 of 40 backward passes, and the step rule
    # rightly refused the function.
    net = nn.Sequential(
        nn.Conv2d(3, 48, 3, padding=1), nn.ReLU(),
        nn.Conv2d(48, 48, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(768, 10),
    )
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loader = DataLoader(Batches(), batch_size=8, num_workers=workers)
    done = 0
    for x, y in loader:
        loss = nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        # Metrics and logging, between two backward passes: at least two
        # samples outside them, so that no two run together.
        busy(25)
        done += 1
        if done == steps:
            break
    print(f"steps: {done}", file=sys.stderr)


if __name__ == "__main__":
    main()
