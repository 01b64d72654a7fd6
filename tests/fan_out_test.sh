#!/usr/bin/env bash
# Bounded fan-out: --nproc_per_node beyond the open-file limit is refused at
# once with exit 2 naming RLIMIT_NOFILE (it used to fork ~2,000 workers over 48 s first), and
# 1,000 /bin/true workers start and finish in well under a second (fork of a large agent took
# 3.3 s). The time is the best of three runs: this machine is shared, the floor is not. Given
# SPAWN_FLOOR (bench/spawn_floor.c: posix_spawn 1,000 workers and wait, nothing else), a loaded
# machine is allowed for: a run also passes within 1.5 x the floor's time, measured beside it
# (ddprun took 0.6-0.8 of it on this loaded 2-core machine; fork of a large agent took 3.3 s).
# Usage: tests/fan_out_test.sh DDPRUN [SPAWN_FLOOR]
set -u
source "$(dirname "$0")/lib.sh"
ddprun=$1 floor=${2:-}
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
  best= bound=1 within=
  for run in 1 2 3; do
    if [ -n "$floor" ]; then
      t0=$(now)
      "$floor" launch 1000 /bin/true || { bad "the floor $floor failed"; break; }
      f=$(elapsed "$t0" "$(now)")
      bound=$(awk -v f="$f" 'BEGIN { printf "%.3f", (1.5 * f > 1 ? 1.5 * f : 1) }')
    fi
    t0=$(now)
    out=$("$ddprun" --standalone --nproc_per_node=1000 --no_python /bin/true 2>&1)
    rc=$?
    t=$(elapsed "$t0" "$(now)")
    echo "run $run: 1000 /bin/true workers, exit $rc, $t s wall${f:+ (posix_spawn floor beside it: $f s)}"
    if [ $rc -ne 0 ]; then best=; break; fi
    if [ -z "$best" ] || less "$t" "$best"; then best=$t; fi
    if less "$t" "$bound"; then within="$t s (< $bound s)"; break; fi
  done
  if [ -n "$within" ]; then
    ok "1000 workers started and ended in $within"
  else
    bad "1000 workers: exit $rc, best $best s, last bound $bound s: $(echo "$out" | tail -3)"
  fi
fi
finish
