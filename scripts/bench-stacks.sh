#!/usr/bin/env bash
# Overhead of gpuprof's stack sampling, side by side with py-spy and perf,
# on the same CPU-bound multi-process job (samples/train_sim.py).
#
# Usage: scripts/bench-stacks.sh [RUNS] [STEPS]
#   RUNS   runs per configuration (median reported), default 5
#   STEPS  training steps of the job, default 150
#
# Prints, for each configuration, the median of the job's own elapsed time
# (as train_sim.py measures it, so tool start-up and post-processing do not
# count) and of the whole command's wall time, both as ratios to the bare
# run; gpuprof's own CPU (% of one core, from report.json); and the time
# `gpuprof report` takes to post-process a recording of >= 100k samples.
# Needs: a release build (cargo build --release), python3, pip (installs
# py-spy into a throw-away venv), perf (optional).
set -euo pipefail

RUNS=${1:-5}
STEPS=${2:-150}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
GPUPROF=${GPUPROF:-${CARGO_TARGET_DIR:-$ROOT/target}/release/gpuprof}
WORK=$(mktemp -d /tmp/bench-stacks.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
JOB=(python3 "$ROOT/samples/train_sim.py" --workers 4 --augment-ms 8 --gpu-ms 2 --steps "$STEPS")

[ -x "$GPUPROF" ] || { echo "no release binary at $GPUPROF: run cargo build --release" >&2; exit 1; }

python3 -m venv "$WORK/venv" >/dev/null
"$WORK/venv/bin/pip" install -q py-spy >/dev/null
PYSPY="$WORK/venv/bin/py-spy"

# run NAME CMD... : runs CMD, appends "job_s wall_s" to $WORK/NAME
run() {
    local name=$1; shift
    local t0 t1 job_s
    t0=$(date +%s.%N)
    "$@" > "$WORK/$name.out" 2>&1 || { echo "$name failed:" >&2; tail -5 "$WORK/$name.out" >&2; exit 1; }
    t1=$(date +%s.%N)
    job_s=$(grep -o 'steps in [0-9.]* s' "$WORK/$name.out" | tail -1 | awk '{print $3}')
    echo "$job_s $(echo "$t1 - $t0" | bc -l)" >> "$WORK/$name"
}

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

configs=(bare gpuprof pyspy)
command -v perf >/dev/null && configs+=(perf)
for i in $(seq "$RUNS"); do
    for c in "${configs[@]}"; do
        case $c in
        bare) run bare "${JOB[@]}" ;;
        gpuprof)
            rm -rf "$WORK/g$i"
            run gpuprof "$GPUPROF" -q -o "$WORK/g$i" --frequency 99 -- "${JOB[@]}"
            python3 -c "import json,sys; r=json.load(open(sys.argv[1])); p=r['profiler']; s=r['stacks']; y=s['python']; print(p['cpu_pct_of_one_core'], s['samples'], s['lost_records'], s['unwind_coverage'], s['python_stacks'], y['same_instant'], y['same_instant_partial'], y['unattributed'])" \
                "$WORK/g$i/report.json" >> "$WORK/gpuprof.stats"
            du -b "$WORK/g$i/recording/events.jsonl.gz" | awk '{print $1}' >> "$WORK/gpuprof.rec"
            ;;
        pyspy) run pyspy "$PYSPY" record --subprocesses -r 99 --nonblocking -o "$WORK/pyspy$i.svg" -- "${JOB[@]}" ;;
        perf) run perf perf record -q -F 99 --call-graph dwarf -o "$WORK/perf$i.data" -- "${JOB[@]}" ;;
        esac
    done
done

bare_job=$(cut -d' ' -f1 "$WORK/bare" | median)
bare_wall=$(cut -d' ' -f2 "$WORK/bare" | median)
echo "job: ${JOB[*]}"
echo "runs per configuration: $RUNS (median); $(nproc) CPUs; $(uname -r)"
printf "%-10s %12s %12s %12s %12s\n" config job_s job_ratio wall_s wall_ratio
for c in "${configs[@]}"; do
    j=$(cut -d' ' -f1 "$WORK/$c" | median)
    w=$(cut -d' ' -f2 "$WORK/$c" | median)
    printf "%-10s %12.3f %12.4f %12.3f %12.4f\n" "$c" "$j" "$(echo "$j / $bare_job" | bc -l)" "$w" "$(echo "$w / $bare_wall" | bc -l)"
done
echo "gpuprof (per run): cpu_pct_of_one_core samples lost_records unwind_coverage python_stacks same_instant same_instant_partial unattributed"
cat "$WORK/gpuprof.stats"
echo "gpuprof recording bytes per run: $(tr '\n' ' ' < "$WORK/gpuprof.rec")"

# Post-processing: replicate the sample batches of one recording until it
# holds >= 100k samples, then time `gpuprof report` on it.
python3 - "$WORK/g1/recording/events.jsonl.gz" "$WORK/big/recording/events.jsonl.gz" <<'PY'
import gzip, json, os, sys
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(os.path.dirname(dst), exist_ok=True)
events = [json.loads(l) for l in gzip.open(src, "rt")]
batches = [e for e in events if e["k"] == "samples" and e["kind"] == "native"]
n = sum(len(b["stacks"]) for b in batches)
copies = -(-100_000 // max(n, 1))
footer = [e for e in events if e["k"] == "footer"]
rest = [e for e in events if e["k"] != "footer"]
span = max(e.get("t", 0) for e in events if isinstance(e.get("t"), int)) - events[0]["start"] + 1_000_000
with gzip.open(dst, "wt") as f:
    for e in rest:
        f.write(json.dumps(e) + "\n")
    for c in range(1, copies):
        for b in batches:
            b2 = dict(b)
            b2["t0"] = b["t0"] + c * span
            f.write(json.dumps(b2) + "\n")
    for e in footer:
        e["t"] += copies * span
        f.write(json.dumps(e) + "\n")
print(f"post-processing input: {n * copies} native samples ({copies} copies of {n})")
PY
t0=$(date +%s.%N)
"$GPUPROF" report -q "$WORK/big"
t1=$(date +%s.%N)
echo "gpuprof report on it: $(echo "$t1 - $t0" | bc -l | cut -c1-6) s (all outputs, trace included)"
