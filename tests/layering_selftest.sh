#!/usr/bin/env bash
# layering_test.sh catches what it is there for: run on copies of the agent's sources, it passes
# on the copy as it is and on an include that goes up (a room above including one below it),
# and fails on each planted upward include: of a room's header, of a public ddprun/agent
# header implemented in a room below (directly, or through another public header that includes
# it), of ddprun/agent/agent.hpp (agent.cpp's, above every room), and issue 43's own case:
# spawn.cpp back in workers/, where containment.hpp and observe's stack_dump.cpp include its
# public header.
# Usage: tests/layering_selftest.sh SOURCE_DIR
set -u
source "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
[ -d "$1/agent/src" ] && [ -d "$1/agent/include" ] || skip "no agent/src and agent/include under $1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A fresh copy of the sources in $tmp/copy.
fresh() {
  rm -rf "$tmp/copy"
  mkdir -p "$tmp/copy/agent"
  cp -r "$1/agent/src" "$1/agent/include" "$tmp/copy/agent/"
}
# A file of `room` (its first .cpp) gets one more include: `header`.
plant() {
  local f
  f=$(ls "$tmp/copy/agent/src/$1"/*.cpp | head -n 1)
  printf '#include "%s"\n' "$2" >>"$f"
}
# The layering test on the copy: `want` pass, or fail with `text` in its output.
expect() {
  local want=$1 text=$2 what=$3 out rc
  out=$(bash "$here/layering_test.sh" "$tmp/copy" 2>&1)
  rc=$?
  if [ "$want" = pass ]; then
    [ "$rc" -eq 0 ] && ok "passes: $what" || bad "fails on $what (exit $rc): $out"
  elif [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ] && grep -qF -- "$text" <<<"$out"; then
    ok "fails: $what"
  else
    bad "does not fail as it should on $what (exit $rc, wanted '$text'): $out"
  fi
}

fresh "$1"
expect pass "" "the sources as they are"

fresh "$1"
plant containment "workers/worker_group.hpp"
expect fail "includes workers/worker_group.hpp: workers is a room, below containment" "containment including workers/worker_group.hpp"

fresh "$1"
plant metrics "host/numa_binding.hpp"
expect pass "" "metrics including host/numa_binding.hpp (a room above it)"

# A public header implemented in workers/ (its .cpp's first include), and one that only
# declares things but includes it.
fresh "$1"
printf '#pragma once\nnamespace ddprun::agent { void planted(); }\n' >"$tmp/copy/agent/include/ddprun/agent/planted.hpp"
printf '#include "ddprun/agent/planted.hpp"\n\nnamespace ddprun::agent { void planted() {} }\n' \
  >"$tmp/copy/agent/src/workers/planted_impl.cpp"
printf '#pragma once\n#include "ddprun/agent/planted.hpp"\n' >"$tmp/copy/agent/include/ddprun/agent/planted_wrap.hpp"
cp -r "$tmp/copy" "$tmp/planted"
plant control "ddprun/agent/planted.hpp"
plant metrics "ddprun/agent/planted_wrap.hpp"
expect pass "" "control and metrics including a public header implemented in workers"
rm -rf "$tmp/copy" && cp -r "$tmp/planted" "$tmp/copy"
plant containment "ddprun/agent/planted.hpp"
expect fail "includes ddprun/agent/planted.hpp: implemented in workers, below containment" \
  "containment including a public header implemented in workers"
rm -rf "$tmp/copy" && cp -r "$tmp/planted" "$tmp/copy"
plant host "ddprun/agent/planted_wrap.hpp"
expect fail "includes ddprun/agent/planted_wrap.hpp: implemented in workers (through ddprun/agent/planted.hpp), below host" \
  "host including a public header that includes one implemented in workers"

fresh "$1"
plant metrics "ddprun/agent/agent.hpp"
expect fail "includes ddprun/agent/agent.hpp: implemented in agent.cpp, below metrics" "metrics including ddprun/agent/agent.hpp"

# Issue 43: spawn.cpp in workers/, its public header included by containment.hpp.
fresh "$1"
mv "$tmp/copy/agent/src/containment/spawn.cpp" "$tmp/copy/agent/src/workers/spawn.cpp"
expect fail "containment/containment.hpp includes ddprun/agent/spawn.hpp: implemented in workers, below containment" \
  "spawn.cpp in workers/ (issue 43)"

finish
