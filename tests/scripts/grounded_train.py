"""Small real PyTorch training loops whose main thread spends its time in
a known place, for the diagnosis's account of the main thread.

Usage: grounded_train.py MODE STEPS [WORKERS]
  lstm    no DataLoader: token batches sliced from one tensor, an LSTM
          language model (matmul/LSTM, backward, a hand-written update)
  decode  a Dataset whose __getitem__ decompresses and augments each
          image, read by a DataLoader in the main process (no workers),
          feeding a tiny linear model
  conv    a small conv net fed by a DataLoader of cheap synthetic images,
          with WORKERS worker processes
  lbfgs   a closure optimizer: each of STEPS steps of LBFGS evaluates the
          model, its backward pass included, 20 times
  closure SGD given each step as a closure (as Lightning does):
          training_step and its backward pass run once inside each step
  gan     a GAN's loop: three backward passes per step, from three lines
          (the discriminator's real and fake batches, then the generator),
          each through one helper (as Lightning's manual_backward)
  pool    the conv net without a DataLoader on a 2-thread intra-op pool
          whose threads block at once when idle (OMP_WAIT_POLICY=PASSIVE):
          the main thread waits at each parallel region's end for the
          other pool thread
  compile the conv net under torch.compile (the aot_eager backend:
          TorchDynamo's tracing and AOTAutograd, no C++ compiler), with
          Inductor's compile-worker pool started and warm as on a machine
          of many cores; the batch size drops from 16 to 12 after a third
          of the steps (a recompile: the batch dimension becomes dynamic)
          and to 8 after two thirds (the dynamic graph runs it); prints
          the time of the first step of each size (its compile); with
          GPUPROF_ACTIVITY_LOG, the other steps are logged as GPU work
          for the fake NVML (docs/testing.md), so that a GPU idles while
          the loop compiles
Prints "steps N" at the end.
"""
import os
import sys
import zlib

if sys.argv[1:2] == ["pool"]:
    # Read by OpenMP when torch loads it: without it, the pool's threads
    # spin before they block and the waits at a region's end are too short
    # to be seen on a quiet machine.
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
if sys.argv[1:2] == ["compile"]:
    # Read when torch._inductor's config is imported: a pool of 2 workers.
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "2"

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Lm(nn.Module):
    def __init__(self, vocab=2000, dim=128):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.rnn = nn.LSTM(dim, dim, num_layers=2)
        self.out = nn.Linear(dim, vocab)

    def forward(self, x, h):
        y, h = self.rnn(self.emb(x), h)
        return self.out(y), h


def lstm(steps):
    model = Lm()
    crit = nn.CrossEntropyLoss()
    data = torch.randint(0, 2000, (20000, 16))
    h = None
    for i in range(steps):
        j = (i * 20) % (data.size(0) - 21)
        x, y = data[j:j + 20], data[j + 1:j + 21]
        model.zero_grad()
        out, h = model(x, h)
        h = tuple(t.detach() for t in h)
        loss = crit(out.view(-1, 2000), y.reshape(-1))
        loss.backward()
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-0.1)


class Compressed(Dataset):
    """Images stored compressed, decoded and augmented per item."""

    def __init__(self):
        rng = np.random.default_rng(0)
        self.blobs = [
            zlib.compress(rng.integers(0, 8, (128, 128, 3), dtype=np.uint8).tobytes(), 6)
            for _ in range(64)
        ]

    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        img = np.frombuffer(zlib.decompress(self.blobs[i % 64]), np.uint8).reshape(128, 128, 3)
        img = img.astype(np.float32) / 7.0
        for k in range(10):
            img = np.flip(img, axis=k % 2) * 0.9 + 0.05
            img = np.clip(img + np.sin(img * (k + 1)), 0.0, 1.0)
        return torch.from_numpy(np.ascontiguousarray(img[::4, ::4])), i % 10


class Cheap(Dataset):
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        return torch.full((3, 32, 32), (i % 7) / 7.0), i % 10


