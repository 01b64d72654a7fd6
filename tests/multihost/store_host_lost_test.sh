#!/usr/bin/env bash
# The c10d backend's single point of failure, bounded: three namespaced hosts train with the
# rendezvous store hosted by h1's agent. h1 is lost while the workers run, (a) by kill -9 of its
# agent and workers, (b) by cutting its network. Every other node must end within its timeouts
# (keep-alive TTL 2 s, read_timeout 5 s), non-zero, with a message that names the lost store host
# (h1:29400) and says what to do (--rdzv_backend=etcd, or an external ddprun-store). Nothing hangs.
# Usage: store_host_lost_test.sh DDPRUN
set -u
ddprun=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/hosts.sh"
source "$here/../lib.sh"
hosts_up 3
rdzv=(--rdzv_backend=c10d --rdzv_endpoint=h1:29400
      "--rdzv_conf=keep_alive_interval=1,keep_alive_max_attempt=2,last_call_timeout=2,read_timeout=5")

play() {  # play NAME HOW(kill|cut)
  local name=$1 how=$2 i
  for i in 1 2 3; do
    start "$i" "$name$i" env TICK_SECONDS=300 "$ddprun" --nnodes=3 --rdzv_id="$name" "${rdzv[@]}" \
      --nproc_per_node=1 /usr/bin/python3 -u "$here/tick_worker.py"
  done
  for i in 1 2 3; do
    wait_line "$out/$name$i.out" 'tick .* world=3' 60 || { bad "$name: h$i's worker never ran"; cat "$out/$name"*.err; return; }
  done
  local t0=$SECONDS
  if [ "$how" = kill ]; then
    ip netns pids "ns-$id-h1" | xargs -r kill -KILL
  else
    ip -n "ns-$id-h1" link set "h1-$id" down
  fi
  local limit=$((SECONDS + 30)) p
  for i in 2 3; do
    p=pid_$name$i
    while kill -0 "${!p}" 2>/dev/null && [ $SECONDS -lt $limit ]; do sleep 0.1; done
    if kill -0 "${!p}" 2>/dev/null; then bad "$name: h$i still runs 30 s after h1 was lost ($how)"; continue; fi
    wait "${!p}"
    local rc=$? err="$out/$name$i.err"
    [ $rc -ne 0 ] && ok "$name: h$i ended (exit $rc) $((SECONDS - t0)) s after h1 was lost ($how)" ||
      bad "$name: h$i exited 0 after losing the store's host"
    if grep -q 'h1:29400' "$err" && grep -q 'rdzv_backend=etcd' "$err" && grep -q 'ddprun-store' "$err"; then
      ok "$name: h$i's message names h1:29400 and says what to do: $(grep -m1 'h1:29400' "$err" | cut -c1-400)"
    else
      bad "$name: h$i's message does not name h1:29400 and the way out (etcd, ddprun-store)"; tail -5 "$err"
    fi
  done
}

play lostkill kill
play lostcut cut
finish
