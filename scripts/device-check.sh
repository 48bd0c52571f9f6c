#!/usr/bin/env bash
# Real-GPU check: run gpuprof on a small real CUDA training job
# (samples/train_torch.py) with a DataLoader of 1 worker and then 4, and
# print each report's GPU section and the first lines of its summary.
# Needs an NVIDIA GPU, its driver and PyTorch with CUDA; no internet.
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
  "$bin" -o "$out/w$w" -- python3 samples/train_torch.py --workers "$w" --steps "${STEPS:-300}" --augment-ms "${AUGMENT_MS:-1.5}"
  python3 - "$out/w$w/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(json.dumps({"gpu": r.get("gpu"), "coverage": [c for c in r["coverage"] if c["source"].startswith("gpu")]}, indent=1))
for g in r.get("gpus", []):
    g = dict(g)
    print(json.dumps(g, indent=1))
PY
  echo "--- summary.md (first lines) ---"
  head -n 25 "$out/w$w/summary.md"
done
echo "outputs kept in $out"
