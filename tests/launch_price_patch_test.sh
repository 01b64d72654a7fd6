#!/usr/bin/env bash
# bench/launch_price.py builds ddprun with bench/launch_price.patch applied: the patch still
# applies to the tree, and the bench script parses.
# Usage: tests/launch_price_patch_test.sh SOURCE_DIR
set -u
source "$(dirname "$0")/lib.sh"
src=$1
need git python3
if out=$(git -C "$src" apply --check bench/launch_price.patch 2>&1); then
  ok "bench/launch_price.patch applies to the tree"
else
  bad "bench/launch_price.patch no longer applies (refresh it from a worktree: see bench/launch_price.py): $out"
fi
if python3 -c "import ast, sys; ast.parse(open(sys.argv[1]).read())" "$src/bench/launch_price.py" 2>&1; then
  ok "bench/launch_price.py parses"
else
  bad "bench/launch_price.py does not parse"
fi
finish
