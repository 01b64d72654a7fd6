#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), then runs every test with ctest: unit, byte-level
# protocol, robustness, concurrency, PyTorch compatibility and a bounded fuzzing run.
# Fails on any failure. Usage: scripts/test.sh [ctest args...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
build=${DDPRUN_BUILD_DIR:-$root/build}
cd "$build"
# Four slots a core: a test takes the slots of the quarter-cores it keeps busy (tests/CMakeLists.txt).
ctest --output-on-failure -j"${DDPRUN_TEST_JOBS:-$((4 * $(nproc)))}" --timeout 600 "$@"
