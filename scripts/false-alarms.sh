#!/usr/bin/env bash
# False alarms on healthy jobs (issue 40): record the healthy sample job
# (enough workers, light work) RUNS times at ~1 s and at ~20 s, without a
# GPU library (CPU side only) and with the fake NVML driver following the
# job's simulated GPU steps (a GPU-bound job), and print one row per run:
# its length, its top finding (the most costly established one), every
# warning or critical finding (an alarm), and the findings only "possible".
# Exits 1 when any run raised an alarm.
#
#   scripts/false-alarms.sh                 # release build, 10 runs each
#   RUNS=3 PROFILE=debug scripts/false-alarms.sh
#   SCENARIOS="cpu-1s gpu-1s" scripts/false-alarms.sh
#
# Run it on a quiet machine: a loaded one changes what a healthy job looks
# like (that case has its own test, healthy_gpu_bound_job_stays_quiet_on_a_busy_machine).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-10}
PROFILE=${PROFILE:-release}
SCENARIOS=${SCENARIOS:-"cpu-1s cpu-20s gpu-1s gpu-20s"}
target=${CARGO_TARGET_DIR:-target}

if [ "$PROFILE" = release ]; then
    cargo build --quiet --release
else
    cargo build --quiet
fi
cargo build --quiet -p fake-nvml --target-dir "$target/fake-nvml"
bin="$target/$PROFILE/gpuprof"
fake="$target/fake-nvml/debug/libfake_nvml.so"

out=$(mktemp -d /tmp/false-alarms.XXXXXX)
trap 'rm -rf "$out"' EXIT

# The healthy sample: 2 workers with 2 ms of augmentation per batch feed a
# 20 ms GPU step (about 25 ms a step); 30 steps ≈ 1 s, 950 steps ≈ 20 s.
steps_of() {
    case "$1" in
    *-1s) echo 30 ;;
    *-20s) echo 950 ;;
    esac
}

printf '%-8s %3s %6s  %-28s %-7s %s\n' scenario run secs "top finding" alarms "possible (info)"
rows="$out/rows"
: >"$rows"
for sc in $SCENARIOS; do
    steps=$(steps_of "$sc")
    for i in $(seq 1 "$RUNS"); do
        dir="$out/$sc-$i"
        job=(python3 samples/train_sim.py --workers 2 --steps "$steps" --augment-ms 2 --gpu-ms 20)
        case "$sc" in
        cpu-*)
            env -u GPUPROF_NVML_LIB "$bin" -q -o "$dir" -- "${job[@]}" >/dev/null 2>"$out/err" ||
                { cat "$out/err" >&2; exit 2; }
            ;;
        gpu-*)
            GPUPROF_NVML_LIB="$fake" FAKE_NVML_SCENARIO=samples/gpu/activity.json \
                GPUPROF_ACTIVITY_LOG="$out/$sc-$i.log" \
                "$bin" -q -o "$dir" -- "${job[@]}" >/dev/null 2>"$out/err" ||
                { cat "$out/err" >&2; exit 2; }
            ;;
        esac
        python3 - "$dir/report.json" "$sc" "$i" <<'EOF' | tee -a "$rows"
import json, sys
r = json.load(open(sys.argv[1]))
fs = r["findings"]
top = next((f["id"] for f in fs if f.get("established", True)), "none")
alarms = [f"{f['id']}({f['severity']})" for f in fs if f["severity"] != "info"]
possible = [f["id"] for f in fs if not f.get("established", True)]
gpu = "" if r["diagnosis"]["gpu_measured"] or sys.argv[2].startswith("cpu") else " NO-GPU-DATA"
print(f"{sys.argv[2]:<8} {sys.argv[3]:>3} {r['duration_s']:6.1f}  {top:<28} "
      f"{(','.join(alarms) or 'none'):<7} {', '.join(possible) or '-'}{gpu}")
EOF
    done
done

echo
python3 - "$rows" <<'EOF'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows:
    by.setdefault(r[0], []).append(r)
bad = 0
for sc, rs in by.items():
    alarms = sum(1 for r in rs if r[4] != "none")
    tops = sorted({r[3] for r in rs})
    bad += alarms
    print(f"{sc}: {len(rs)} runs, {alarms} with a warning or critical finding; top findings: {', '.join(tops)}")
sys.exit(1 if bad else 0)
EOF
