#!/usr/bin/env bash
# Builds the request fuzzer with clang's libFuzzer (ASan + UBSan) and runs it for a bounded time.
# Usage: scripts/fuzz.sh [SECONDS]   (default 30)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-30}
build=$root/build-fuzz
if ! command -v clang++ >/dev/null; then
  echo "fuzz: clang++ not found (scripts/setup.sh installs it)" >&2
  exit 1
fi
cmake -S "$root/fuzz" -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j2 >/dev/null
# Work on a copy of the seed corpus so runs never modify the checkout.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$root"/fuzz/corpus/* "$work"/
cd "$build"
"$build/request_fuzz" -max_total_time="$seconds" -max_len=4096 -rss_limit_mb=2048 -print_final_stats=1 "$work" \
  2>"$build/fuzz.log" || { tail -50 "$build/fuzz.log"; echo "fuzz: FAILED (crash input saved in $build)" >&2; exit 1; }
grep -E "stat::number_of_executed_units|cov:" "$build/fuzz.log" | tail -2
echo "fuzz: no crash in ${seconds} s"
