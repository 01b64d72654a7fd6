#!/bin/bash
# Puts each hole of the round rules back, one at a time (tests/rounds/holes/*.patch; docs/
# architecture.md, "The holes"), in a scratch worktree of HEAD, and checks that its named scenario
# fails with it (rounds_sim_tests "sim hole NAME: ...": its seeds); with --sweep it also runs both
# CI sweeps per hole and prints what they find (how many schedules fail, the first failing seeds).
# The tree you work in is not touched.
#
#   scripts/sim_holes.sh            # about 15 minutes on 2 cores (a build per hole)
#   scripts/sim_holes.sh --sweep    # about 25 minutes
#   scripts/sim_holes.sh [--sweep] 07-given-up-not-fwr 12-expect-last-writer-wins   # only these
#
# After a change of the rules or the simulator's scheduler the schedules move: a scenario whose
# seeds no longer find its hole is printed NOT FOUND (exit 1); re-derive them with --sweep NAME
# and put them in its scenario (tests/rounds/sim_test.cpp). A patch that no longer
# applies is rewritten against the changed lines.
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

# Each hole's named scenario: rounds_sim_tests "sim hole NAME: ..." (its seeds, tests/rounds/
# sim_test.cpp), or a rules test for a hole no invariant sees.
declare -A scenario=([12-expect-last-writer-wins]="rules: a late end does not lower*")

wt=$(mktemp -d /tmp/ddprun-holes.XXXXXX)
cleanup() { git -C "$root" worktree remove --force "$wt" >/dev/null 2>&1 || rm -rf "$wt"; }
trap cleanup EXIT
git -C "$root" worktree add -q --detach "$wt" HEAD
cd "$wt"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >build.log 2>&1 || { tail -20 build.log; exit 1; }

filter() { [ "$1" = live ] && echo "[liveness]" || echo "sim: seeded*"; }
bad=0
ran=0
for patch in tests/rounds/holes/*.patch; do
  name=$(basename "$patch" .patch)
  [ "$only" = " " ] || [[ $only == *" $name "* ]] || continue
  ran=$((ran + 1))
  git apply "$patch" || { echo "$name: the patch no longer applies"; bad=1; continue; }
  if ! cmake --build build -j2 --target rounds_sim_tests rounds_tests >build.log 2>&1; then
    echo "$name: does not build with the hole put back"; tail -20 build.log; bad=1; git checkout -q -- .; continue
  fi
  if [ -z "${scenario[$name]:-}" ]; then
    if build/tests/rounds_sim_tests "sim hole $name:*" >out.log 2>&1; then
      echo "$name: its scenario replays clean with the hole put back: NOT FOUND"; bad=1
    elif grep -q 'No test cases matched' out.log; then
      echo "$name: no scenario 'sim hole $name: ...' in tests/rounds/sim_test.cpp"; bad=1
    else
      echo "$name: found by $(grep -m1 -oE 'DDPRUN_SIM_SEED=[0-9]+' out.log || true): $(grep -m1 -oE '(step [0-9]+: .{0,80}|liveness: .{0,50})' out.log || true)"
    fi
  fi
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
echo "$ran holes put back: $([ $bad = 0 ] && echo "each found by its scenario" || echo "NOT ALL FOUND (above)")"
[ $ran -gt 0 ] || bad=1
exit $bad
