"""A busy child exits, then another busy child gets its PID: the kernel
reuses PIDs once they wrap at pid_max; as root this job asks for the PID
at once through /proc/sys/kernel/ns_last_pid (the next PID is one above
it) instead of waiting for the wrap.

Prints "reused PID <pid>" when the second child got the first one's PID,
"not reused: <why>" otherwise.
"""
import subprocess
import sys

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < %s: pass\n"


def main():
    first = subprocess.Popen([sys.executable, "-c", BURN % 1.0])
    first.wait()
    pid = first.pid
    for _ in range(5):
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(pid - 1))
        except OSError as e:
            print(f"not reused: cannot set ns_last_pid ({e})")
            return
        second = subprocess.Popen([sys.executable, "-c", BURN % 0.5])
        second.wait()
        if second.pid == pid:
            print(f"reused PID {pid}")
            return
    print("not reused: another process took the PID five times")


main()
