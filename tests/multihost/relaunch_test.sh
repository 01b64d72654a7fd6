#!/usr/bin/env bash
# A job relaunched with its run id on a backend that outlives its nodes (a ddprun-store of its own
# on h3, or etcd on h3), across two namespaced hosts:
#   1. h1 alone with --nnodes=2 reaches its join_timeout (3 s): exit 1, naming the run id and, since
#      the records outlive it, a new --rdzv_id for other settings. Relaunched on h1 and h2 with the
#      same run id and settings, the two meet at once, in round 1 (the timed-out node abandoned
#      round 0), and run.
#   2. h1 alone, waiting for h2, gets SIGTERM: exit 143, and the stop is kept as the job's end. A
#      relaunch within close_timeout (3 s) is told the stop (exit 143) and when it can start; after
#      it, h1 and h2 meet and run.
# Usage: relaunch_test.sh external|etcd DDPRUN DDPRUN_STORE TEST_WORKER
set -u
variant=$1 ddprun=$2 store=$3 worker=$4
here=$(cd "$(dirname "$0")" && pwd)
source "$here/hosts.sh"
[ "$variant" = etcd ] || { [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null; } ||
  skip_or_fail "PyTorch is not installed (scripts/setup.sh installs python3-torch): its TCPStore reads the store"
hosts_up 3
case $variant in
  external)
    start 3 store "$store" --host "" --port 29400 --allow "$net.0/24"
    wait_line "$out/store.out" listening 20 || { echo "FAILED: ddprun-store did not start"; cat "$out"/store.*; exit 1; }
    rdzv=(--rdzv_backend=c10d --rdzv_endpoint=h3:29400) conf=is_host=0,close_timeout=3 ;;
  etcd)
    etcd_up 3
    rdzv=(--rdzv_backend=etcd --rdzv_endpoint=h3:2379) conf=lease_ttl=2,close_timeout=3 ;;
  *) echo "unknown variant $variant"; exit 2 ;;
esac
fail=0
check() {  # DESCRIPTION CONDITION-RESULT
  if [ "$2" -eq 0 ]; then echo "ok: $variant: $1"; else echo "FAILED: $variant: $1"; fail=1; fi
}
agent() {  # NAME HOST RUN-ID [MORE-RDZV-CONF]
  start "$2" "$1" "$ddprun" --nnodes=2 "${rdzv[@]}" --rdzv_id="$3" "--rdzv_conf=$conf${4:+,$4}" --nproc_per_node=1 "$worker" env
}
agent_on() {  # the ddprun agent on host I (ddprun, or ddprun-full it handed over to)
  ip netns pids "ns-$id-h$1" | xargs -r ps -o pid=,comm= -p | awk '$2 == "ddprun" || $2 == "ddprun-full" {print $1}'
}
arrived() {  # RUN-ID: waits (bounded) until the first arrival's record of round 0 is written
  if [ "$variant" = etcd ]; then
    on 1 /bin/sh -c "for t in \$(seq 200); do ETCDCTL_API=3 etcdctl --endpoints=h3:2379 get --print-value-only /ddprun/$1/r0/node/0 |
      grep -q . && exit 0; sleep 0.05; done; exit 1"
  else
    on 1 /usr/bin/python3 -c "import datetime, torch.distributed as d
d.TCPStore('h3', 29400, is_master=False, timeout=datetime.timedelta(seconds=10)).wait(['ddprun/rdzv/$1/r0/node/0'])"
  fi
}
ended() {  # NAME: its exit status
  local v=pid_$1
  wait "${!v}"
}
both_ran() {  # NAME1 NAME2: both exit 0 in a world of 2
  local rc1 rc2
  ended "$1"; rc1=$?
  ended "$2"; rc2=$?
  [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ "$(cat "$out/$1.out" "$out/$2.out" | grep -c ':WORLD_SIZE=2$')" -eq 2 ]
}

# 1. A join time-out, then a relaunch with the same run id.
agent t1 1 timedout join_timeout=3
ended t1; rc=$?
check "a node alone reaches its join_timeout: exit 1 (got $rc)" $((rc != 1))
grep -q "only 1 of the 2 nodes needed joined round 0" "$out/t1.err" && grep -q "rdzv_id=timedout" "$out/t1.err" &&
  grep -q "a new --rdzv_id (this one keeps its settings" "$out/t1.err"
check "... saying so, with the run id, and a new --rdzv_id for other settings" $?
t0=$SECONDS
agent r1 1 timedout
agent r2 2 timedout
both_ran r1 r2
check "relaunched with the run id on h1 and h2: both run, in a world of 2" $?
grep -q "rendezvous round 1 complete" "$out/r1.err"
check "... meeting in round 1, at once ($((SECONDS - t0)) s; the timed-out node abandoned round 0)" $?

# 2. A stop during the rendezvous, then a relaunch after close_timeout.
agent s1 1 stopped
wait_line "$out/s1.err" "joining the rendezvous" 20 || { echo "FAILED: h1 did not start joining"; cat "$out/s1.err"; exit 1; }
arrived stopped || { echo "FAILED: h1's arrival in round 0 was not written"; cat "$out/s1.err"; exit 1; }
kill -TERM "$(agent_on 1)"
ended s1; rc=$?
check "SIGTERM while h1 waits for h2: exit 143 (got $rc)" $((rc != 143))
agent e1 1 stopped
ended e1; rc=$?
# (told the stop, as the node that waited would have been, on etcd too: its round's records are cleared)
grep -q "stopped by SIGTERM on host h1 during the rendezvous; a relaunch with it can start" "$out/e1.err" && [ $rc -eq 143 ]
check "a relaunch within close_timeout is told the stop and when it can start (exit $rc)" $?
t0=$SECONDS
while ((SECONDS - t0 < 4)); do sleep 0.2; done  # close_timeout (3 s) from the stop, and a second
agent n1 1 stopped
agent n2 2 stopped
both_ran n1 n2
check "after close_timeout, h1 and h2 meet with the run id and run" $?
[ $fail -eq 0 ] || for f in "$out"/*.err; do echo "---- $f"; cat "$f"; done
exit $fail
