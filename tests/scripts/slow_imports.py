"""A job whose start is a slow import, as `import torch` from a cold cache
is: it writes a module whose body computes for IMPORT_S seconds, imports
it, then prepares "batches" in its main thread for WORK_S seconds (no
workers) and exits.

With a third argument `registers`, the module's body spends its time in
a function it calls again and again, 40 ms of CPU each with 30 ms of
its own between (as a PyTorch
import registers its operators, `CustomOpDef.__init__`): regular
entries of one function, inside an import, that are no training step.

Usage: slow_imports.py IMPORT_S WORK_S [registers]
"""
import os
import shutil
import sys
import tempfile
import time

import_s, work_s = float(sys.argv[1]), float(sys.argv[2])

pkg = tempfile.mkdtemp(prefix="slow_imports.")
registers = len(sys.argv) > 3 and sys.argv[3] == "registers"
with open(os.path.join(pkg, "heavy_module.py"), "w") as f:
    if registers:
        f.write(
            "import time\n"
            "def register():\n"
            "    end = time.thread_time() + 0.04\n"
            "    x = 0\n"
            "    while time.thread_time() < end:\n"
            "        for i in range(2000):\n"
            "            x = (x * 31 + i) & 0xFFFFFFFF\n"
            f"_end = time.thread_time() + {import_s}\n"
            "_x = 0\n"
            "while time.thread_time() < _end:\n"
            "    register()\n"
            "    _t = time.thread_time() + 0.03\n"
            "    while time.thread_time() < _t:\n"
            "        for _i in range(2000):\n"
            "            _x = (_x * 31 + _i) & 0xFFFFFFFF\n"
        )
    else:
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
