#!/usr/bin/env python3
"""Compare gpuprof's Python-view flamegraph with `py-spy record --native` on
the same job.

Runs the job twice, interleaved (gpuprof, py-spy, gpuprof, py-spy, ... for
--rounds rounds): once under gpuprof (every process, Python view,
stacks-all.folded), once under `py-spy record --native --subprocesses -f raw`.
Both sample at 99 Hz. Then, over all samples of all processes:

- user functions: the Python functions defined in the job's own script,
  share of samples with the function anywhere on the stack ("total");
- leaves: the innermost frame of each sample (its self time), named the
  same way for both tools: a native symbol, `[library]` for code its
  library does not name, a Python function without its line number.

py-spy's stacks are folded at the standard library's launchers as
gpuprof's Python view folds them (a forked worker's stack starts at the
target of `BaseProcess._bootstrap` / `Thread._bootstrap`), so that both
count the same frames; otherwise every worker sample would also count the
parent's `<module>` and `main` in py-spy's picture only.

`--gpuprof-env VAR=VALUE` sets a variable for the gpuprof runs only, e.g.
`PYTHONPERFSUPPORT=1` on 3.12+, where gpuprof takes the Python frames from
CPython's perf trampolines (the same instant as the native sample, like
py-spy's stopping) rather than from its nearest-in-time merge.

Each row gives both shares and the sampling noise for the difference (two
standard errors of the difference of two binomial proportions). A row whose
difference exceeds it is marked.

py-spy samples wall-clock time of every thread that is not idle, gpuprof
samples CPU time: on a loaded machine (runnable threads waiting for a CPU)
phases such as start-up or exit weigh differently; `--within FUNC` compares
the program's steady state only.

Usage:
  scripts/compare-pyspy.py --gpuprof target/debug/gpuprof \
      --py-spy /path/to/py-spy [--rounds 2] [--top 12] -- python3 job.py args
"""
import argparse
import collections
import math
import os
import re
import subprocess
import sys
import tempfile


def norm_frame(f):
    """One frame as both tools can name it."""
    m = re.match(r"^(.*) \(([^()]*)\)$", f)
    if not m:
        return f
    name, where = m.group(1), m.group(2)
    if re.search(r"\.pyx?(:\d+)?$", where) or where.startswith("<"):
        # Python: drop the line number and any directories.
        where = re.sub(r":\d+$", "", where).rsplit("/", 1)[-1]
        return f"{name} ({where})"
    # py-spy native frame: `sym (lib)` or `0x7f.. (lib)`.
    if re.match(r"^0x[0-9a-f]+$", name):
        return f"[{where}]"
    return name


def norm_gpuprof(f):
    # `[lib+0xoff]` (native view) → `[lib]`
    return re.sub(r"^\[(.*)\+0x[0-9a-f]+\]$", r"[\1]", f)


LAUNCHERS = ("multiprocessing/process.py", "threading.py")


def fold_launcher(frames):
    """Drop what gpuprof's Python view folds into the root in a process or
    thread started by multiprocessing or threading (py-spy frames keep the
    module path: `BaseProcess._bootstrap (multiprocessing/process.py)`)."""
    def where(f):
        m = re.match(r"^(.*) \(([^()]*)\)$", f)
        if not m:
            return f, ""
        return m.group(1).rsplit(".", 1)[-1], re.sub(r":\d+$", "", m.group(2))
    last = None
    for i, f in enumerate(frames):
        name, path = where(f)
        if name == "_bootstrap" and path.endswith(LAUNCHERS):
            last = i
    if last is None:
        return frames
    j = last + 1
    while j < len(frames):
        name, path = where(frames[j])
        if path.endswith(LAUNCHERS) and name in ("run", "_bootstrap_inner"):
            j += 1
        else:
            break
    return frames[j:]