def fit(model, loader, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    crit = nn.CrossEntropyLoss()
    it = iter(loader)
    for _ in range(steps):
        x, y = next(it)
        opt.zero_grad()
        loss = crit(model(x), y)
        loss.backward()
        opt.step()


def lbfgs(steps):
    model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 1))
    x, y = torch.randn(16384, 64), torch.randn(16384, 1)
    # No early stop: every step makes its 20 evaluations.
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=20,
                            tolerance_grad=0, tolerance_change=0)
    crit = nn.MSELoss()

    def closure():
        opt.zero_grad()
        loss = crit(model(x), y)
        loss.backward()
        return loss

    for _ in range(steps):
        opt.step(closure)


def closure_steps(steps):
    model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 1))
    x, y = torch.randn(65536, 64), torch.randn(65536, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    crit = nn.MSELoss()

    def training_step(b):
        return crit(model(x[b:b + 32768]), y[b:b + 32768])

    for i in range(steps):
        def closure():
            opt.zero_grad()
            loss = training_step(i % 2)
            loss.backward()
            return loss
        opt.step(closure)


def manual_backward(loss):
    loss.backward()


def gan(steps):
    # Each backward pass 30-40 ms of CPU: 3-4 samples.
    d = nn.Sequential(nn.Linear(64, 512), nn.Tanh(), nn.Linear(512, 512),
                      nn.Tanh(), nn.Linear(512, 1))
    g = nn.Sequential(nn.Linear(16, 512), nn.Tanh(), nn.Linear(512, 64))
    opt_d = torch.optim.SGD(d.parameters(), lr=0.01)
    opt_g = torch.optim.SGD(g.parameters(), lr=0.01)
    crit = nn.MSELoss()
    real = torch.randn(2048, 64)
    ones, zeros = torch.ones(2048, 1), torch.zeros(2048, 1)
    for _ in range(steps):
        d.zero_grad()
        err_real = crit(d(real), ones)
        manual_backward(err_real)
        fake = g(torch.randn(2048, 16))
        err_fake = crit(d(fake.detach()), zeros)
        manual_backward(err_fake)
        opt_d.step()
        g.zero_grad()
        err_g = crit(d(fake), ones)
        manual_backward(err_g)
        opt_g.step()


def conv_net():
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(512, 10),
    )


def compiled(steps):
    import time
    from torch._inductor.async_compile import AsyncCompile

    pool = AsyncCompile.process_pool()
    pids = sorted({pool.submit(os.getpid).result() for _ in range(8)})
    print("compile workers", pids, flush=True)
    model = conv_net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = torch.compile(model, backend="aot_eager")
    log = os.environ.get("GPUPROF_ACTIVITY_LOG")
    act = open(log, "a", buffering=1) if log else None
    for i in range(steps):
        n = 16 if i < steps // 3 else 12 if i < 2 * steps // 3 else 8
        first = i in (0, steps // 3, 2 * steps // 3)
        x, y = torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,))
        t0 = time.monotonic()
        if act and not first:
            act.write("B %d %d\n" % (os.getpid(), time.monotonic_ns()))
        opt.zero_grad()
        nn.functional.cross_entropy(step(x), y).backward()
        opt.step()
        if act and not first:
            act.write("E %d %d\n" % (os.getpid(), time.monotonic_ns()))
        if first:
            print("batch %d first step %.3f s" % (n, time.monotonic() - t0), flush=True)


def main():
    mode, steps = sys.argv[1], int(sys.argv[2])
    workers = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if mode == "lstm":
        lstm(steps)
    elif mode == "decode":
        model = nn.Sequential(nn.Flatten(), nn.Linear(32 * 32 * 3, 10))
        fit(model, DataLoader(Compressed(), batch_size=16, num_workers=0), steps)
    elif mode == "lbfgs":
        lbfgs(steps)
    elif mode == "closure":
        closure_steps(steps)
    elif mode == "gan":
        gan(steps)
    elif mode == "conv":
        model = conv_net()
        loader = DataLoader(Cheap(), batch_size=16, num_workers=workers)
        fit(model, loader, steps)
    elif mode == "pool":
        torch.set_num_threads(2)
        model = conv_net()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(16, 3, 64, 64), torch.randint(0, 10, (16,))
        for _ in range(steps):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    elif mode == "compile":
        compiled(steps)
    else:
        raise SystemExit(f"unknown mode {mode}")
    print("steps", steps, flush=True)


if __name__ == "__main__":
    main()
