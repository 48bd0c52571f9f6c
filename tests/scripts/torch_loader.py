"""A real PyTorch DataLoader with Pillow transforms, for the flamegraph-view
tests: two worker processes decode a JPEG (libjpeg through Pillow), resize
and rotate it (Pillow's C code), add a little pure-Python work, and hand the
main process tensors built through NumPy.

Usage: torch_loader.py [seconds] [workers]
"""
import io
import sys
import time

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset


def make_jpeg(size=256):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 255, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def jitter(n):
    acc = 0
    for i in range(n):
        acc = (acc * 1103515245 + 12345) & 0x7FFFFFFF
    return acc / 0x7FFFFFFF


class Images(Dataset):
    def __init__(self, n):
        self.n = n
        self.jpeg = make_jpeg()

    def __len__(self):
        return self.n

    def load_image(self):
        return Image.open(io.BytesIO(self.jpeg)).convert("RGB")

    def augment(self, img):
        angle = 30 * jitter(2000)
        img = img.rotate(angle, resample=Image.BILINEAR)
        return img.resize((192, 192), resample=Image.LANCZOS)

    def __getitem__(self, i):
        img = self.augment(self.load_image())
        arr = np.asarray(img, dtype=np.float32) / 255.0
        return torch.from_numpy(arr).permute(2, 0, 1)


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    torch.set_num_threads(1)
    loader = DataLoader(Images(1 << 20), batch_size=8, num_workers=workers)
    end = time.monotonic() + seconds
    batches = 0
    for batch in loader:
        batch.mean()
        batches += 1
        if time.monotonic() > end:
            break
    print(f"batches: {batches}", file=sys.stderr)


if __name__ == "__main__":
    main()
