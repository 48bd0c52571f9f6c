#!/usr/bin/env python3
"""Data-parallel training with real torch.distributed, for checking how
gpuprof sees ranks, their DataLoader workers and a straggler.

Run it under torchrun, e.g.

    torchrun --nproc-per-node 2 samples/train_ddp.py --slow-rank 1

Every rank trains a small model on random images fed by a DataLoader whose
workers spend ``--augment-ms`` of CPU per sample (``--slow-factor`` times
more on ``--slow-rank``), and averages its gradients with one
``dist.all_reduce`` per step: the ranks that are ready first wait in the
all-reduce for the slow one. The backend is gloo (CPU) unless CUDA is
available and ``--backend nccl`` is given. No dataset, no internet.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
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
        img = torch.rand(3, 16, 16, generator=g)
        # CPU-bound "augmentation": elementwise work until the budget is spent.
        end = time.thread_time() + self.augment_ms / 1000.0
        while time.thread_time() < end:
            img = (img * 1.0001 + 0.0001).clamp_(0, 1)
        return img, i % 10


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--augment-ms", type=float, default=1.0, help="CPU ms per sample in the workers")
    ap.add_argument("--slow-rank", type=int, default=-1, help="rank whose input pipeline is slower")
    ap.add_argument("--slow-factor", type=float, default=8.0, help="how much more CPU per sample the slow rank spends")
    ap.add_argument("--backend", default="gloo")
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    augment = args.augment_ms * (args.slow_factor if rank == args.slow_rank else 1.0)
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if args.backend == "nccl" else torch.device("cpu")

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 64), nn.ReLU(), nn.Linear(64, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    data = RandomImages(args.steps * args.batch, augment)
    loader = DataLoader(data, batch_size=args.batch, num_workers=args.workers,
                        persistent_workers=args.workers > 0)
    params = [p for p in model.parameters()]
    start = time.monotonic()
    steps = 0
    for x, y in loader:
        x, y = x.to(dev), y.to(dev)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        # Average the gradients across ranks: one all-reduce per step.
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        flat /= world
        off = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[off:off + n].view_as(p))
            off += n
        opt.step()
        steps += 1
    el = time.monotonic() - start
    print(f"rank {rank}/{world}: {steps} steps in {el:.1f} s ({steps / el:.1f} steps/s), "
          f"augment {augment:.1f} ms/sample, loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
