#!/usr/bin/env bash
# CPU of gpuprof's Python samplers on jobs with 2, 8 and 16 busy Python
# processes (issue 8, point 5): the py-spy sampler (--python-frames py-spy,
# and in the default mode, where it leaves the agent's processes alone)
# and the perf reader that drains and unwinds the agents' samples.
#
# Usage: scripts/bench-python-sampler.sh [SECONDS] [PYTHON]
set -euo pipefail
SECONDS_=${1:-6}
PY=${2:-python3}
PY=$("$PY" -c 'import sys; print(sys.executable)')
ROOT=$(cd "$(dirname "$0")/.." && pwd)
GPUPROF=${GPUPROF:-${CARGO_TARGET_DIR:-$ROOT/target}/release/gpuprof}
WORK=$(mktemp -d /tmp/bench-pysampler.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
echo "python: $("$PY" -V 2>&1); $(nproc) CPUs; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-6s %-13s %8s %12s %10s %12s %10s\n" procs mode wall_s pyspy_cpu_s pyspy_pct reader_cpu_s reader_pct
for n in 2 8 16; do
    for mode in py-spy same-instant; do
        out="$WORK/$n.$mode"
        t0=$(date +%s.%N)
        "$GPUPROF" -q -o "$out" --python-frames "$mode" -- "$PY" "$ROOT/tests/scripts/alternate.py" "$SECONDS_" $((n - 1)) > /dev/null
        t1=$(date +%s.%N)
        "$PY" - "$out" "$(echo "$t1 - $t0" | bc -l)" "$n" "$mode" <<'PY'
import gzip, json, sys
d, wall, n, mode = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
cpu = {"native": 0.0, "python": 0.0}
for l in gzip.open(d + "/recording/events.jsonl.gz", "rt"):
    e = json.loads(l)
    if e["k"] == "stack_stats":
        cpu["python" if e.get("kind") == "python" else "native"] += e["busy_ns"] / 1e9
print("%-6s %-13s %8.2f %12.3f %9.2f%% %12.3f %9.2f%%" % (n, mode, wall, cpu["python"], 100 * cpu["python"] / wall,
      cpu["native"], 100 * cpu["native"] / wall))
PY
        rm -rf "$out"
    done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
