#!/usr/bin/env python3
"""Write a synthetic recording of a job that starts N short-lived processes
(default 300 000 over ~290 s), to measure `gpuprof report`'s time and peak
memory on a huge process table:

    scripts/synth-many-processes.py OUT [N]
    /usr/bin/time -v gpuprof report OUT

Each process has a process record, one process sample, one thread with its
CPU, and an exit; the job itself, the window start and the footer frame
them. The events are those a real recording holds (docs/outputs.md)."""
import gzip
import json
import os
import sys

out = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 300_000
MS = 1_000_000
start = 10_000_000 * MS
span = 290_000 * MS
life = 400 * MS
job = 100
header = {
    "k": "header", "format": "gpuprof-recording", "version": 1,
    "gpuprof_version": "0.1.0", "command": ["sh", "spawner.sh"], "host": "synth",
    "start": start, "anchor_realtime_ns": 1_700_000_000 * 10**9,
    "anchor_monotonic_ns": start, "anchor_error_ns": 30, "interval_ns": 100 * MS,
    "cpus": 16, "page_size": 4096, "clock_ticks_per_s": 100, "rank": None,
    "job_pid": job, "boottime_offset_ns": 0, "gpu_idle_threshold_pct": 5.0,
}
events = []
def ev(t, d):
    events.append((t, json.dumps(d, separators=(",", ":"))))
ev(start, {"k": "window_start", "t": start})
ev(start + MS, {"k": "process", "t": start + MS, "pid": job, "ppid": 1,
                "start_boot_ns": start, "comm": "sh", "cmdline": ["sh", "spawner.sh"],
                "exe": "/usr/bin/dash"})
for i in range(n):
    pid = 1000 + i % 4_000_000
    t = start + 100 * MS + i * span // n
    ev(t, {"k": "process", "t": t, "pid": pid, "ppid": job, "start_boot_ns": t - MS,
           "comm": "worker", "cmdline": ["python3", "work.py", "--item", str(i)],
           "exe": "/usr/bin/python3.11"})
    ev(t, {"k": "thread", "t": t, "pid": pid, "tid": pid, "comm": "worker"})
    ev(t + 1, {"k": "process_sample", "t": t + 1, "pid": pid, "user_ns": 2 * MS,
               "sys_ns": MS, "rss_bytes": 20 << 20, "read_bytes": 4096,
               "write_bytes": 0, "rchar": 10000, "wchar": 100, "threads": 1})
    ev(t + 1, {"k": "thread_cpu", "t": t + 1, "pid": pid, "tid": pid,
               "user_ns": 2 * MS, "sys_ns": MS, "state": "R", "cpu": i % 16})
    ev(t + life, {"k": "process_exit", "t": t + life, "pid": pid, "status": {"exited": 0}})
end = start + span + life + 200 * MS
events.sort(key=lambda e: e[0])
os.makedirs(os.path.join(out, "recording"), exist_ok=True)
with gzip.open(os.path.join(out, "recording", "events.jsonl.gz"), "wt", compresslevel=6) as f:
    f.write(json.dumps(header, separators=(",", ":")) + "\n")
    for _, line in events:
        f.write(line + "\n")
    f.write(json.dumps({"k": "footer", "t": end, "status": {"exited": 0},
                        "reason": "job exited", "dropped_events": 0,
                        "profiler_cpu_ns": 0, "profiler_max_rss_bytes": 0,
                        "end_anchor": None}) + "\n")