def parse(path, pyspy):
    stacks = collections.Counter()
    with open(path) as fh:
        for line in fh:
            line = line.rstrip("\n")
            if not line:
                continue
            stack, n = line.rsplit(" ", 1)
            frames = stack.split(";")
            if pyspy:
                frames = [f for f in frames if not f.startswith("process ")]
                frames = [norm_frame(f) for f in fold_launcher(frames)]
                # Unnamed frames of one library in a row count as one.
                out = []
                for f in frames:
                    if out and f.startswith("[") and out[-1] == f:
                        continue
                    out.append(f)
                frames = out
            else:
                frames = [norm_gpuprof(f) for f in frames[1:]]  # root: process
            stacks[tuple(frames)] += int(n)
    return stacks


def shares(stacks, script, within=None):
    if within:
        stacks = {f: n for f, n in stacks.items() if within in f}
    total = sum(stacks.values())
    user = collections.Counter()
    leaf = collections.Counter()
    for frames, n in stacks.items():
        seen = set()
        for f in frames:
            if f.endswith(f"({script})") and f not in seen:
                seen.add(f)
                user[f] += n
        leaf[frames[-1] if frames else "(process root)"] += n
    return total, user, leaf


def run(cmd, env=None):
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpuprof", required=True)
    ap.add_argument("--py-spy", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--gpuprof-env", action="append", default=[])
    ap.add_argument(
        "--within",
        help="only samples with this frame on the stack, e.g. 'work (job.py)': the "
        "program's steady state, leaving out start-up and exit, which wall-clock "
        "(py-spy) and CPU-time (gpuprof) sampling weigh differently on a loaded machine",
    )
    ap.add_argument("job", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    job = a.job[1:] if a.job and a.job[0] == "--" else a.job
    script = os.path.basename(next(x for x in job if x.endswith(".py")))
    tmp = tempfile.mkdtemp(prefix="compare-pyspy-")
    g, p = collections.Counter(), collections.Counter()
    for i in range(a.rounds):
        out = os.path.join(tmp, f"gpuprof-{i}")
        env = dict(os.environ)
        env.update(kv.split("=", 1) for kv in a.gpuprof_env)
        run([a.gpuprof, "-q", "--no-gpu", "-o", out, "--"] + job, env=env)
        g.update(parse(os.path.join(out, "stacks-all.folded"), pyspy=False))
        raw = os.path.join(tmp, f"pyspy-{i}.txt")
        run([a.py_spy, "record", "--native", "--subprocesses", "-r", "99", "-f", "raw",
             "-o", raw, "--"] + job)
        p.update(parse(raw, pyspy=True))
    gn, gu, gl = shares(g, script, a.within)
    pn, pu, pl = shares(p, script, a.within)

    def row(name, a_, b_):
        x, y = a_ / max(gn, 1), b_ / max(pn, 1)
        pool = (a_ + b_) / max(gn + pn, 1)
        noise = 2 * math.sqrt(max(pool * (1 - pool), 1e-12) * (1 / max(gn, 1) + 1 / max(pn, 1)))
        mark = "" if abs(x - y) <= noise else " ⚠"
        return f"| {name} | {100 * x:.1f} | {100 * y:.1f} | {100 * (x - y):+.1f} | ±{100 * noise:.1f}{mark} |"

    extra = f" (gpuprof with {' '.join(a.gpuprof_env)})" if a.gpuprof_env else ""
    print(f"job: {' '.join(job)}{extra}; {a.rounds} rounds; load average {os.getloadavg()[0]:.1f}")
    scope = f" with {a.within} on the stack" if a.within else ""
    print(f"samples{scope}: gpuprof {gn}, py-spy --native {pn}\n")
    print("| user function (total %) | gpuprof | py-spy | diff | noise (2σ) |")
    print("|---|---|---|---|---|")
    for f in sorted(set(gu) | set(pu), key=lambda f: -(gu[f] / max(gn, 1) + pu[f] / max(pn, 1))):
        print(row(f, gu[f], pu[f]))
    print("\n| leaf (self %) | gpuprof | py-spy | diff | noise (2σ) |")
    print("|---|---|---|---|---|")
    leaves = sorted(set(gl) | set(pl), key=lambda f: -(gl[f] / max(gn, 1) + pl[f] / max(pn, 1)))
    for f in leaves[: a.top]:
        print(row(f, gl[f], pl[f]))


if __name__ == "__main__":
    main()
