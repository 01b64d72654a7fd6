#!/usr/bin/env bash
# --same_user cannot be raced. A client of another user that connects, sends VALIDATE + SET and
# closes at once leaves a socket that the kernel reports as closing (TIME_WAIT: uid 0, inode 0);
# the store must refuse such a connection, never serve it. Played as user nobody against a store
# slowed so that every connection is closed before the store accepts it: stopped (SIGSTOP) for
# the whole burst of 200, then held to 1 % of a CPU by a cgroup quota for a burst of 2,000. The
# figure: keys of uid 65534 applied (must be 0); a root client's SET on the same slowed store is
# served (the store does serve).
# It stops and kills processes: runs inside unshare -m -p -f --mount-proc (its own PID
# namespace: nothing outside it can be signalled by mistake). Needs root, setpriv, unshare and the cgroup cpu controller (v1 or v2): exits 77
# (skipped) without them, or fails when CI=true.
# Usage: tests/store_access_race_test.sh DDPRUN_STORE STORE_ABUSER
set -u
store=$1
abuser=$2
source "$(dirname "$0")/lib.sh"
if [ "${DDPRUN_IN_PRIVATE_NS:-}" != 1 ]; then
  [ "$(id -u)" -eq 0 ] || skip "needs root (to run a client as another user)"
  command -v setpriv >/dev/null || skip "needs setpriv (util-linux)"
  unshare -m -p -f --mount-proc true 2>/dev/null || skip "needs unshare -m -p -f --mount-proc"
  exec env DDPRUN_IN_PRIVATE_NS=1 unshare -m -p -f --mount-proc --propagation private bash "$0" "$@"
fi
dir=$(mktemp -d)
if [ -w /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then
  cgroot=/sys/fs/cgroup/cpu cgversion=1
elif grep -qw cpu /sys/fs/cgroup/unified/cgroup.controllers 2>/dev/null; then
  cgroot=/sys/fs/cgroup/unified cgversion=2
else
  skip "no cgroup cpu controller (v1 /sys/fs/cgroup/cpu or v2 with cpu enabled)"
fi
cg=$cgroot/ddprun-race-test-$$
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$dir"
  [ -d "$cg" ] && { cat "$cg/cgroup.procs" 2>/dev/null | while read -r p; do echo "$p" >"$cgroot/cgroup.procs"; done; rmdir "$cg"; }
}
trap cleanup EXIT
as_nobody() { setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"; }

# Starts a store (same_user is on by default); sets $spid and $port.
start_store() {
  exec 3< <(exec "$store" --port 0 --log_level info 2>"$dir/log.$1")
  spid=$!
  pids+=("$spid")
  read -r -t 10 line <&3 || { echo "FAILED: ddprun-store did not start"; cat "$dir/log.$1"; exit 1; }
  port=${line##*:}
}

failed=0
# check NAME SENT: root's key was served, and nothing of nobody's.
check() {
  "$abuser" legit "$port" /root-was-served || { echo "FAILED: $1: the root client was not served"; failed=1; }
  local keys
  keys=$("$abuser" count "$port") || { echo "FAILED: $1: cannot count keys"; failed=1; return; }
  local foreign=$((keys - 1))
  echo "$1: $foreign of $2 keys from uid 65534 applied; $(grep -c 'refused' "$dir/log.$3") refusal line(s) logged"
  [ "$foreign" -eq 0 ] || { echo "FAILED: $1: $foreign keys of another user were applied"; failed=1; }
}

start_store stop
kill -STOP "$spid"
t0=$(date +%s%N)
as_nobody "$abuser" plant "$port" 200 >/dev/null || { echo "FAILED: the planter failed"; exit 1; }
# The store stays stopped until the kernel has turned every one of those client sockets into a
# time-wait socket (FIN-WAIT-2 or TIME-WAIT; the store's delayed ACK of their FIN decides when),
# which sock_diag reports with uid 0 and inode 0: the race the store must not lose. At most 5 s.
closing() { ss -Htan state fin-wait-2 state time-wait "( dport = :$port )" | wc -l; }
for ((i = 0; i < 100; i++)); do
  n=$(closing)
  [ "$n" -ge 200 ] && break
  sleep 0.05  # polling the kernel's socket table, with a deadline
done
kill -CONT "$spid"
echo "store stopped for $(( ($(date +%s%N) - t0) / 1000000 )) ms while uid 65534 sent 200 connect-SET-close" \
     "($n of their sockets time-wait by then)"
check "SIGSTOP" 200 stop
kill "$spid"

start_store quota
mkdir "$cg" || skip "cannot create a cgroup under $cgroot"
if [ "$cgversion" = 1 ]; then
  echo 100000 >"$cg/cpu.cfs_period_us" && echo 1000 >"$cg/cpu.cfs_quota_us"
else
  echo "1000 100000" >"$cg/cpu.max"
fi || skip "cannot set a CPU quota in $cg"
echo "$spid" >"$cg/cgroup.procs" || skip "cannot move the store into $cg"
t0=$(date +%s%N)
as_nobody "$abuser" plant "$port" 2000 >/dev/null || { echo "FAILED: the planter failed"; exit 1; }
echo "store held to 1 % of a CPU; uid 65534 sent 2000 connect-SET-close in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
echo "$spid" >"$cgroot/cgroup.procs"
check "CPU quota" 2000 quota
kill "$spid"
[ "$failed" -eq 0 ] && echo "passed" || { echo "store log:"; tail -n 5 "$dir/log.stop" "$dir/log.quota"; }
exit "$failed"
