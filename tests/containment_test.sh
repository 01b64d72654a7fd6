#!/usr/bin/env bash
# No process outlives its job (README: Security), in both containment modes: as root the workers
# get a cgroup v2 of their own; as `nobody`, who cannot write the cgroup hierarchy, ddprun is a
# child subreaper. Each worker starts `setsid leftover &` (a session of its own: no process group
# kill reaches it). Runs in private mount and pid namespaces (unshare -m -p -f --mount-proc).
#  1. the workers exit 0: ddprun exits 0, names what it killed, and no leftover lives on;
#  2. kill -9 of ddprun while the workers and their leftovers run: the guardian kills them all;
#  3. the cgroup is removed afterwards (cgroup mode).
# Prints the processes left and the seconds the guardian took. Usage: tests/containment_test.sh DDPRUN
set -u
source "$(dirname "$0")/private_ns.sh" "$1" "$0" "$@"
cp "$(command -v sleep)" /tmp/bin/leftover && chmod 755 /tmp/bin/leftover
export PATH=/tmp/bin:$PATH
passed=0 failed=0
ok() { echo "ok: $1"; passed=$((passed + 1)); }
bad() { echo "FAILED: $1"; failed=$((failed + 1)); }

# Live (not zombie) processes named $1.
alive() {
  local n=0 p
  for p in $(pgrep -x "$1"); do
    [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" = Z ] || n=$((n + 1))
  done
  echo $n
}
# Waits (at most $2 s) until `alive $1` is $3.
wait_alive() {
  local deadline=$((SECONDS + $2))
  while [ "$(alive "$1")" != "$3" ] && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
  [ "$(alive "$1")" = "$3" ]
}
# A worker's daemon: `setsid leftover &`, waited for until it runs in a session of its own (its
# process group is the worker's until then, and ends with it).
escape='setsid leftover 300 </dev/null >/dev/null 2>&1 &
  sid() { cut -d" " -f6 /proc/$1/stat; }
  while [ "$(sid $!)" = "$(sid $$)" ]; do sleep 0.01; done'
containment_of() { sed -n 's/.*"containment":"\([^"]*\)".*/\1/p' "$1" | head -1; }

for who in root nobody; do
  want=cgroup prefix=()
  if [ $who = nobody ]; then want=subreaper prefix=(setpriv --reuid=nobody --regid=nogroup --clear-groups); fi
  ev=/tmp/events-$who.jsonl
  # 1. Workers that leave a daemon behind and exit 0.
  out=$("${prefix[@]}" ddprun --standalone --nproc_per_node=2 --events_file="$ev" --no_python /bin/sh -c "$escape; exit 0" 2>&1); rc=$?
  mode=$(containment_of "$ev")
  left=$(alive leftover)
  echo "$who: containment '$mode'; exit $rc; processes left: $left"
  if [ $rc -eq 0 ] && [ "$left" = 0 ] && [[ "$mode" == "$want"* ]] &&
     echo "$out" | grep -q "killed 2 process(es) the workers left behind: "; then
    ok "$who ($want): the daemons the workers left are killed when they end, and named"
  else
    bad "$who ($want): exit $rc, $left left, mode '$mode': $out"
  fi
  pkill -9 -x leftover
  if [ $want = cgroup ]; then
    cg=${mode#cgroup }
    if [ -n "$cg" ] && [ ! -e "$cg" ]; then ok "$who: the job's cgroup $cg is removed"; else bad "$who: cgroup '$cg' left"; fi
  fi

  # 2. kill -9 of ddprun: the guardian ends the workers and what they started.
  "${prefix[@]}" ddprun --standalone --nproc_per_node=2 --events_file="$ev.2" --no_python /bin/sh -c "$escape; exec leftover 301" \
    >/tmp/kill9-$who.log 2>&1 &
  pid=$!
  if ! wait_alive leftover 20 4; then
    bad "$who: 4 processes never ran ($(alive leftover)): $(cat /tmp/kill9-$who.log)"
    kill -9 $pid; pkill -9 -x leftover; continue
  fi
  start=$(date +%s.%N)
  kill -9 $pid
  wait $pid 2>/dev/null
  if wait_alive leftover 10 0; then
    took=$(awk "BEGIN { printf \"%.2f\", $(date +%s.%N) - $start }")
    ok "$who ($want): after kill -9 of ddprun the guardian killed all 4 (workers and daemons) in ${took} s"
  else
    bad "$who ($want): after kill -9 of ddprun $(alive leftover) of 4 processes live on"
  fi
  pkill -9 -x leftover
  if [ $want = cgroup ]; then
    cg=$(containment_of "$ev.2"); cg=${cg#cgroup }
    deadline=$((SECONDS + 5))
    while [ -e "$cg" ] && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
    if [ -n "$cg" ] && [ ! -e "$cg" ]; then
      ok "$who: the guardian removed the cgroup"
    else
      bad "$who: cgroup $cg left after kill -9"
    fi
  fi
done

echo "containment: $passed passed, $failed failed"
[ $failed -eq 0 ]
