#!/usr/bin/env bash
# Bounded fan-out: --nproc_per_node beyond the open-file limit is refused at
# once with exit 2 naming RLIMIT_NOFILE (it used to fork ~2,000 workers over 48 s first), and
# 1,000 /bin/true workers start and finish in well under a second (fork of a large agent took
# 3.3 s). The time is the best of three runs: this machine is shared, the floor is not.
# Usage: tests/fan_out_test.sh DDPRUN
set -u
source "$(dirname "$0")/lib.sh"
ddprun=$1
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
less() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }

# 1. 100,000 workers with 4,000 descriptors: refused before anything starts.
t0=$(now)
out=$( (ulimit -n 4000 && exec timeout 60 "$ddprun" --standalone --nproc_per_node=100000 --no_python /bin/true) 2>&1)
rc=$?
t=$(elapsed "$t0" "$(now)")
echo "--nproc_per_node=100000 under ulimit -n 4000: exit $rc in $t s"
if [ $rc -eq 2 ] && echo "$out" | grep -q "RLIMIT_NOFILE (ulimit -n) is 4000" && less "$t" 2; then
  ok "refused at once with exit 2, naming RLIMIT_NOFILE: $(echo "$out" | head -1)"
else
  bad "exit $rc after $t s: $(echo "$out" | tail -3)"
fi

# 2. 1,000 workers: started and ended in under a second (best of three runs).
# (root may raise the hard limit; a user below it cannot run this part, so the test skips whole)
if [ "$(ulimit -Hn)" != unlimited ] && [ "$(ulimit -Hn)" -lt 9064 ] && ! ulimit -Hn 9064 2>/dev/null; then
  skip "the hard open-file limit $(ulimit -Hn) is below the 9064 that 1,000 workers need"
fi
ulimit -n "$(ulimit -Hn)"
if true; then
  best=
  for run in 1 2 3; do
    t0=$(now)
    out=$("$ddprun" --standalone --nproc_per_node=1000 --no_python /bin/true 2>&1)
    rc=$?
    t=$(elapsed "$t0" "$(now)")
    echo "run $run: 1000 /bin/true workers, exit $rc, $t s wall"
    if [ $rc -ne 0 ]; then best=; break; fi
    if [ -z "$best" ] || less "$t" "$best"; then best=$t; fi
    less "$best" 1 && break
  done
  if [ -n "$best" ] && less "$best" 1; then
    ok "1000 workers started and ended in $best s (< 1 s)"
  else
    bad "1000 workers: exit $rc, best $best s: $(echo "$out" | tail -3)"
  fi
fi
finish
