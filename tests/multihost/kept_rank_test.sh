#!/usr/bin/env bash
# A restart keeps every node's place (docs/rounds-protocol.md, "Running a round"): three
# namespaced hosts meet (--nnodes=3, two workers each: c10d on h1's store, or etcd, a member on
# each host); once all six workers run, the one
# at GROUP_RANK 2, local rank 0, exits 3, so its node sees the failure first and is the first to
# join the next round. Checks: it did arrive first (the order of arrival changed); in the
# restarted attempt every host has the group rank and the global ranks it had (a member's
# workers, their in-memory state and its buddy stay where they were); the job ends 0 on all three.
# Usage: kept_rank_test.sh DDPRUN [c10d|etcd]
set -u
ddprun=$1 backend=${2:-c10d}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/hosts.sh"
case $backend in c10d|etcd) ;; *) echo "unknown backend $backend"; exit 2 ;; esac
hosts_up 3
if [ "$backend" = etcd ]; then
  etcd_up 1 2 3
  rdzv=(--rdzv_backend=etcd "--rdzv_endpoint=$etcd_endpoints" "--rdzv_conf=lease_ttl=2")
else
  rdzv=(--rdzv_backend=c10d --rdzv_endpoint=h1:29400 "--rdzv_conf=keep_alive_interval=0.5,keep_alive_max_attempt=4")
fi

# Attempt 0: each worker says it runs; the crash once all six do. The others wait to be stopped,
# those of the other nodes taking a second to stop: the crash's node is back first.
# Attempt 1: say where each worker is, end.
worker='echo "attempt=$TORCHELASTIC_RESTART_COUNT group=$GROUP_RANK rank=$RANK host=$(hostname)"
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  touch "$KEPT_DIR/up.$RANK"
  if [ "$GROUP_RANK$LOCAL_RANK" = 20 ]; then
    for t in $(seq 600); do [ "$(ls "$KEPT_DIR" | grep -c "^up\.")" -ge 6 ] && exit 3; sleep 0.05; done
    exit 4
  fi
  [ "$GROUP_RANK" = 2 ] && exec sleep 60
  trap "sleep 1; exit 0" TERM
  sleep 60 & wait
fi'
mkdir "$out/up"
for i in 1 2 3; do
  start "$i" "a$i" env KEPT_DIR="$out/up" "$ddprun" --nnodes=3 "${rdzv[@]}" --rdzv_id=kept --max_restarts=1 \
    --nproc_per_node=2 --warm_spares=0 --log_level=debug /bin/sh -c "$worker"
done
codes=
for i in 1 2 3; do
  wait "$(eval echo "\$pid_a$i")"
  codes="$codes $?"
done
[ "$codes" = " 0 0 0" ] && ok "the job restarted once and ended 0 on every host" || bad "exits:$codes (0 0 0 expected)"
crasher=$(grep -l ']:attempt=0 group=2 ' "$out"/a[123].out | head -1)
first=$(grep -l 'round 1: this node arrived as 0 ' "$out"/a[123].err | head -1)
[ -n "$crasher" ] && [ "${crasher%.out}" = "${first%.err}" ] &&
  ok "the node of group rank 2 arrived first in round 1 ($(grep -ho 'round 1: this node arrived as 0 .*' "$first"))" ||
  bad "round 1's first arrival was ${first:-nobody}, not the node of group rank 2 (${crasher:-none})"
for i in 1 2 3; do
  for a in 0 1; do
    place=$(grep "]:attempt=$a " "$out/a$i.out" | sed 's/.*group=\([0-9]*\) rank=\([0-9]*\).*/\1:\2/' | sort | paste -sd,)
    printf -v "place_${i}_$a" '%s' "$place"
  done
  eval "p0=\$place_${i}_0 p1=\$place_${i}_1"
  echo "  h$i: attempt 0 group:rank $p0, attempt 1 $p1"
  [ -n "$p0" ] && [ "$p0" = "$p1" ] && ok "h$i kept its place ($p1)" || bad "h$i moved from $p0 to $p1"
done
[ "${failed:-0}" -eq 0 ] || tail -n 20 "$out"/a*.err
finish
