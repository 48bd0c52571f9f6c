"""A job whose start is a slow import, as `import torch` from a cold cache
is: it writes a module whose body computes for IMPORT_S seconds, imports
it, then prepares "batches" in its main thread for WORK_S seconds (no
workers) and exits.

Usage: slow_imports.py IMPORT_S WORK_S
"""
import os
import shutil
import sys
import tempfile
import time

import_s, work_s = float(sys.argv[1]), float(sys.argv[2])

pkg = tempfile.mkdtemp(prefix="slow_imports.")
with open(os.path.join(pkg, "heavy_module.py"), "w") as f:
    f.write(
        "import time\n"
        f"_end = time.thread_time() + {import_s}\n"
        "_x = 0\n"
        "while time.thread_time() < _end:\n"
        "    for _i in range(2000):\n"
        "        _x = (_x * 31 + _i) & 0xFFFFFFFF\n"
    )
sys.path.insert(0, pkg)
t = time.perf_counter()
import heavy_module  # noqa: E402,F401

print(f"imported in {time.perf_counter() - t:.2f} s", flush=True)


def make_batch():
    x = 0
    for i in range(20000):
        x = (x * 31 + i) & 0xFFFFFFFF
    return x


end = time.thread_time() + work_s
steps = 0
while time.thread_time() < end:
    make_batch()
    steps += 1
print(f"{steps} batches", flush=True)
shutil.rmtree(pkg, ignore_errors=True)
