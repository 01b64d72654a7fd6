#!/usr/bin/env bash
# The README's quick start, as written: the commands of its block marked <!-- quickstart --> run
# from the repository's root, one by one (build/ replaced by the build directory under test when
# it is elsewhere). Each must exit 0; each trainer's ranks must agree on their checksum.
# Usage: tests/quickstart_test.sh SOURCE_DIR BUILD_DIR
set -u
source "$(dirname "$0")/lib.sh"
src=$1
build=$2
need python3 awk
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch' 2>/dev/null || skip "Debian's PyTorch (python3-torch) is not installed"
# The block: the fenced lines after the marker; a command continued with \ is one command.
commands=$(awk '/<!-- quickstart -->/ { on = 1; next } on && /^```/ { if (in_block) exit; in_block = 1; next }
                in_block && !/^#/ && NF { print }' "$src/README.md" |
           awk '{ if (sub(/\\$/, "")) { cmd = cmd $0 } else { print cmd $0; cmd = "" } }')
[ -n "$commands" ] || { bad "no commands after <!-- quickstart --> in README.md"; finish; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
n=0
while IFS= read -r cmd; do
  n=$((n + 1))
  run=${cmd//build\//$build/}
  (cd "$src" && TMPDIR=$work timeout 120 bash -c "$run") >"$work/out.$n" 2>&1 </dev/null
  rc=$?
  sums=$(grep -o 'checksum=[^ ]*' "$work/out.$n" | sort -u | wc -l)
  if [ $rc -eq 0 ] && [ "$sums" -le 1 ]; then
    ok "quick start $n exits 0$( [ "$sums" -eq 1 ] && echo ', its ranks agree'): $cmd"
  else
    bad "quick start $n: exit $rc, $sums different checksums: $cmd"
    tail -5 "$work/out.$n"
  fi
done <<<"$commands"
[ $n -ge 3 ] || bad "only $n quick-start commands found"
finish
