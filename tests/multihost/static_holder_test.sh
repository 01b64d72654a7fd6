#!/usr/bin/env bash
# Static ranks across three namespaced hosts: h2's agent arrives in round 0 (h1 and h2 wait there
# for h3) and is killed with -9. Its replacement on h2 must get rank 1, not be refused "node rank
# in use" (the store has no liveness for a node before its round runs: it was, at join_timeout,
# and so was every later one): once the dead holder's `held` counter stayed still for the TTL + 2
# x read_timeout, it abandons round 0; h3 comes, and the three train PyTorch gloo DDP (h1 two
# workers, h2 and h3 one: a world of 4, whose equal shards give one process's parameters).
#   hosted     the rendezvous store in h1's agent (--master_addr=h1)
#   external   a ddprun-store of its own on h1; every agent is_host=0
# Usage: static_holder_test.sh hosted|external DDPRUN DDPRUN_STORE
set -u
variant=$1 ddprun=$2 store=$3
here=$(cd "$(dirname "$0")" && pwd)
source "$here/hosts.sh"
source "$here/ddp_checks.sh"
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null ||
  skip_or_fail "PyTorch is not installed (scripts/setup.sh installs python3-torch)"
hosts_up 3
port=29400 steps=30
conf="keep_alive_interval=0.5,keep_alive_max_attempt=4,read_timeout=2,join_timeout=60"
[ "$variant" = external ] && conf+=",is_host=0"

start_agent() {  # NAME HOST
  start "$2" "$1" env DDP_STEPS=$steps "$ddprun" --nnodes=3 --node_rank=$(($2 - 1)) --master_addr=h1 \
    --master_port=$port --rdzv_conf=$conf --nproc_per_node=$(($2 == 1 ? 2 : 1)) /usr/bin/python3 -u "$here/ddp_worker.py"
}
# Waits on h1 until the rendezvous store holds every key of KEYS (PyTorch's TCPStore client).
store_wait() {
  on 1 /usr/bin/python3 -c "import sys, datetime, torch.distributed as d
s = d.TCPStore('h1', $port, is_master=False, timeout=datetime.timedelta(seconds=30))
s.wait(['ddprun/rdzv/none/' + k for k in sys.argv[1:]])" "$@"
}

if [ "$variant" = external ]; then
  start 1 store "$store" --host "" --port "$port" --allow "$net.0/24"
  wait_line "$out/store.out" listening 20 || { echo "FAILED: ddprun-store did not start"; cat "$out"/store.*; exit 1; }
fi
start_agent a1 1
[ "$variant" = hosted ] && { wait_line "$out/a1.err" 'hosting the rendezvous store' 20 || { cat "$out/a1.err"; exit 1; }; }
start_agent a2 2
store_wait r0/node/0 r0/node/1 || { echo "FAILED: h1 and h2 did not arrive in round 0"; cat "$out"/a*.err; exit 1; }
kill -KILL "$(agent_pid 2)"
wait "$pid_a2" 2>/dev/null
t0=$SECONDS
start_agent b2 2
wait_line "$out/b2.err" 'stopped showing it is alive' 40 ||
  { echo "FAILED: h2's replacement did not give the dead holder's round up"; cat "$out"/a1.err "$out"/b2.err; exit 1; }
echo "  h2's replacement gave round 0 up $((SECONDS - t0)) s after it started (TTL 2 s + 2 x read_timeout 2 s)"
start_agent a3 3
fail=0
for n in a1 b2 a3; do
  v=pid_$n
  wait "${!v}" || { echo "FAILED: $n exited $?"; fail=1; }
done
grep -q 'already held' "$out/b2.err" && { echo "FAILED: h2's replacement was refused"; fail=1; }
[ "$(cat "$out"/a1.out "$out"/b2.out "$out"/a3.out | grep -c 'checksum .* world=4')" -eq 4 ] ||
  { echo "FAILED: not every rank trained in a world of 4"; fail=1; }
same_result $steps "$out"/a1.out "$out"/b2.out "$out"/a3.out || fail=1
[ $fail -eq 0 ] && echo "ok: static ($variant): a rank whose holder was killed before its round closed went to its replacement; DDP across 3 hosts" ||
  cat "$out"/a1.err "$out"/b2.err "$out"/a3.err
exit $fail
