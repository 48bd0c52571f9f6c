#!/usr/bin/env bash
# The reference benchmark of what profiling costs the job (issues 8, 38):
# gpuprof side by side in one run with its peers,
# interleaved runs of
#   bare            the job alone
#   gpuprof         gpuprof at 99 Hz (default: the in-process agent)
#   gpuprof-pyspy   gpuprof --python-frames py-spy (no agent)
#   gpuprof-timer   gpuprof --sampler timer (stacks without perf privileges;
#                   run only where this gpuprof has the flag)
#   pyspy           py-spy record --subprocesses (blocking: stops the process
#                   per sample)
#   pyspy-native    py-spy record --subprocesses --native (stops the process
#                   per sample)
#   pyspy-nonblock  py-spy record --subprocesses --nonblocking
#   perf-dwarf      perf record -F 99 --call-graph dwarf (the job's tree)
# on four jobs: a loader job that saturates every core (samples/train_sim.py:
# 4 workers, each batch a CPU-time budget), the loader leaving a core free
# (JOBS=loader-free: 1 worker, the loop waiting 10 ms a step as for a GPU),
# a call-heavy one (scripts/fib_job.py: recursive fib) and a real PyTorch
# DataLoader job with Pillow transforms (JOBS=torch:
# scripts/torch_pillow_job.py, run with TORCH_PY, by default the CI's
# virtual environment); JOBS=loader-work adds the loader with fixed work
# per batch, JOBS=loader16 the loader of 16 Python processes (15 workers,
# STEPS16 steps, 3000 by default: ~13 s) on which gpuprof's own CPU is
# judged, JOBS=ranks8 the same 16 processes as 8 ranks of one worker each
# (STEPS8 steps per rank, 300 by default; the job time is the last rank's). The default is the first four. Reports the median of
# the job's own elapsed time (as the job measures it) as a ratio to bare,
# and gpuprof's own CPU (report.json profiler.cpu_pct_of_one_core, per
# run and by component, with the median's 90% bootstrap interval); and
# the same ratio for the fastest run of each (the least disturbed by a
# noisy host); and the median of the paired ratios (each run against the
# bare run of the same round, run next to it) with a 90% bootstrap
# interval: on a host whose speed drifts by tens of percent from one run
# to the next, the interval says whether a difference was resolved at all.
# The order of the configurations alternates from round to round, so a
# drift within a round favours none of them.
#
# Usage: scripts/bench-pystacks.sh [RUNS] [PYTHON]   (PYSPY=path skips installing py-spy)
#   CONFIGS="bare gpuprof" and JOBS=loader run a subset (bare is always run).
#   CONFIGS="gpuprof gpuprof-base" GPUPROF_BASE=path/to/older/gpuprof compares
#   two builds in one run (paired, round by round): a change worth a few
#   tenths of a percent is lost between two separate runs on a noisy host.
#   Many runs of a subset resolve a smaller difference: e.g.
#   CONFIGS="bare gpuprof" JOBS=loader STEPS=1500 scripts/bench-pystacks.sh 30
# Needs: a release build (cargo build --release), pip (py-spy goes into a
# throw-away venv).
set -euo pipefail

RUNS=${1:-5}
PY=${2:-python3}
PY=$("$PY" -c 'import sys; print(sys.executable)')
ROOT=$(cd "$(dirname "$0")/.." && pwd)
GPUPROF=${GPUPROF:-${CARGO_TARGET_DIR:-$ROOT/target}/release/gpuprof}
WORK=$(mktemp -d /tmp/bench-pystacks.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
[ -x "$GPUPROF" ] || { echo "no release binary at $GPUPROF: run cargo build --release" >&2; exit 1; }

case " ${CONFIGS:-} " in
*" gpuprof-base "*)
    [ -x "${GPUPROF_BASE:-}" ] || { echo "gpuprof-base needs GPUPROF_BASE=path to another gpuprof binary" >&2; exit 1; } ;;
esac

if [ -z "${PYSPY:-}" ]; then
    "$PY" -m venv "$WORK/venv" >/dev/null
    "$WORK/venv/bin/pip" install -q py-spy >/dev/null
    PYSPY="$WORK/venv/bin/py-spy"
fi

