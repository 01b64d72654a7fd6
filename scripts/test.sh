#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), then runs every test with ctest: unit, byte-level
# protocol, robustness, concurrency, PyTorch compatibility and a bounded fuzzing run.
# Fails on any failure. Usage: scripts/test.sh [ctest args...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
build=${DDPRUN_BUILD_DIR:-$root/build}
cd "$build"
# Four slots a core; a test takes slots by the CPU it keeps busy (tests/CMakeLists.txt). The cores:
# this process's CPU affinity (nproc, without the OpenMP variables it would obey), fewer where a
# cgroup's CPU quota allows fewer (a container's --cpus).
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
if read -r quota period < /sys/fs/cgroup/cpu.max 2>/dev/null && [[ $quota =~ ^[0-9]+$ ]]; then
  allowed=$(( (quota + period - 1) / period ))
  if (( allowed < cores )); then cores=$allowed; fi
fi
ctest --output-on-failure -j"${DDPRUN_TEST_JOBS:-$((4 * cores))}" --timeout 600 "$@"
