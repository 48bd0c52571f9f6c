#!/usr/bin/env python3
"""A real PyTorch DataLoader job with Pillow transforms, on the CPU: the
benchmark's fourth job (scripts/bench-pystacks.sh, JOBS=torch).

Each sample is a JPEG made once at start, decoded by Pillow, randomly
cropped, resized, flipped and colour-adjusted (ImageEnhance), converted to
a tensor; a small conv net trains on the batches in the main process with
one intra-op thread, as a GPU job's loop would leave the CPU to its
workers. No torchvision, no dataset, no network.

Prints "N steps in S s" (the loop's own time) and "cpu C s" (the whole
job's CPU time, children included), as samples/train_sim.py does.

Usage: torch_pillow_job.py [STEPS] [WORKERS]
"""
import io
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn as nn
from PIL import Image, ImageEnhance
from torch.utils.data import DataLoader, Dataset


def make_jpegs(n, size=160):
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        a = (rng.random((size, size, 3)) * 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


class Jpegs(Dataset):
    def __init__(self, blobs, n):
        self.blobs = blobs
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rnd = random.Random(i)
        img = Image.open(io.BytesIO(self.blobs[i % len(self.blobs)])).convert("RGB")
        w, h = img.size
        s = rnd.randint(w // 2, w)
        x, y = rnd.randint(0, w - s), rnd.randint(0, h - s)
        img = img.crop((x, y, x + s, y + s)).resize((64, 64), Image.BILINEAR)
        if rnd.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        img = ImageEnhance.Color(img).enhance(rnd.uniform(0.6, 1.4))
        img = ImageEnhance.Contrast(img).enhance(rnd.uniform(0.6, 1.4))
        t = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)
        return t, i % 10


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    torch.set_num_threads(1)
    torch.manual_seed(0)
    blobs = make_jpegs(64)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Jpegs(blobs, 32 * steps), batch_size=32, num_workers=workers)
    start = time.monotonic()
    n = 0
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        n += 1
    el = time.monotonic() - start
    print(f"{n} steps in {el:.3f} s", flush=True)
    t = os.times()
    print(f"cpu {t.user + t.system + t.children_user + t.children_system:.3f} s", flush=True)


if __name__ == "__main__":
    main()
