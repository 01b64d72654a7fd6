#!/usr/bin/env bash
# No process outlives its job (README: Security), in both containment modes: as root the workers
# get a cgroup v2 of their own; as `nobody`, who cannot write the cgroup hierarchy, ddprun is a
# child subreaper. Each worker starts `setsid leftover &` (a session of its own: no process group
# kill reaches it). Runs in private mount and pid namespaces (unshare -m -p -f --mount-proc).
#  1. the workers exit 0: ddprun exits 0, names what it killed, and no leftover lives on;
#  2. kill -9 of ddprun while the workers and their leftovers run: the guardian kills them all,
#     ddprun run as it is and through its loader (`ld.so ddprun`);
#  3. the cgroup is removed afterwards (cgroup mode), and so is ddprun's temporary directory in
#     /dev/shm (the guardian removes it; a nested ddprun killed with its job leaves its own);
#  4. a failed group's daemons are killed before the restart, and the next attempt's workers run
#     (killing the cgroup with cgroup.kill there made Linux 6.14+ kill each worker born in it).
# Prints the processes left and the seconds the guardian took. Usage: tests/containment_test.sh DDPRUN
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/private_ns.sh" "$1" -- "$0" "$@"
cp "$(command -v sleep)" /tmp/bin/leftover && chmod 755 /tmp/bin/leftover
export PATH=/tmp/bin:$PATH

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
# The cgroup mode is what ddprun must choose where root can make a cgroup below its own.
own_cgroup=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)$(sed -n 's/^0:://p' /proc/self/cgroup)
if mkdir "$own_cgroup/probe-$$" 2>/dev/null; then rmdir "$own_cgroup/probe-$$"; root_mode=cgroup; else root_mode=subreaper; fi
echo "root can write $own_cgroup: expecting mode '$root_mode' for root"

# Waits (at most 5 s) until the cgroup $1 is gone; says whether it is.
cgroup_gone() {
  local deadline=$((SECONDS + 5))
  while [ -e "$1" ] && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
  [ ! -e "$1" ]
}

