#!/bin/bash
# Puts each hole of the round-rules simulator's per-hole table (docs/architecture.md) back, one at
# a time (tests/rounds/holes/*.patch), in a scratch worktree of HEAD, and checks that its
# regression seeds fail with it; with --sweep it also runs both CI sweeps per hole and prints what
# they find (the table's counts). The tree you work in is not touched.
#
#   scripts/sim_holes.sh            # about 15 minutes on 2 cores (a build per hole)
#   scripts/sim_holes.sh --sweep    # about 25 minutes
#   scripts/sim_holes.sh [--sweep] 07-given-up-not-fwr 12-expect-last-writer-wins   # only these
#
# After a change of the rules or the simulator's scheduler the schedules move: a seed that no
# longer finds its hole is printed NOT FOUND (exit 1); re-derive it with --sweep and update
# kRegression / kLivenessRegression (tests/rounds/sim_test.cpp) and the table. A patch that no
# longer applies is rewritten against the changed lines.
set -euo pipefail
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
sweep=0
only=" "
for a in "$@"; do
  if [ "$a" = --sweep ]; then
    sweep=1
  elif [ -f "$root/tests/rounds/holes/$a.patch" ]; then
    only="$only$a "
  else
    echo "sim_holes.sh: no hole '$a' (the names are tests/rounds/holes/*.patch without .patch)" >&2
    exit 2
  fi
done

# Which seeds find which hole: safety:N (the safety sweep's check) or live:N (the liveness
# sweep's); and the scenario test that stands for a hole no invariant sees.
declare -A seeds=(
  [01-late-membership]="safety:14058 safety:8504"
  [02-brought-rc]="live:33724"
  [03-streak-per-node]="safety:310 safety:6701 safety:14738"
  [04-ring-changed-before-read]="safety:26539 live:10418"
  [05-finished-at-last-ack]="safety:28746 safety:34965 live:72 live:372"
  [06a-marker-not-at-join]="live:52365 live:105819"
  [06b-marker-not-after-records]="live:52852 live:95772"
  [06c-marker-neither]="safety:81163 live:7409"
  [07-given-up-not-fwr]="safety:9315 safety:56252 live:16313"
  [08-skip-ended-round]="safety:379 live:3"
  [09-spare-never-ends-silent-round]="live:27 live:55"
  [11-wait-end-no-marker]="live:35291 live:53721"
  [12-expect-last-writer-wins]=""
  [13-held-not-watched]="live:106 live:792 live:1396"
  [14-round-key]="safety:63 safety:72 safety:128"
  [15-relaunch-refused-while-marked]="live:349 live:950"
  [16-marker-after-clear]="live:731 live:1551"
)

declare -A scenario=([12-expect-last-writer-wins]="rules: a late end does not lower*")

wt=$(mktemp -d /tmp/ddprun-holes.XXXXXX)
cleanup() { git -C "$root" worktree remove --force "$wt" >/dev/null 2>&1 || rm -rf "$wt"; }
trap cleanup EXIT
git -C "$root" worktree add -q --detach "$wt" HEAD
cd "$wt"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >build.log 2>&1 || { tail -20 build.log; exit 1; }

filter() { [ "$1" = live ] && echo "[liveness]" || echo "sim: seeded*"; }
bad=0
for patch in tests/rounds/holes/*.patch; do
  name=$(basename "$patch" .patch)
  [ "$only" = "  " ] || [[ $only == *" $name "* ]] || continue
  git apply "$patch" || { echo "$name: the patch no longer applies"; bad=1; continue; }
  if ! cmake --build build -j2 --target rounds_sim_tests rounds_tests >build.log 2>&1; then
    echo "$name: does not build with the hole put back"; tail -20 build.log; bad=1; git checkout -q -- .; continue
  fi
  for s in ${seeds[$name]:-}; do
    mode=${s%%:*} seed=${s#*:}
    if DDPRUN_SIM_SEED=$seed build/tests/rounds_sim_tests "$(filter "$mode")" >out.log 2>&1; then
      echo "$name: $mode seed $seed NOT FOUND (replays clean with the hole put back)"; bad=1
    else
      echo "$name: $mode seed $seed found: $(grep -m1 -oE '(step [0-9]+: .{0,80}|liveness: .{0,50})' out.log || true)"
    fi
  done
  if [ -n "${scenario[$name]:-}" ]; then
    if build/tests/rounds_tests "${scenario[$name]}" >out.log 2>&1 && ! grep -q 'No test cases matched' out.log; then
      echo "$name: '${scenario[$name]}' passes with the hole put back: NOT FOUND"; bad=1
    else
      echo "$name: '${scenario[$name]}' fails with the hole put back: found ($(grep -m1 -oE 'FAILED|No test cases matched' out.log))"
    fi
  fi
  if [ $sweep = 1 ]; then
    for mode in safety live; do
      build/tests/rounds_sim_tests "$(filter $mode)" >out.log 2>&1 || true
      echo "$name: $mode sweep: $(grep -m1 'schedules (' out.log || echo '?')"
      grep '^failed seed' out.log | head -4 | cut -c1-160 | sed 's/^/    /' || true
    done
  fi
  git checkout -q -- .
done
exit $bad
