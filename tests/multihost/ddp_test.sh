#!/usr/bin/env bash
# PyTorch gloo DDP across two real (namespaced) hosts, h1 and h2, each with its own ddprun agent
# and two workers, for one rendezvous backend:
#   static          --master_addr=h1, node ranks 0 and 1
#   c10d            the rendezvous store hosted by h1's agent (--rdzv_endpoint=h1:PORT)
#   c10d-external   a ddprun-store of its own on h3; no agent hosts it (is_host=0)
#   c10d-secret     c10d, the agents proving a per-job secret to h1's store (secret_file=): each
#                   ddprun hands the job to ddprun-full, which has the OpenSSL the proof needs
#   etcd            a 3-member etcd cluster, one member on each of h1, h2, h3
# Checks: both agents exit 0, every rank of both hosts ends with the same parameters, equal to
# one process training alone. Then node loss: kill -9 of h2's agent mid-training; its workers
# die with it (its guardian); elastic backends go on with h1 alone to the same result; static
# waits for h2, whose agent is started again, and both finish together. (h1's workers see their
# peers vanish and fail: that restart is counted, as under torchrun; --max_restarts=3.)
# Usage: ddp_test.sh BACKEND DDPRUN DDPRUN_STORE
set -u
backend=$1 ddprun=$2 store=$3
here=$(cd "$(dirname "$0")" && pwd)
worker=$here/ddp_worker.py
source "$here/hosts.sh"
source "$here/ddp_checks.sh"
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null ||
  skip_or_fail "PyTorch is not installed (scripts/setup.sh installs python3-torch)"
hosts_up 3
port=29400
fail=0

# The rendezvous flags of this backend for host I (node rank I-1), job RUN_ID.
flags() {
  local i=$1 run=$2
  case $backend in
    static) echo "--nnodes=2 --node_rank=$((i - 1)) --master_addr=h1 --master_port=$port" \
      "--rdzv_conf=keep_alive_interval=0.5,keep_alive_max_attempt=4" ;;
    c10d) echo "--nnodes=1:2 --rdzv_backend=c10d --rdzv_endpoint=h1:$port --rdzv_id=$run" \
      "--rdzv_conf=keep_alive_interval=0.5,keep_alive_max_attempt=4,last_call_timeout=5" ;;
    c10d-secret) echo "--nnodes=1:2 --rdzv_backend=c10d --rdzv_endpoint=h1:$port --rdzv_id=$run" \
      "--rdzv_conf=keep_alive_interval=0.5,keep_alive_max_attempt=4,last_call_timeout=5,secret_file=$out/secret" ;;
    c10d-external) echo "--nnodes=1:2 --rdzv_backend=c10d --rdzv_endpoint=h3:$port --rdzv_id=$run" \
      "--rdzv_conf=is_host=0,keep_alive_interval=0.5,keep_alive_max_attempt=4,last_call_timeout=5" ;;
    etcd) echo "--nnodes=1:2 --rdzv_backend=etcd --rdzv_endpoint=h1:2379,h2:2379,h3:2379 --rdzv_id=$run" \
      "--rdzv_conf=lease_ttl=2,last_call_timeout=5" ;;
    *) echo "unknown backend $backend" >&2; exit 2 ;;
  esac
}

start_agent() {  # NAME HOST STEPS RUN_ID
  local name=$1 i=$2 steps=$3 run=$4
  # shellcheck disable=SC2046
  start "$i" "$name" env DDP_STEPS="$steps" "$ddprun" $(flags "$i" "$run") --max_restarts=3 --nproc_per_node=2 \
    /usr/bin/python3 -u "$worker"
}

service_up() {
  case $backend in
    c10d-secret)
      (umask 077 && head -c 32 /dev/urandom | base64 > "$out/secret") ;;
    c10d-external)
      start 3 store "$store" --host "" --port "$port" --allow "$net.0/24"
      wait_line "$out/store.out" listening 20 || { echo "FAILED: ddprun-store did not start"; cat "$out"/store.*; exit 1; } ;;
    etcd) etcd_up 1 2 3 ;;
  esac
}

check() {  # NAME CONDITION-RESULT
  if [ "$2" -eq 0 ]; then echo "ok: $backend: $1"; else echo "FAILED: $backend: $1"; fail=1; fi
}

together() {
  start_agent a1 1 40 together
  start_agent a2 2 40 together
  wait "$pid_a1"; local r1=$?
  wait "$pid_a2"; local r2=$?
  local ok=0
  [ $r1 -eq 0 ] && [ $r2 -eq 0 ] || ok=1
  [ "$(cat "$out/a1.out" "$out/a2.out" | grep -c 'checksum .* world=4')" -eq 4 ] || ok=1
  same_result 40 "$out/a1.out" "$out/a2.out" || ok=1
  ! grep -q 'restarting' "$out/a1.err" "$out/a2.err" || ok=1
  echo "  exits $r1/$r2; MASTER of the workers: $(grep -ho 'store [0-9.]*:[0-9]*' "$out/a1.err" | head -1)"
  [ $ok -eq 0 ] || { cat "$out/a1.err" "$out/a2.err"; }
  check "PyTorch gloo DDP across h1 and h2, 2 workers each: equal parameters on both hosts" $ok
}

node_loss() {
  # 60 steps of 0.05 s at least: h2 is killed at its step 5, with 2.5 s of training left.
  start_agent b1 1 60 loss
  start_agent b2 2 60 loss
  wait_line "$out/b2.out" 'step 5 ' 120 || { echo "FAILED: no training on h2"; cat "$out"/b*.err; fail=1; return; }
  local victim
  victim=$(agent_pid 2)
  kill -KILL "$victim"
  wait "$pid_b2" 2>/dev/null
  local t0=$SECONDS ok=0 r1
  # Its workers die with it: nothing of the job is left on h2.
  for _ in $(seq 100); do ip netns pids "ns-$id-h2" | xargs -r ps -o args= -p | grep -q ddp_worker || break; sleep 0.05; done
  ip netns pids "ns-$id-h2" | xargs -r ps -o args= -p | grep -q ddp_worker && { echo "  h2's workers outlived its agent"; ok=1; }
  if [ "$backend" = static ]; then
    start_agent b2again 2 60 loss  # static: the node comes back, the job goes on with it
    wait "$pid_b2again"; local r2=$?
    [ $r2 -eq 0 ] || ok=1
  fi
  wait "$pid_b1"; r1=$?
  [ $r1 -eq 0 ] || ok=1
  if [ "$backend" = static ]; then
    same_result 60 "$out/b1.out" "$out/b2again.out" || ok=1
  else
    grep -q 'checksum .* world=2' "$out/b1.out" || ok=1
    same_result 60 "$out/b1.out" || ok=1
  fi
  echo "  h1 exited $r1, $((SECONDS - t0)) s after the kill"
  [ $ok -eq 0 ] || cat "$out"/b*.err
  check "kill -9 of h2's agent mid-training: its workers gone, the job finishes with the same parameters" $ok
}

service_up
together
node_loss
exit $fail
