#!/usr/bin/env bash
# Multi-node over a real (virtual) network: two network namespaces joined by a veth pair, one
# ddprun agent in each, the host's address as the endpoint; once with static rendezvous, once
# with c10d (host detected from the namespace's own addresses). Needs root for `ip netns`;
# exits 77 (skipped) where namespaces cannot be made.
# Then ddprun-store's address allow-list across the two "hosts".
# Usage: tests/netns_test.sh DDPRUN TEST_WORKER [DDPRUN_STORE]
set -u
ddprun=$1
worker=$2
store=${3:-}
id=$$
a=ddprun-a-$id b=ddprun-b-$id
net=10.231.$((id % 250 + 1))
cleanup() { ip netns del "$a" 2>/dev/null; ip netns del "$b" 2>/dev/null; }
trap cleanup EXIT
if [ "$(id -u)" -ne 0 ] || ! ip netns add "$a" 2>/dev/null; then
  echo "SKIP: cannot create network namespaces here (needs root and iproute2)"
  exit 77
fi
ip netns add "$b" || { echo "SKIP: second namespace refused"; exit 77; }
ip link add "va$id" netns "$a" type veth peer name "vb$id" netns "$b" || { echo "SKIP: veth refused"; exit 77; }
ip -n "$a" addr add "$net.1/24" dev "va$id"
ip -n "$b" addr add "$net.2/24" dev "vb$id"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "va$id" up
ip -n "$b" link set "vb$id" up
# Port 29400 is free by construction: these namespaces are new and hold nothing else.
fail=0
run_pair() {
  local name=$1; shift
  local out
  out=$(mktemp -d)
  ip netns exec "$a" "$ddprun" "$@" --node_rank=0 --nproc_per_node=2 "$worker" env >"$out/a" 2>"$out/a.err" &
  local pa=$!
  ip netns exec "$b" "$ddprun" "$@" --node_rank=1 --nproc_per_node=2 "$worker" env >"$out/b" 2>"$out/b.err" &
  local pb=$!
  local ra=0 rb=0
  wait $pa || ra=$?
  wait $pb || rb=$?
  local ok=1
  [ $ra -eq 0 ] && [ $rb -eq 0 ] || ok=0
  grep -q "WORLD_SIZE=4" "$out/b" || ok=0
  # The workers' store is group rank 0's: either namespace's address, the same on both.
  local master
  master=$(grep -m1 -o "MASTER_ADDR=$net\.[12]" "$out/a")
  [ -n "$master" ] && grep -q "$master" "$out/b" || ok=0
  [ "$(cat "$out/a" "$out/b" | grep -c '^\[default.\]:RANK=')" -eq 4 ] || ok=0
  if [ $ok -eq 1 ]; then
    echo "ok: $name: 2 namespaces x 2 workers, endpoint $net.1"
  else
    echo "FAILED: $name (exit $ra/$rb)"; cat "$out"/*; fail=1
  fi
  rm -rf "$out"
}
run_pair "static rendezvous" --nnodes=2 --master_addr="$net.1" --master_port=29400
run_pair "c10d rendezvous" --nnodes=2 --rdzv_backend=c10d --rdzv_endpoint="$net.1:29400" --rdzv_id=netns \
  --rdzv_conf=join_timeout=30

# ddprun-store listening on every interface of namespace a: a client in namespace b is refused
# unless its address is in --allow.
probe='import socket,struct,sys
s=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=5)
s.sendall(bytes([0])+struct.pack("<I",0x3C85F7CE)+bytes([13])+struct.pack("<I",7))
try: d=s.recv(4)
except OSError: d=b""
sys.exit(0 if d==struct.pack("<I",7) else 1)'
passed=2
if [ -n "$store" ] && [ -x /usr/bin/python3 ]; then
  check_allow() {
    local name=$1 expect=$2; shift 2
    local out
    out=$(mktemp)
    ip netns exec "$a" "$store" --host "" --port 29500 "$@" >"$out" 2>"$out.err" &
    local ps=$!
    for _ in $(seq 100); do grep -q listening "$out" && break; sleep 0.05; done  # wait for its first line
    local rc=0
    ip netns exec "$b" /usr/bin/python3 -c "$probe" "$net.1" 29500 || rc=$?
    kill $ps; wait $ps 2>/dev/null
    if { [ "$expect" = served ] && [ $rc -eq 0 ]; } || { [ "$expect" = refused ] && [ $rc -ne 0 ] && grep -q "refused a connection from $net.2: not in the allowed addresses" "$out.err"; }; then
      echo "ok: $name"; passed=$((passed + 1))
    else
      echo "FAILED: $name (probe exit $rc)"; cat "$out" "$out.err"; fail=1
    fi
    rm -f "$out" "$out.err"
  }
  check_allow "ddprun-store refuses another host by default (--allow loopback)" refused
  check_allow "ddprun-store serves another host in --allow" served --allow "$net.0/24"
fi
[ $fail -eq 0 ] && echo "$passed passed, 0 failed" || echo "0 passed, 1 failed"
exit $fail
