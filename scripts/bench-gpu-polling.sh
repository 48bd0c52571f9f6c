#!/usr/bin/env bash
# Polling cost of the GPU collector: gpuprof's own CPU time while it polls
# 8 fake GPUs (samples/gpu/eight-gpus.json) every 100 ms, minus the same run
# with --no-gpu, as a percentage of one core. The fake driver runs inside
# gpuprof's process, so its cost is included (an upper bound for a real
# driver's user-space share; a real driver's ioctls are not simulated).
#
#   scripts/bench-gpu-polling.sh              # release build, 30 s runs
#   PROFILE=dev SECS=20 scripts/bench-gpu-polling.sh
#
# Prints one line per run and the difference; exits 1 if the GPU polling
# costs more than 1% of one core.
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${PROFILE:-release}
SECS=${SECS:-30}
INTERVAL=${INTERVAL:-100ms}
case "$PROFILE" in
  dev | debug) dir=debug; flags=() ;;
  *) dir=$PROFILE; flags=(--profile "$PROFILE") ;;
esac
cargo build --quiet "${flags[@]}" -p gpuprof -p fake-nvml
target=$(realpath "${CARGO_TARGET_DIR:-target}/$dir")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
steps=$((SECS * 1000 / 52))
job=(python3 samples/train_sim.py --workers 0 --augment-ms 2 --gpu-ms 50 --steps "$steps")

run() {
  local name=$1
  shift
  GPUPROF_NVML_LIB="$target/libfake_nvml.so" FAKE_NVML_SCENARIO="$PWD/samples/gpu/eight-gpus.json" \
    "$target/gpuprof" -q -o "$tmp/$name" "$@" -- "${job[@]}" >/dev/null
  python3 - "$tmp/$name/report.json" "$name" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
p = r["profiler"]
print(f"{sys.argv[2]:>8}: {r['duration_s']:.1f} s, gpuprof CPU {p['cpu_s']:.3f} s "
      f"({p['cpu_pct_of_one_core']:.2f}% of one core), recording {p.get('recording_bytes', 0)} bytes, "
      f"{len(r['gpus'])} GPUs")
PY
}

run gpu --gpu-interval "$INTERVAL"
run no-gpu --no-gpu
python3 - "$tmp" <<'PY'
import json, sys
a = json.load(open(sys.argv[1] + "/gpu/report.json"))
b = json.load(open(sys.argv[1] + "/no-gpu/report.json"))
cost = a["profiler"]["cpu_s"] / a["duration_s"] * 100 - b["profiler"]["cpu_s"] / b["duration_s"] * 100
rec = (a["profiler"].get("recording_bytes", 0) - b["profiler"].get("recording_bytes", 0)) / a["duration_s"] * 3600 / 1e6
assert len(a["gpus"]) == 8, "the GPU run saw %d GPUs: %s" % (len(a["gpus"]), a["coverage"])
print(f"GPU polling (8 GPUs): {cost:.2f}% of one core; recording +{rec:.1f} MB/hour")
sys.exit(0 if cost <= 1.0 else 1)
PY