LOADER=("$PY" "$ROOT/samples/train_sim.py" --workers 4 --augment-ms 8 --gpu-ms 2 --steps "${STEPS:-150}")
# The same loader with fixed work per batch: `--augment-ms` spends a CPU
# time budget, which absorbs whatever is charged to the worker's thread
# (the agent's signal handler, the kernel's sampling), so only CPU taken
# from other threads shows in the loader job's time; a decoder's fixed work
# takes longer by all of it. ~8 ms per batch at ~0.02 ms per iteration.
LOADER_WORK=("$PY" "$ROOT/samples/train_sim.py" --workers 4 --augment-iters "${AUGMENT_ITERS:-360}" --gpu-ms 2 --steps "${STEPS:-150}")
# 16 Python processes (issue 38's own-CPU job): the loop and 15 workers.
LOADER16=("$PY" "$ROOT/samples/train_sim.py" --workers 15 --augment-ms 8 --gpu-ms 2 --steps "${STEPS16:-3000}")
# 8 ranks of one loader worker each (16 Python processes), each rank's main
# process a training loop, as under torchrun.
RANKS8=(bash -c 'for r in 0 1 2 3 4 5 6 7; do RANK=$r LOCAL_RANK=$r WORLD_SIZE=8 "$0" "$1" --workers 1 --augment-ms 8 --gpu-ms 2 --steps "$2" & done; wait' \
    "$PY" "$ROOT/samples/train_sim.py" "${STEPS8:-300}")
LOADER_FREE=("$PY" "$ROOT/samples/train_sim.py" --workers 1 --augment-ms 8 --gpu-ms 10 --steps "${STEPS:-150}")
CALLS=("$PY" "$ROOT/scripts/fib_job.py" 27 "${FIB_ROUNDS:-12}")
TORCH_PY=${TORCH_PY:-$HOME/.cache/gpuprof-ci/torch-venv/bin/python}
TORCH=("$TORCH_PY" "$ROOT/scripts/torch_pillow_job.py" "${TORCH_STEPS:-40}" 2)
# job_cmd JOB: sets cmd to the job's command line.
job_cmd() {
    case $1 in
    loader) cmd=("${LOADER[@]}") ;;
    loader-work) cmd=("${LOADER_WORK[@]}") ;;
    loader16) cmd=("${LOADER16[@]}") ;;
    ranks8) cmd=("${RANKS8[@]}") ;;
    loader-free) cmd=("${LOADER_FREE[@]}") ;;
    torch) cmd=("${TORCH[@]}") ;;
    *) cmd=("${CALLS[@]}") ;;
    esac
}

# run JOB CONFIG I: one run; appends the job's own seconds to $WORK/JOB.CONFIG
run() {
    local job=$1 cfg=$2 i=$3 cmd out
    job_cmd "$job"
    out="$WORK/$job.$cfg.$i.out"
    case $cfg in
    bare) "${cmd[@]}" > "$out" 2>&1 ;;
    gpuprof) "$GPUPROF" -q -o "$WORK/g.$job.$i" -- "${cmd[@]}" > "$out" 2>&1 ;;
    gpuprof-pyspy) "$GPUPROF" -q -o "$WORK/p.$job.$i" --python-frames py-spy -- "${cmd[@]}" > "$out" 2>&1 ;;
    gpuprof-timer)
        "$GPUPROF" -q -o "$WORK/t.$job.$i" --sampler timer -- "${cmd[@]}" > "$out" 2>&1
        rm -rf "$WORK/t.$job.$i" ;;
    pyspy) "$PYSPY" record --subprocesses -r 99 -o "$WORK/s.$job.$i.svg" -- "${cmd[@]}" > "$out" 2>&1 \
        || echo "$cfg run $i on $job: py-spy exited with status $?" >&2 ;;
    perf-dwarf) perf record -q -F 99 --call-graph dwarf -o "$WORK/perf.$job.$i.data" -- "${cmd[@]}" > "$out" 2>&1 \
        || echo "$cfg run $i on $job: perf exited with status $?" >&2
        rm -f "$WORK/perf.$job.$i.data" ;;
    gpuprof-base) "$GPUPROF_BASE" -q -o "$WORK/base.$job.$i" -- "${cmd[@]}" > "$out" 2>&1 ;;
    # A competitor that crashes (py-spy --native segfaults on some
    # kernels) is reported, not fatal: the job's own time is still read
    # when it got to print it.
    pyspy-native) "$PYSPY" record --subprocesses --native -r 99 -o "$WORK/n.$job.$i.svg" -- "${cmd[@]}" > "$out" 2>&1 \
        || echo "$cfg run $i on $job: py-spy exited with status $?" >&2 ;;
    pyspy-nonblock) "$PYSPY" record --subprocesses --nonblocking -r 99 -o "$WORK/b.$job.$i.svg" -- "${cmd[@]}" > "$out" 2>&1 \
        || echo "$cfg run $i on $job: py-spy exited with status $?" >&2 ;;
    esac
    grep -oE '(steps|fib) in [0-9.]+ s' "$out" | tail -1 | awk '{print $3}' >> "$WORK/$job.$cfg" || true
    grep -oE '(steps|fib) in [0-9.]+ s' "$out" | tail -1 | awk -v i="$i" '{print i, $3}' >> "$WORK/$job.$cfg.paired" || true
    grep -oE 'cpu [0-9.]+ s' "$out" | tail -1 | awk '{print $2}' >> "$WORK/$job.$cfg.cpu" || true
    local d=
    case $cfg in
    gpuprof) d="$WORK/g.$job.$i" ;;
    gpuprof-pyspy) d="$WORK/p.$job.$i" ;;
    gpuprof-base) d="$WORK/base.$job.$i" ;;
    esac
    if [ -n "$d" ]; then
        "$PY" - "$d" >> "$WORK/$job.$cfg.stats" <<'PY'
