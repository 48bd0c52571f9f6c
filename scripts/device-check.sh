#!/usr/bin/env bash
# Real-GPU check: run gpuprof on a small real CUDA training job
# (samples/train_torch.py) with a DataLoader of 1 worker and then 4, and
# print each report's GPU section and the first lines of its summary.
# Needs an NVIDIA GPU, its driver and PyTorch with CUDA; no internet.
#
# What to look at (no GPU was available where this was written; these are
# the checks a fake driver cannot make):
# - Idle time (utilization deficit): the job prints its own GPU busy/idle
#   seconds from CUDA events ("GPU busy X s of the Y s training loop: idle
#   Z s"). gpuprof's gpus[].idle.steady_s should be close to Z (a little
#   above: start and end of the loop, and CUDA events count the gaps
#   between a step's own kernels as busy). With 1 worker the input-bound
#   finding's GPU time should be near Z too.
# - GPM (Hopper and newer): gpus[].utilization.source should be "gpm" and
#   sample_period_s the poll interval (0.1); driver_busy_fraction (the
#   driver's 1/6 s samples) should agree with busy_fraction within a few %.
#   On older GPUs source is "driver_samples" and unsupported lists
#   "gpm: not supported ...". Check that GPM sampling every 100 ms costs
#   nothing visible (profiler.cpu_pct_of_one_core, the job's steps/s with
#   and without gpuprof) and that no "gpu.gpm" coverage entry says it
#   stopped. nvml-wrapper passes an nvmlGpmMetricsGet_t with 210 metric
#   slots: a driver whose header has another NVML_GPM_METRIC_MAX must
#   still accept it (version 1).
#
#   scripts/device-check.sh [path/to/gpuprof]   # default: target/release/gpuprof
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-${CARGO_TARGET_DIR:-target}/release/gpuprof}
[ -x "$bin" ] || { echo "device-check: no gpuprof binary at $bin (build with: cargo build --release)" >&2; exit 2; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader || echo "device-check: nvidia-smi not found"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())'
out=$(mktemp -d)
for w in 1 4; do
  echo "=== train_torch.py --workers $w ==="
  "$bin" -o "$out/w$w" -- python3 samples/train_torch.py --workers "$w" --steps "${STEPS:-300}" --augment-ms "${AUGMENT_MS:-1.5}" --gpu-time
  python3 - "$out/w$w/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(json.dumps({"gpu": r.get("gpu"), "coverage": [c for c in r["coverage"] if c["source"].startswith("gpu")]}, indent=1))
for g in r.get("gpus", []):
    g = dict(g)
    print(json.dumps(g, indent=1))
    u, idle = g.get("utilization") or {}, g.get("idle") or {}
    print(f"GPU {g['index']}: source {u.get('source')}, period {u.get('sample_period_s')} s, busy {g.get('busy_fraction')}"
          f" (driver samples: {u.get('driver_busy_fraction')}), idle {idle.get('total_s')} s"
          f" = start-up {idle.get('startup_s')} + steady {idle.get('steady_s')} + shutdown {idle.get('shutdown_s')}"
          " -- compare steady with the job's 'idle Z s (CUDA events)' line above")
for f in r.get("findings", [])[:3]:
    print(f"finding {f['id']} [{f['severity']}]: {f.get('gpu_time_s')} s ({f.get('gpu_time_method')})")
PY
  echo "--- summary.md (first lines) ---"
  head -n 25 "$out/w$w/summary.md"
done
echo "outputs kept in $out"
