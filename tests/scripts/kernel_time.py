"""A job whose main thread spends a known CPU time in user mode, then a
known CPU time in the kernel: `python3 kernel_time.py USER_S KERNEL_S`.

The user phase is pure Python (`burn`); the kernel phase reads /dev/zero
into a 256 MiB buffer (`soak`: the kernel clears the buffer, ~10-30 ms a
call, so several sampling periods end inside one system call). A last
0.3 s in user mode follows (`burn` again, counted with the user phase):
where the kernel's periods take no sample, they are counted at the
thread's next sample, and a thread that ends in the kernel has none.
Prints one JSON line: each phase's CPU time of the thread, and the kernel
phase's system time, as the kernel counts them.
"""

import json
import os
import sys
import time


def burn(seconds):
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        for i in range(2000):
            x += i * i
    return x


def soak(seconds, fd, buf):
    end = time.thread_time() + seconds
    calls = 0
    while time.thread_time() < end:
        os.readv(fd, [buf])
        calls += 1
    return calls


def main():
    user_s, kernel_s = float(sys.argv[1]), float(sys.argv[2])
    fd = os.open("/dev/zero", os.O_RDONLY)
    buf = bytearray(256 << 20)
    os.readv(fd, [buf])  # its pages faulted in before the phase
    t0 = time.thread_time()
    burn(user_s)
    t1 = time.thread_time()
    s0 = os.times().system
    calls = soak(kernel_s, fd, buf)
    t2 = time.thread_time()
    s1 = os.times().system
    burn(0.3)
    t3 = time.thread_time()
    print(json.dumps({"user_phase_s": (t1 - t0) + (t3 - t2), "kernel_phase_s": t2 - t1,
                      "kernel_phase_system_s": s1 - s0, "reads": calls}), flush=True)


if __name__ == "__main__":
    main()
