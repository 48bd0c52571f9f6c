"""DDP (gloo on CPU) whose rank 1 gets its batches more slowly: rank 0 waits
for it in DDP's gradient all-reduce, inside ``loss.backward()``. Each rank
logs its own time inside ``backward`` and in its loop, for the test to
compare with gpuprof's figures.

    torchrun --nproc-per-node 2 ddp_waits.py OUT_DIR [STEPS]
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __init__(self, n, delay):
        self.n, self.delay = n, delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        # The input pipeline's cost, without taking a core from the job.
        time.sleep(self.delay)
        return torch.rand(16), i % 4


def main():
    out, steps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    delay = 0.1 if rank == 1 else 0.002
    model = DDP(nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Slow(steps, delay), batch_size=1, num_workers=1)
    backward = 0.0
    first = None
    for n, (x, y) in enumerate(loader):
        loss = nn.functional.cross_entropy(model(x), y)
        t0 = time.monotonic()
        loss.backward()
        t1 = time.monotonic()
        opt.step()
        opt.zero_grad()
        if first is None:
            # Steady state from the end of the first step (its all-reduce
            # absorbs the ranks' start-up skew).
            first = time.monotonic()
        else:
            backward += t1 - t0
    loop = time.monotonic() - first
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"backward_s": backward, "loop_s": loop, "steps": steps}, f)
    print(f"rank {rank}: backward {backward:.2f} s of {loop:.2f} s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