# 1. Workers that leave a daemon behind and exit 0: killed when they end, and named. The cgroup,
# the temporary directory and the guardian are gone when ddprun returns, with no wait here.
clean_end() {
  local ev=/tmp/events-$who.jsonl out rc mode left
  rm -rf /dev/shm/ddprun-*
  out=$("${prefix[@]}" ddprun --standalone --nproc_per_node=2 --events_file="$ev" --no_python /bin/sh -c "$escape; exit 0" 2>&1); rc=$?
  local guards shm cg
  guards=$(alive ddprun-guard) shm=$(ls -d /dev/shm/ddprun-* 2>/dev/null)
  mode=$(containment_of "$ev")
  cg=${mode#cgroup }
  left=$(alive leftover)
  echo "$who: containment '$mode'; exit $rc; processes left: $left"
  if [ "$guards" = 0 ] && [ -z "$shm" ] && { [ $want != cgroup ] || [ ! -e "$cg" ]; }; then
    ok "$who ($want, $form): when ddprun returns, its guardian, temporary directory and cgroup are gone"
  else
    bad "$who ($want, $form): when ddprun returned: $guards guardian(s), directory '$shm', cgroup '$cg'"
  fi
  if [ $rc -eq 0 ] && [ "$left" = 0 ] && [[ "$mode" == "$want"* ]] &&
     echo "$out" | grep -q "killed 2 process(es) the workers left behind: "; then
    ok "$who ($want): the daemons the workers left are killed when they end, and named"
  else
    bad "$who ($want): exit $rc, $left left, mode '$mode': $out"
  fi
  pkill -9 -x leftover
}

# 2-4. ddprun killed while its workers run, by `how`: agent (kill -9 of ddprun), group (kill -9
# of ddprun's whole process group, as `timeout -s KILL` or a scheduler does), nested (kill -9
# of a ddprun whose workers are ddprun jobs themselves, each with a daemon).
killed() {
  local how=$1 ev=/tmp/events-$who-$1-$form.jsonl log=/tmp/killed-$who-$1-$form.log want_alive=4 worker pid cg start took
  worker="$escape; exec leftover 301"
  if [ "$how" = nested ]; then
    worker="ddprun --standalone --nproc_per_node=1 --no_python /bin/sh -c '$escape; exec leftover 301'"
  fi
  setsid "${prefix[@]}" ddprun --standalone --nproc_per_node=2 --events_file="$ev" --no_python /bin/sh -c "$worker" >"$log" 2>&1 &
  pid=$!
  if ! wait_alive leftover 20 $want_alive; then
    bad "$who/$how/$form: $want_alive processes never ran ($(alive leftover)): $(cat "$log")"
    kill -9 $pid; pkill -9 -x leftover; return
  fi
  cg=$(containment_of "$ev"); cg=${cg#cgroup }
  if [ $want = cgroup ] && ! { [[ "$cg" == /* ]] && [ -d "$cg" ] && [ -n "$(find "$cg" -name cgroup.procs -exec cat {} +)" ]; }; then
    bad "$who/$how/$form: the workers are not in the job's cgroup '$cg'"
  fi
  # ddprun's own temporary directory: the first made (the nested agents' come after).
  local tmp; tmp=$(ls -dtr /dev/shm/ddprun-* 2>/dev/null | head -1)
  start=$(date +%s.%N)
  if [ "$how" = group ]; then kill -9 -- -$pid; else kill -9 $pid; fi
  wait $pid 2>/dev/null
  if wait_alive leftover 10 0; then
    took=$(awk "BEGIN { printf \"%.2f\", $(date +%s.%N) - $start }")
    ok "$who ($want, $form), kill -9 of the $how: the guardian killed all $want_alive (workers and daemons) in ${took} s"
  else
    bad "$who ($want, $form), kill -9 of the $how: $(alive leftover) of $want_alive processes live on"
  fi
  pkill -9 -x leftover
  if [ $want = cgroup ]; then
    if cgroup_gone "$cg"; then ok "$who/$how/$form: the cgroup is removed"; else bad "$who/$how/$form: cgroup $cg left"; fi
  fi
  local deadline=$((SECONDS + 5))
  while [ -n "$tmp" ] && [ -e "$tmp" ] && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
  if [ -n "$tmp" ] && [ ! -e "$tmp" ]; then
    ok "$who/$how/$form: ddprun's temporary directory $tmp is removed"
  else
    bad "$who/$how/$form: ddprun's temporary directory '${tmp:-none found}' is left: $(ls -R /dev/shm | head -5)"
  fi
  rm -rf /dev/shm/ddprun-*  # a nested job's own
}

# 6. A group that fails and leaves daemons: they are killed before the restart, in the same
# cgroup, and the next attempt's workers run to their end.
restart_after_leftovers() {
  local out rc ran
  out=$("${prefix[@]}" ddprun --standalone --nproc_per_node=2 --max_restarts=1 --no_python /bin/sh -c \
    "if [ \"\$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then $escape; exit 3; fi; echo \"attempt 1, rank \$RANK ran\"" 2>&1); rc=$?
  ran=$(echo "$out" | grep -c "attempt 1, rank [01] ran")
  # Rank 1 may be stopped before its daemon runs, and the helpers of its wait loop are killed too.
  if [ $rc -eq 0 ] && [ "$ran" = 2 ] && [ "$(alive leftover)" = 0 ] &&
     echo "$out" | grep -Eq "killed [0-9]+ process\(es\) the workers left behind: "; then
    ok "$who ($want): a failed group's daemons are killed, and the restarted workers run"
  else
    bad "$who ($want): restart after daemons were killed: exit $rc, $ran of 2 ran, $(alive leftover) left: $out"
  fi
  pkill -9 -x leftover
}

# 8. ddprun started with its standard descriptors closed (`<&- >&- 2>&-`, as some daemons and
# schedulers start programs): the guardian's pipe must not take descriptor 0-2, which the
# guardian points at /dev/null (its end of file then read as the agent's death: the guardian
# quit at once and removed the job's directory under its running workers).
closed_descriptors() {
  local rc
  rm -f /tmp/closed-ok
  "${prefix[@]}" ddprun --standalone --nproc_per_node=1 --no_python /bin/sh -c \
    'sleep 0.5; pgrep -x ddprun-guard >/dev/null && [ -d "$(dirname "$TORCHELASTIC_ERROR_FILE")" ] && touch /tmp/closed-ok' \
    <&- >&- 2>&-; rc=$?
  if [ $rc -eq 0 ] && [ -e /tmp/closed-ok ]; then
    ok "$who ($want): started with descriptors 0-2 closed, the guardian and the job's directory last the job"
  else
    bad "$who ($want): started with descriptors 0-2 closed: exit $rc, guardian or directory gone during the job"
  fi
}

# 5. Subreaper mode: an orphan that cleared its environment is still a descendant of the agent.
no_environment() {
  local out rc
  out=$("${prefix[@]}" ddprun --standalone --nproc_per_node=1 --no_python /bin/sh -c \
    "${escape/setsid leftover/setsid env -i /tmp/bin/leftover}; exit 0" 2>&1); rc=$?
  if [ $rc -eq 0 ] && [ "$(alive leftover)" = 0 ] && echo "$out" | grep -q "killed 1 process(es)"; then
    ok "$who ($want): a daemon with an empty environment is killed too"
  else
    bad "$who ($want): a daemon with an empty environment: exit $rc, $(alive leftover) left: $out"
  fi
  pkill -9 -x leftover
}

# 7. A cgroup namespace whose root is a cgroup below the hierarchy's (a container's, with the
# host's hierarchy mounted: "0::/" in /proc/self/cgroup, but the mount's root is "/.."): the agent
# must not take the mount point for its own cgroup (the hierarchy's root, the host's) and make its
# job's cgroup there.
namespaced_cgroup() {
  local parent=$own_cgroup/ns-$$ ev=/tmp/events-ns.jsonl mode made pid
  mkdir "$parent" || { bad "cannot make $parent"; return; }
  # (the agent's pid names its cgroup, ddprun-PID-...: other jobs, of tests running beside this
  # one, make theirs at the same mount point)
  sh -c "echo \$\$ > /tmp/ns-agent.pid; echo \$\$ > '$parent/cgroup.procs' && exec unshare --cgroup ddprun \
    --standalone --nproc_per_node=1 --events_file='$ev' --no_python /bin/true" >/dev/null 2>&1
  mode=$(containment_of "$ev")
  pid=$(cat /tmp/ns-agent.pid)
  made=$(find "$own_cgroup" -maxdepth 1 -name "ddprun-$pid-*" | wc -l)
  if [[ $mode == subreaper* ]] && [ "$made" = 0 ]; then
    ok "root: in a cgroup namespace below the hierarchy's root, no cgroup is made at the mount point ($mode)"
  else
    bad "root in a cgroup namespace: containment '$mode', $made ddprun cgroup(s) at $own_cgroup"
  fi
  rmdir "$parent" 2>/dev/null
}
if [ "$root_mode" = cgroup ] && command -v unshare >/dev/null; then namespaced_cgroup; fi

# `ddprun` through its loader, for the loader form.
loader=$(readelf -l /tmp/bin/ddprun 2>/dev/null | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
mkdir -p /tmp/bin-loader && chmod 755 /tmp/bin-loader
printf '#!/bin/sh\nexec %s /tmp/bin/ddprun "$@"\n' "$loader" >/tmp/bin-loader/ddprun && chmod 755 /tmp/bin-loader/ddprun

for who in root nobody; do
  want=$root_mode prefix=()
  if [ $who = nobody ]; then want=subreaper prefix=(setpriv --reuid=nobody --regid=nogroup --clear-groups); fi
  # ddprun as it is, and run by its loader by hand (`ld.so ddprun`: /proc/self/exe is the
  # loader, which then starts the guardian by running ddprun again).
  for form in direct loader; do
    if [ $form = loader ]; then
      [ -n "$loader" ] || { bad "no loader named in $(command -v ddprun)'s program headers"; continue; }
      PATH=/tmp/bin-loader:$PATH
    fi
    clean_end
    for how in agent group nested; do killed $how; done
    PATH=${PATH#/tmp/bin-loader:}
  done
  no_environment
  restart_after_leftovers
  closed_descriptors
done

finish
