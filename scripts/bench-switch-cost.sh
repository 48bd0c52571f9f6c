#!/usr/bin/env bash
# What the perf events gpuprof puts on every thread of the job cost each of
# that thread's context switches (see scripts/switch-cost.c): for each kind
# of event, bare against one and two events per thread. A thread of a Python
# process carries two sampling events under gpuprof (the inherited per-CPU
# event and the agent's), any other thread one; multiply by the job's
# context switches per second (`perf stat -e context-switches -- JOB`).
#
# Usage: scripts/bench-switch-cost.sh [CYCLES]   (needs gcc)
set -euo pipefail
CYCLES=${1:-40}
WORK=$(mktemp -d /tmp/bench-switch.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
gcc -O2 -pthread -o "$WORK/switch-cost" "$(dirname "$0")/switch-cost.c"
echo "$(nproc) CPUs; kernel $(uname -r); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for kind in sampling task count dummy; do
    "$WORK/switch-cost" "$CYCLES" "$kind"
done
