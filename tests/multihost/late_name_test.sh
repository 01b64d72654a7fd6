#!/usr/bin/env bash
# A master or rendezvous name that does not resolve yet, as on Kubernetes (a JobSet pod's name
# under its headless service appears once the pod runs): two namespaced hosts, h1 and h2, start
# their agents while the name is in no hosts file; 3 s later it is added to every host's hosts
# file. Both agents say once that they wait for it, then the job runs across both hosts (the
# workers on h2 use the workers' store on h1). Then a name that never resolves: the agent gives
# up after the join time-out, saying which name and what to check.
#   static   --master_addr=job-node-0-0.job (h1, node rank 0, hosts the store)
#   c10d     --rdzv_endpoint=job-node-0-0.job:29400 (h1 learns that the name is its own only
#            once it resolves, and hosts the store then)
#   etcd     --rdzv_endpoint=etcd-0.etcd:2379 (one member on h3)
# Usage: late_name_test.sh BACKEND DDPRUN TEST_WORKER
set -u
backend=$1 ddprun=$2 worker=$3
here=$(cd "$(dirname "$0")" && pwd)
source "$here/hosts.sh"
hosts_up 3
# The flags of host I, with NAME for the late name, and --rdzv_conf CONF.
flags() {
  local i=$1 n=$2 conf=$3
  case $backend in
    static) echo "--nnodes=2 --node_rank=$((i - 1)) --master_addr=$n --master_port=29400 --rdzv_conf=$conf" ;;
    c10d) echo "--nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=$n:29400 --rdzv_id=late --rdzv_conf=$conf" ;;
    etcd) echo "--nnodes=2 --rdzv_backend=etcd --rdzv_endpoint=$n:2379 --rdzv_id=late --rdzv_conf=lease_ttl=2,$conf" ;;
  esac
}
case $backend in
  static|c10d) name=job-node-0-0.job name_host=1 ;;
  etcd) name=etcd-0.etcd name_host=3
        etcd_up 3 ;;
  *) echo "unknown backend $backend"; exit 2 ;;
esac
fail=0
check() {  # DESCRIPTION CONDITION-RESULT
  if [ "$2" -eq 0 ]; then echo "ok: $backend: $1"; else echo "FAILED: $backend: $1"; fail=1; fi
}

for i in 1 2; do
  # shellcheck disable=SC2046
  start "$i" "a$i" "$ddprun" $(flags "$i" "$name" join_timeout=60) --nproc_per_node=1 "$worker" env store_set:from_h$i
done
for i in 1 2; do
  wait_line "$out/a$i.err" "waiting for $name to resolve" 30 ||
    { echo "FAILED: h$i's agent did not wait for $name"; cat "$out"/a*.err; exit 1; }
done
sleep 3  # the name appears 3 s later (the scenario, not synchronisation)
for i in 1 2 3; do echo "$(addr "$name_host") $name" >>"/etc/netns/ns-$id-h$i/hosts"; done
wait "$pid_a1"; r1=$?
wait "$pid_a2"; r2=$?
ok=0
[ $r1 -eq 0 ] && [ $r2 -eq 0 ] || ok=1
for i in 1 2; do
  [ "$(grep -c "waiting for $name to resolve" "$out/a$i.err")" -eq 1 ] || { echo "  h$i did not say it waits, once"; ok=1; }
  grep -q "$name resolves to $(addr "$name_host")" "$out/a$i.err" || { echo "  h$i did not say the name resolved"; ok=1; }
  grep -q "WORLD_SIZE=2" "$out/a$i.out" || { echo "  h$i's worker did not run in a world of 2"; ok=1; }
done
echo "  exits $r1/$r2"
[ $ok -eq 0 ] || cat "$out"/a*.err "$out"/a*.out
check "$name resolves 3 s after both agents started: they wait, then the job runs across h1 and h2" $ok

# A name that never resolves: the join time-out (4 s) ends the wait with a clear error.
t0=$SECONDS
# shellcheck disable=SC2046
on 2 "$ddprun" $(flags 2 "never.$name" join_timeout=4) --nproc_per_node=1 "$worker" env \
  >"$out/never.out" 2>"$out/never.err"
r=$? took=$((SECONDS - t0)) ok=0
[ $r -eq 1 ] || ok=1
grep -qE "never.$name did not resolve within 4(\.[0-9])? s \(--rdzv_conf join_timeout\)" "$out/never.err" || ok=1
[ $took -ge 4 ] && [ $took -le 15 ] || ok=1
echo "  exit $r after $took s: $(grep 'did not resolve' "$out/never.err")"
[ $ok -eq 0 ] || cat "$out/never.err"
check "a name that never resolves: exit 1 after the join time-out, naming it" $ok
exit $fail