import gzip, json, sys
d = sys.argv[1]
r = json.load(open(d + "/report.json"))
py = {"native": 0, "python": 0}
for l in gzip.open(d + "/recording/events.jsonl.gz", "rt"):
    e = json.loads(l)
    if e["k"] == "stack_stats":
        py["python" if e.get("kind") == "python" else "native"] += e["busy_ns"] / 1e9
p = r["stacks"]["python"]
# Own CPU by component, in short: the /proc sampler, the perf reader (less
# the wall-clock sampler), the wall-clock sampler, the writer, py-spy's
# sampler, the main thread, the symbolizer.
short = {"/proc sampler": "proc", "perf reader": "perf", "recording writer": "writer",
         "python sampler (py-spy)": "pyspy", "symbolizer": "sym"}
comp = r["profiler"].get("cpu_s_by_component", {})
parts = " ".join(f"{short.get(k, k.split()[0])}={v:.3f}" for k, v in sorted(comp.items()) if v >= 0.001)
print(r["profiler"]["cpu_pct_of_one_core"], round(r["profiler"]["cpu_s"], 3), round(py["native"], 3),
      round(py["python"], 3), p["same_instant"] + p["same_instant_partial"], p["unattributed"], parts)
PY
        rm -rf "$d"
    fi
}

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
# A shared host's noise (steal, other tenants) only ever adds time: the
# fastest run of each configuration is its least disturbed one.
fastest() { sort -n | head -1; }

# paired BARE_FILE CFG_FILE: median of the ratios of runs of the same round,
# and a 90% bootstrap interval of that median.
paired() {
    "$PY" - "$1" "$2" <<'PY'
import random, statistics, sys
def load(p):
    try:
        return {int(a): float(b) for a, b in (l.split() for l in open(p) if l.strip())}
    except FileNotFoundError:
        return {}
bare, cfg = load(sys.argv[1]), load(sys.argv[2])
r = [cfg[i] / bare[i] for i in sorted(cfg) if i in bare and bare[i] > 0]
if len(r) < 2:
    print("-"); sys.exit()
rng = random.Random(1)
meds = sorted(statistics.median(rng.choices(r, k=len(r))) for _ in range(2000))
print(f"{statistics.median(r):.4f} [{meds[100]:.4f}, {meds[1899]:.4f}]")
PY
}

configs=(bare)
for c in ${CONFIGS:-gpuprof gpuprof-timer gpuprof-pyspy pyspy pyspy-native pyspy-nonblock perf-dwarf}; do
    case $c in
    bare) continue ;;
    gpuprof-timer)
        # Only a gpuprof that has the sampler.
        "$GPUPROF" record --help 2>/dev/null | grep -q -- '--sampler' \
            || { echo "skipping gpuprof-timer: $GPUPROF has no --sampler" >&2; continue; } ;;
    perf-dwarf)
        command -v perf >/dev/null || { echo "skipping perf-dwarf: no perf" >&2; continue; } ;;
    esac
    configs+=("$c")
