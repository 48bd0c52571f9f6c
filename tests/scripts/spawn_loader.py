"""A PyTorch DataLoader whose two workers are started with `spawn`: each
imports the program and PyTorch again before its first batch. The batches
themselves are cheap and the loop waits 2 ms a step (as for a GPU), so
after the start the input keeps up. Prints when the first batch arrived,
in seconds since the interpreter began running this file.

Usage: spawn_loader.py [STEPS]
"""
import time

T0 = time.monotonic()

import sys  # noqa: E402

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402


class Items(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = 0
        for k in range(200):
            x = (x * 31 + k) & 0xFFFF
        return torch.full((16,), float(x))


if __name__ == "__main__":
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 600
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Items(8 * steps), batch_size=8, num_workers=2, multiprocessing_context="spawn")
    n = 0
    for batch in loader:
        if n == 0:
            print(f"first batch after {time.monotonic() - T0:.2f} s", flush=True)
        loss = model(batch).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.002)
        n += 1
    print(f"{n} steps", flush=True)
