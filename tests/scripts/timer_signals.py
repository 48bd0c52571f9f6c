"""The job's own signal use, for the in-process timer sampler (issue 33):
each mode prints what it observed, which must be the same with and
without gpuprof, and exits 0 (or the status it names).

    timer_signals.py itimer    setitimer(ITIMER_REAL) + SIGALRM handler,
                               while sleeping and computing
    timer_signals.py sigprof   setitimer(ITIMER_PROF) + SIGPROF handler
                               while computing
    timer_signals.py blockall  a thread that blocks every signal computes,
                               reads its mask back, finds nothing pending
    timer_signals.py fork200   200 short forked children, each with its
                               own exit status
"""
import os
import signal
import sys
import threading
import time


def burn_cpu(seconds):
    """Compute for `seconds` of this thread's CPU time; returns a checksum
    of a fixed amount of work per loop (printed as the work done)."""
    end = time.thread_time() + seconds
    n = 0
    while time.thread_time() < end:
        n += sum(range(500)) & 0xFF
    return n


def itimer():
    got = []
    signal.signal(signal.SIGALRM, lambda s, f: got.append(s))
    signal.setitimer(signal.ITIMER_REAL, 0.02, 0.02)
    t0 = time.monotonic()
    time.sleep(0.3)  # PEP 475: resumed after each SIGALRM
    slept = time.monotonic() - t0
    burn_cpu(0.3)
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
    assert slept >= 0.3, slept
    assert len(got) >= 5 and set(got) == {signal.SIGALRM}, got
    # What the job set is what it reads back.
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    print("itimer ok: slept the full 0.3 s; SIGALRM handled")


def sigprof():
    got = []
    signal.signal(signal.SIGPROF, lambda s, f: got.append(s))
    signal.setitimer(signal.ITIMER_PROF, 0.01, 0.01)
    burn_cpu(0.5)
    signal.setitimer(signal.ITIMER_PROF, 0, 0)
    # ~50 expected on an idle machine, as few as 14 on a loaded one (with
    # or without gpuprof): that it runs at all is what is checked.
    assert len(got) >= 3 and set(got) == {signal.SIGPROF}, len(got)
    print("sigprof ok: SIGPROF handled")


def blockall():
    every = set(signal.valid_signals())
    seen = {}

    def blocked():
        signal.pthread_sigmask(signal.SIG_BLOCK, every)
        burn_cpu(0.4)
        seen["mask"] = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        seen["pending"] = signal.sigpending()

    t = threading.Thread(target=blocked)
    t.start()
    t.join()
    # Reads back what it set (SIGKILL and SIGSTOP cannot be blocked, and
    # glibc keeps two real-time signals of its own); nothing pending.
    missing = every - seen["mask"] - {signal.SIGKILL, signal.SIGSTOP, 32, 33}
    assert signal.SIGTRAP in seen["mask"] and signal.SIGPROF in seen["mask"], seen["mask"]
    assert not missing, missing
    assert not seen["pending"], seen["pending"]
    print("blockall ok: mask as set, nothing pending")


def fork200():
    statuses = []
    for i in range(200):
        pid = os.fork()
        if pid == 0:
            s = sum(range(2000 + i))
            os._exit(s % 7)
        _, st = os.waitpid(pid, 0)
        statuses.append(os.waitstatus_to_exitcode(st))
    want = [sum(range(2000 + i)) % 7 for i in range(200)]
    assert statuses == want, statuses
    print("fork200 ok:", sum(statuses))


if __name__ == "__main__":
    {"itimer": itimer, "sigprof": sigprof, "blockall": blockall, "fork200": fork200}[sys.argv[1]]()