done
jobs=(${JOBS:-loader loader-free calls torch})
echo "python: $PY ($("$PY" -V 2>&1)); $(nproc) CPUs; kernel $(uname -r); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq "$RUNS"); do
    order=("${configs[@]}")
    if [ $((i % 2)) = 0 ]; then
        order=()
        for ((k = ${#configs[@]} - 1; k >= 0; k--)); do order+=("${configs[k]}"); done
    fi
    for job in "${jobs[@]}"; do
        for c in "${order[@]}"; do
            run "$job" "$c" "$i"
        done
    done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg); runs per configuration: $RUNS, interleaved, order alternating (median; fastest run; median of paired ratios [90% bootstrap interval])"
for job in "${jobs[@]}"; do
    job_cmd "$job"
    echo "job: ${cmd[*]}"
    b=$(median < "$WORK/$job.bare")
    bf=$(fastest < "$WORK/$job.bare")
    bc_=$( [ -s "$WORK/$job.bare.cpu" ] && median < "$WORK/$job.bare.cpu" || echo 0)
    printf "  %-15s %9s %8s %9s %8s %9s %8s  %s\n" config job_s ratio fastest ratio job_cpu_s ratio "paired ratio [90%]"
    for c in "${configs[@]}"; do
        if [ ! -s "$WORK/$job.$c" ]; then
            printf "  %-15s %9s\n" "$c" "no run finished"
            continue
        fi
        j=$(median < "$WORK/$job.$c")
        f=$(fastest < "$WORK/$job.$c")
        line=$(printf "  %-15s %9.3f %8.4f %9.3f %8.4f" "$c" "$j" "$(echo "$j / $b" | bc -l)" "$f" "$(echo "$f / $bf" | bc -l)")
        if [ -s "$WORK/$job.$c.cpu" ] && [ "$bc_" != 0 ]; then
            cc=$(median < "$WORK/$job.$c.cpu")
            line+=$(printf " %9.3f %8.4f" "$cc" "$(echo "$cc / $bc_" | bc -l)")
        else
            line+=$(printf " %9s %8s" - -)
        fi
        [ "$c" = bare ] || line+="  $(paired "$WORK/$job.bare.paired" "$WORK/$job.$c.paired")"
        echo "$line"
    done
    if [ -s "$WORK/$job.gpuprof.paired" ] && [ -s "$WORK/$job.gpuprof-timer.paired" ]; then
        echo "  gpuprof-timer / gpuprof, paired: $(paired "$WORK/$job.gpuprof.paired" "$WORK/$job.gpuprof-timer.paired")"
    fi
    if [ -s "$WORK/$job.gpuprof.paired" ] && [ -s "$WORK/$job.gpuprof-base.paired" ]; then
        echo "  gpuprof / gpuprof-base, paired: $(paired "$WORK/$job.gpuprof-base.paired" "$WORK/$job.gpuprof.paired")"
    fi
    for c in gpuprof gpuprof-pyspy gpuprof-base; do
        [ -s "$WORK/$job.$c.stats" ] || continue
        echo "  $c per run: cpu_pct_of_one_core cpu_s native_stack_s python_stack_s same_instant unattributed cpu_s_by_component"
        sed 's/^/    /' "$WORK/$job.$c.stats"
        # gpuprof's own CPU over the runs: median, 90% bootstrap interval.
        awk '{print $1}' "$WORK/$job.$c.stats" > "$WORK/own.$c"
        echo "  $c own CPU, % of one core: $("$PY" - "$WORK/own.$c" <<'PY'
import random, statistics, sys
v = [float(l) for l in open(sys.argv[1]) if l.strip()]
rng = random.Random(1)
m = sorted(statistics.median(rng.choices(v, k=len(v))) for _ in range(2000))
print(f"median {statistics.median(v):.2f} [{m[100]:.2f}, {m[1899]:.2f}], min {min(v):.2f}, max {max(v):.2f}")
PY
)"
    done
done
