#!/usr/bin/env bash
# A restart keeps every node's place (docs/rounds-protocol.md, "Running a round"): three
# namespaced hosts meet (c10d, --nnodes=3, two workers each); the worker at GROUP_RANK 2, local
# rank 0, exits 3 in the first attempt, so its node sees the failure first and is the first to
# join the next round. Checks: in the restarted attempt every host has the group rank and the
# global ranks it had (a member's workers, their in-memory state and its buddy stay where they
# were), and the job ends 0 on all three.
# Usage: kept_rank_test.sh DDPRUN
set -u
ddprun=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/hosts.sh"
hosts_up 3

# Attempt 0: the crash, the others wait to be stopped; attempt 1: say where each worker is, end.
worker='echo "attempt=$TORCHELASTIC_RESTART_COUNT group=$GROUP_RANK rank=$RANK host=$(hostname)"
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  [ "$GROUP_RANK$LOCAL_RANK" = 20 ] && { sleep 0.3; exit 3; }
  exec sleep 60
fi'
for i in 1 2 3; do
  start "$i" "a$i" "$ddprun" --nnodes=3 --rdzv_backend=c10d --rdzv_endpoint=h1:29400 --rdzv_id=kept \
    "--rdzv_conf=keep_alive_interval=0.5,keep_alive_max_attempt=4" --max_restarts=1 --nproc_per_node=2 \
    --warm_spares=0 /bin/sh -c "$worker"
done
codes=
for i in 1 2 3; do
  wait "$(eval echo "\$pid_a$i")"
  codes="$codes $?"
done
[ "$codes" = " 0 0 0" ] && ok "the job restarted once and ended 0 on every host" || bad "exits:$codes (0 0 0 expected)"
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
