"""A PyTorch training loop marked with NVTX, for tests/nvtx.rs.

Each step is one `train_step` range (forward/backward inside); batches come
from a DataLoader with forked workers whose `__getitem__` is an NVTX range
too. Every SLOW_EVERY-th step also saves a checkpoint (written and synced to
disk), which makes that step slow.

    python nvtx_steps.py STEPS SLOW_EVERY CKPT_DIR
"""
import os
import sys
import time

import torch
import torch.cuda.nvtx as nvtx
from torch.utils.data import DataLoader, Dataset

steps, slow_every, ckpt_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]


class Samples(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        nvtx.range_push("load sample")
        x = torch.full((64,), float(i % 7))
        nvtx.range_pop()
        return x


def save_checkpoint(state, path):
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def main():
    torch.manual_seed(0)
    w = torch.randn(64, 64, requires_grad=True)
    big = {"weights": torch.randn(24 * 1024 * 1024 // 4 * 4)}  # ~96 MB
    loader = DataLoader(Samples(), batch_size=8, num_workers=2)
    it = iter(loader)
    for i in range(steps):
        batch = next(it)
        nvtx.range_push("train_step")
        nvtx.range_push("forward")
        loss = (batch @ w).pow(2).mean()
        time.sleep(0.06)
        nvtx.range_pop()
        nvtx.range_push("backward")
        loss.backward()
        time.sleep(0.04)
        nvtx.range_pop()
        if i % slow_every == slow_every - 1:
            nvtx.range_push("save_checkpoint")
            save_checkpoint(big, os.path.join(ckpt_dir, "ckpt.pt"))
            nvtx.range_pop()
        nvtx.range_pop()
    print(f"{steps} steps done", flush=True)


if __name__ == "__main__":
    main()
