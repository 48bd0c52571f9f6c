#!/usr/bin/env python3
"""A small real CUDA training job for checking gpuprof on a GPU machine.

A few hundred steps of a small conv net on random images, fed by a PyTorch
DataLoader whose workers spend ``--augment-ms`` of CPU per sample on a
simulated augmentation. With ``--workers 1`` the GPU waits for data; with
``--workers 4`` it should not. Needs PyTorch with CUDA; no dataset, no
internet. Used by scripts/device-check.sh.
"""

import argparse
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class RandomImages(Dataset):
    def __init__(self, n, augment_ms):
        self.n = n
        self.augment_ms = augment_ms

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        img = torch.rand(3, 64, 64, generator=g)
        # CPU-bound "augmentation": elementwise work until the budget is spent.
        end = time.thread_time() + self.augment_ms / 1000.0
        while time.thread_time() < end:
            img = (img * 1.0001 + 0.0001).clamp_(0, 1)
        return img, i % 10


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--augment-ms", type=float, default=1.0, help="CPU ms per sample in the workers")
    ap.add_argument("--gpu-time", action="store_true",
                    help="time each step on the GPU with CUDA events and print the GPU's busy and idle seconds "
                         "(the truth scripts/device-check.sh compares gpuprof's idle time with)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("train_torch.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    dev = torch.device("cuda")
    torch.set_num_threads(1)
    model = nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(),
        nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(128, 256, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10),
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    data = RandomImages(args.steps * args.batch, args.augment_ms)
    loader = DataLoader(data, batch_size=args.batch, num_workers=args.workers,
                        pin_memory=True, persistent_workers=args.workers > 0)
    events = []
    start = time.monotonic()
    steps = 0
    for x, y in loader:
        if args.gpu_time:
            ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            ev[0].record()
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if args.gpu_time:
            ev[1].record()
            events.append(ev)
        steps += 1
    torch.cuda.synchronize()
    el = time.monotonic() - start
    print(f"{steps} steps in {el:.1f} s ({steps / el:.1f} steps/s) with {args.workers} workers, loss {loss.item():.3f}", flush=True)
    if args.gpu_time:
        # From each step's first to its last GPU operation: an upper bound
        # of its busy time (gaps between its own kernels are counted busy).
        busy = sum(a.elapsed_time(b) for a, b in events) / 1000.0
        print(f"GPU busy {busy:.2f} s of the {el:.2f} s training loop: idle {el - busy:.2f} s (CUDA events)", flush=True)


if __name__ == "__main__":
    main()
