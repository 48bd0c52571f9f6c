"""A PyTorch DataLoader whose two workers are started with `spawn`: each
imports the program and PyTorch again before its first batch. The batches
themselves are cheap and the loop waits 2 ms a step (as for a GPU), so
after the start the input keeps up. Prints when each worker was ready (its
imports done) and when the first batch arrived, in seconds since the
interpreter began running this file: on a busy machine one worker can be
ready seconds after the other, and the loop waits for its batches.

Usage: spawn_loader.py [STEPS]
"""
import time

T0 = time.monotonic()

import os  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402


class Items(Dataset):
    def __init__(self, n, t0):
        self.n = n
        self.t0 = t0  # the main process's T0 (CLOCK_MONOTONIC is system-wide)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = 0
        for k in range(200):
            x = (x * 31 + k) & 0xFFFF
        return torch.full((16,), float(x))


def say(line):
    # One write of the whole line: the two workers and the loop share the
    # pipe, and print's text and newline, written apart, interleaved.
    os.write(sys.stdout.fileno(), f"{line}\n".encode())


def ready(worker_id):
    t0 = torch.utils.data.get_worker_info().dataset.t0
    say(f"worker {worker_id} ready after {time.monotonic() - t0:.2f} s")


if __name__ == "__main__":
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 600
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(
        Items(8 * steps, T0),
        batch_size=8,
        num_workers=2,
        multiprocessing_context="spawn",
        worker_init_fn=ready,
    )
    n = 0
    for batch in loader:
        if n == 0:
            say(f"first batch after {time.monotonic() - T0:.2f} s")
        loss = model(batch).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.002)
        n += 1
    say(f"{n} steps")
