#!/usr/bin/env bash
# A hang across two namespaced hosts (README: Hangs): PyTorch gloo DDP, h1 and h2 with two
# workers each (static node ranks: h1 holds ranks 0-1, h2 ranks 2-3; the store on h1's agent); at
# step 5 rank R gets stuck in Python
# outside any collective (tests/python/hang_worker.py). Every rank goes silent; each node reads
# its own ranks, puts their summary in the workers' store, and one gathers them: both nodes must
# print the same job-wide verdict, naming rank R and its host, the node holding rank R its stack,
# and both end 124, their failure summaries naming rank R as the root cause. Run with the stuck
# rank on h1 (rank 1), and on h2 (rank 3) after a 7 s save on rank 0 at step 8 and, right after
# it, a 20 s evaluation loop on rank 0 alone (forward passes, the other ranks in a barrier; a
# 10 s floor, longer than the save, as at an epoch's end): h1 knows its rank saves or works and
# says so in the workers' store from the save's end on, h2 reads the store's count of saves
# before it reports its silent ranks, so neither takes the save or the evaluation for a hang.
# The two jobs side by side.
# Usage: hang_test.sh DDPRUN
set -u
ddprun=$1
here=$(cd "$(dirname "$0")" && pwd)
worker=$here/../python/hang_worker.py
source "$here/hosts.sh"
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null ||
  skip_or_fail "PyTorch is not installed (scripts/setup.sh installs python3-torch)"
hosts_up 2
fail=0

start_case() {  # STUCK_RANK [WORKER FLAGS...]: both nodes' agents, on master port $port
  local rank=$1 i
  shift
  for i in 1 2; do
    start "$i" "r${rank}p${port}h$i" "$ddprun" --nnodes=2 --node_rank=$((i - 1)) --master_addr=h1 --master_port=$port \
      --rdzv_conf=keep_alive_interval=0.5,keep_alive_max_attempt=10 --nproc_per_node=2 \
      --hang_floor="${floor:-3}" --hang_stop=10 /usr/bin/python3 -u "$worker" --hang stuck --rank "$rank" --at 5 --steps 100000 \
      "$@"
  done
}

check_case() {  # STUCK_RANK STUCK_HOST PORT [WORKER FLAGS...]: waits for that case's agents
  local rank=$1 host=$2 tag=r$1p$3 r1 r2
  shift 3
  local extra=("$@")
  local p1=pid_${tag}h1 p2=pid_${tag}h2
  wait "${!p1}"; r1=$?
  wait "${!p2}"; r2=$?
  local e1=$out/${tag}h1.err e2=$out/${tag}h2.err ok=0
  local v1 v2
  v1=$(grep -h "ddprun: hang verdict from every node" "$e1" | tail -1)
  v2=$(grep -h "ddprun: hang verdict from every node" "$e2" | tail -1)
  echo "  rank $rank on $host: exits $r1/$r2"
  echo "  h1: $v1"
  echo "  h2: $v2"
  [ "$r1" -eq 124 ] && [ "$r2" -eq 124 ] || ok=1
  [ -n "$v1" ] && [ "$v1" = "$v2" ] || ok=1
  echo "$v1" | grep -q "rank $rank (host $host, pid [0-9]*) is stuck outside any collective in load_batch" || ok=1
  grep -q "load_batch (hang_worker.py" "$out/${tag}h${host#h}.err" || ok=1
  for i in 1 2; do  # both summaries name the stuck rank as the root cause
    grep -A4 "Root cause" "$out/${tag}h$i.err" | grep -q "rank       : $rank " || { echo "  h$i: another root cause"; ok=1; }
  done
  [ $ok -eq 0 ] || cat "$e1" "$e2"
  if [ $ok -eq 0 ]; then echo "ok: stuck rank $rank on $host${extra[*]:+ (${extra[*]})}: both nodes print the same verdict naming it"; else
    echo "FAILED: stuck rank $rank on $host ${extra[*]}"; fail=1; fi
}

# The two cases are two jobs side by side (master ports 29400 and 29401): each mostly waits for
# its floor and its --hang_stop.
port=29400
start_case 1
port=29401
floor=10 start_case 3 --at 50 --save_at 8 --save_s 7 --eval_at 8 --eval_s 20 --eval_rank 0
check_case 1 h1 29400
check_case 3 h2 29401 --at 50 --save_at 8 --save_s 7 --eval_at 8 --eval_s 20 --eval_rank 0
if grep -q "rank 0 is saving a checkpoint" "$out/r3p29401h1.err" &&
  grep -q "a rank of another node is saving a checkpoint" "$out/r3p29401h2.err" &&
  ! grep -q "made progress again" "$out/r3p29401h1.err" "$out/r3p29401h2.err" &&
  [ "$(cat "$out/r3p29401h1.err" "$out/r3p29401h2.err" | grep -c "hang verdict from every node")" -eq 2 ]; then
  echo "ok: the 7 s save and the 20 s evaluation after it on h1 were taken for a hang on neither node"
else
  echo "FAILED: the save or the evaluation on h1 was reported as a hang, or not seen on both nodes"; fail=1
fi
exit $fail
