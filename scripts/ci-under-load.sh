#!/usr/bin/env bash
# The whole suite with a CPU hog on every core: a finding that vanishes
# when the machine is busy is a wrong answer on a busy server, and a test
# that fails only under load is a flaky test. Issue 36 asks for the suite
# to pass here too.
#
#   scripts/ci-under-load.sh              # .ci/run under load
#   scripts/ci-under-load.sh cargo test --workspace --test diagnose
#
# HOGS (default: the number of cores) busy loops run at the same priority
# as the tests for the whole run and are stopped however the run ends; the
# load average before and after is printed with the command's status.
set -uo pipefail
cd "$(dirname "$0")/.."
hogs=${HOGS:-$(nproc)}
pids=()
stop() {
  [ ${#pids[@]} -gt 0 ] && kill "${pids[@]}" 2>/dev/null
  wait 2>/dev/null
}
trap stop EXIT INT TERM
for _ in $(seq "$hogs"); do
  sh -c 'while :; do :; done' &
  pids+=($!)
done
echo "ci-under-load: $hogs CPU hog(s) on $(nproc) core(s); load average $(cut -d' ' -f1-3 /proc/loadavg)"
start=$(date +%s)
if [ $# -gt 0 ]; then
  "$@"
else
  bash .ci/run
fi
rc=$?
echo "ci-under-load: exit $rc after $(( $(date +%s) - start )) s; load average $(cut -d' ' -f1-3 /proc/loadavg)"
exit "$rc"
