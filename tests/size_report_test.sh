#!/usr/bin/env bash
# Every function over ~60 lines has its one-line reason in scripts/size_report.py (docs/
# architecture.md): --strict passes on the tree, and fails on a tree with a long function planted
# without one.
# Usage: tests/size_report_test.sh SOURCE_DIR
set -u
source "$(dirname "$0")/lib.sh"
src=$1
need ctags-universal git python3
if out=$(python3 "$src/scripts/size_report.py" --strict 2>&1); then
  ok "every function over 60 lines of the tree has its reason"
else
  bad "size_report.py --strict fails on the tree: $(grep 'NO REASON' <<<"$out" || tail -5 <<<"$out")"
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/agent"
{
  echo 'int planted_long_function(int x) {'
  for i in $(seq 70); do echo "  x += $i;"; done
  echo '  return x;'
  echo '}'
} >"$tmp/agent/planted.cpp"
git -C "$tmp" init -q && git -C "$tmp" add agent/planted.cpp
if planted=$(python3 "$src/scripts/size_report.py" --strict --root "$tmp" 2>&1); then
  bad "size_report.py --strict passed with a 72-line function planted without a reason: $planted"
fi
if grep -q 'agent/planted.cpp:1 ::planted_long_function: NO REASON' <<<"$planted"; then
  ok "a planted 72-line function without a reason fails --strict, named"
else
  bad "the planted function is not named: $planted"
fi
finish
