#!/usr/bin/env bash
# Sizes of a long recording and of its outputs: a real job profiled through
# a --delay / --duration window, with the fake NVML following the job's
# simulated GPU steps (samples/gpu/activity.json), stacks at the default
# 99 Hz.
#
#   scripts/bench-long-run.sh [OUT]      # default: DELAY=2m DURATION=30m
#   DELAY=30s DURATION=5m scripts/bench-long-run.sh /tmp/long
#
# The job (samples/train_sim.py, 4 workers) runs longer than the window;
# once gpuprof has written its outputs (the window closed, the job still
# runs) the script interrupts the job, as a user would, and prints the
# recording, trace and flamegraph sizes, measured and per hour of window,
# and the time and peak memory of `gpuprof report` on the recording.
# OUT (kept) holds the output folder, so the outputs can be rebuilt with a
# newer gpuprof (`gpuprof report OUT/run`).
#
# Environment: GPUPROF (binary; default: a copy of target/debug/gpuprof,
# built if missing), FAKE_NVML (libfake_nvml.so; default: built with
# cargo), DELAY, DURATION, WORKERS (4), AUGMENT_MS (8), GPU_MS (20).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$(mktemp -d /tmp/bench-long.XXXXXX)}
DELAY=${DELAY:-2m}
DURATION=${DURATION:-30m}
WORKERS=${WORKERS:-4}
AUGMENT_MS=${AUGMENT_MS:-8}
GPU_MS=${GPU_MS:-20}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

if [ -z "${GPUPROF:-}" ]; then
    (cd "$ROOT" && cargo build --quiet --bin gpuprof)
    # A copy: rebuilding the tree during the run must not swap the binary.
    cp "${CARGO_TARGET_DIR:-$ROOT/target}/debug/gpuprof" "$OUT/gpuprof"
    GPUPROF=$OUT/gpuprof
fi
if [ -z "${FAKE_NVML:-}" ]; then
    (cd "$ROOT" && cargo build --quiet -p fake-nvml --target-dir "${CARGO_TARGET_DIR:-$ROOT/target}/fake-nvml")
    FAKE_NVML=${CARGO_TARGET_DIR:-$ROOT/target}/fake-nvml/debug/libfake_nvml.so
fi

secs() { python3 -c "import sys,re; m=re.fullmatch(r'([0-9.]+)(ms|s|m|h)?',sys.argv[1]); print(float(m[1])*{'ms':1e-3,'s':1,'m':60,'h':3600,None:1}[m[2]])" "$1"; }
window_s=$(secs "$DURATION")
delay_s=$(secs "$DELAY")

run=$OUT/run
rm -rf "$run" "$OUT/activity.log"
echo "$(date -Is) recording: delay $DELAY, window $DURATION; $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg)"
t0=$(date +%s.%N)
GPUPROF_NVML_LIB=$FAKE_NVML FAKE_NVML_SCENARIO=$ROOT/samples/gpu/activity.json \
    GPUPROF_ACTIVITY_LOG=$OUT/activity.log \
    "$GPUPROF" -q -o "$run" --delay "$DELAY" --duration "$DURATION" -- \
    python3 "$ROOT/samples/train_sim.py" --workers "$WORKERS" --augment-ms "$AUGMENT_MS" \
    --gpu-ms "$GPU_MS" --steps 100000000 >"$OUT/job.out" 2>"$OUT/gpuprof.err" &
gp=$!
# The window closes, then the outputs are written (summary.md last).
limit=$(python3 -c "print(int($delay_s + $window_s + 1800))")
while [ ! -f "$run/summary.md" ]; do
    if ! kill -0 "$gp" 2>/dev/null; then
        echo "gpuprof ended before writing its outputs:" >&2
        cat "$OUT/gpuprof.err" >&2
        exit 1
    fi
    if [ "$(python3 -c "import time; print(int(time.time() - $t0))")" -gt "$limit" ]; then
        echo "no outputs after ${limit}s" >&2
        kill -INT "$gp"
        exit 1
    fi
    sleep 5
done
t1=$(date +%s.%N)
# Interrupt the job (gpuprof's child) as Ctrl-C would; gpuprof exits with
# its status.
job=$(pgrep -P "$gp" | head -1 || true)
[ -n "$job" ] && kill -INT "$job"
rc=0
wait "$gp" || rc=$?
echo "$(date -Is) gpuprof exited $rc; outputs $(echo "$t1 - $t0 - $delay_s - $window_s" | bc -l | cut -c1-6) s after the window closed; load $(cut -d' ' -f1-3 /proc/loadavg)"

# Rebuild the outputs from the recording alone, measuring time and memory.
rebuild=$OUT/rebuilt
rm -rf "$rebuild"
/usr/bin/time -f "%e %M" -o "$OUT/report.time" "$GPUPROF" report -q -o "$rebuild" "$run"
read -r rep_s rep_kb <"$OUT/report.time"

python3 - "$run" "$rebuild" "$rep_s" "$rep_kb" <<'PY'
import json, os, sys
run, rebuilt, rep_s, rep_kb = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
r = json.load(open(os.path.join(rebuilt, "report.json")))
hours = r["duration_s"] / 3600
rec = os.path.getsize(os.path.join(run, "recording", "events.jsonl.gz"))
print(f"window: {r['duration_s']:.0f} s, stop reason: {r['stop_reason']}, "
      f"stack samples {r['stacks']['samples']} (stride {r['stacks']['analysis_stride']}), "
      f"lost {r['stacks']['lost_records']}, GPU idle gaps {sum(g['idle_gaps']['count'] for g in r['gpus'])}")
print(f"gpuprof during recording: {r['profiler']['cpu_pct_of_one_core']:.2f}% of one core, "
      f"peak RSS {r['profiler']['max_rss_bytes'] / 1e6:.0f} MB")
print(f"{'file':28} {'bytes':>12} {'MB/hour':>10}")
def row(name, size):
    print(f"{name:28} {size:12d} {size / 1e6 / hours:10.1f}")
row("recording/events.jsonl.gz", rec)
for f in sorted(os.listdir(rebuilt)):
    p = os.path.join(rebuilt, f)
    if os.path.isfile(p):
        row(f, os.path.getsize(p))
budget = r.get("trace", {})
if budget:
    print("trace budget:", json.dumps(budget)[:2000])
print(f"gpuprof report: {rep_s:.1f} s, peak RSS {rep_kb / 1e3:.0f} MB")
PY
