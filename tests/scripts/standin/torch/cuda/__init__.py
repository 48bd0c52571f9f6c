"""A stand-in for ``torch.cuda`` on a machine without a GPU: its
``synchronize`` blocks the caller as the real one does while the GPU
finishes its queued work (here: a sleep of the given length)."""

import time


def synchronize(seconds=0.0):
    time.sleep(seconds)
