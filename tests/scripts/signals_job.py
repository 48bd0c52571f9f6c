"""The job's own signal handling while gpuprof's agent samples it.

    signals_job.py handler   the job's SIGTRAP handler gets its SIGTRAP
    signals_job.py default   SIGTRAP left at its default kills the job, as
                             without gpuprof (exit status 128+5)
    signals_job.py spawn     a thread with SIGTRAP blocked (it reads back
                             its mask, nothing pending), and children
                             started by vfork/posix_spawn and fork+exec
"""
import os
import signal
import subprocess
import sys
import threading
import time


def burn(seconds):
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += sum(range(200))
    return n


def main():
    mode = sys.argv[1]
    if mode == "handler":
        got = []
        old = signal.signal(signal.SIGTRAP, lambda s, f: got.append(s))
        assert old == signal.SIG_DFL, old
        burn(0.4)
        os.kill(os.getpid(), signal.SIGTRAP)
        burn(0.2)
        assert got == [signal.SIGTRAP], got
        print("handler ok")
    elif mode == "default":
        assert signal.getsignal(signal.SIGTRAP) == signal.SIG_DFL
        burn(0.4)
        os.kill(os.getpid(), signal.SIGTRAP)
        time.sleep(2)
        print("still alive")
    elif mode == "spawn":

        def blocked():
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTRAP])
            burn(0.6)
            # What it set is what it reads, and nothing of the agent's is
            # left pending for it.
            assert signal.SIGTRAP in signal.pthread_sigmask(signal.SIG_BLOCK, [])
            assert not signal.sigpending(), signal.sigpending()

        t = threading.Thread(target=blocked)
        t.start()
        for _ in range(15):
            subprocess.run([sys.executable, "-c", "import sys; sys.exit(3)"], check=False).returncode == 3 or sys.exit("child status")
            subprocess.run(["sh", "-c", "exit 0"], check=True, preexec_fn=lambda: None)
            subprocess.run(["true"], check=True, close_fds=False)
            burn(0.02)
        t.join()
        print("spawn ok")


if __name__ == "__main__":
    main()
