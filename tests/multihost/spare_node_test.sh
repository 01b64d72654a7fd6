#!/usr/bin/env bash
# A hot spare node across namespaced hosts: --nnodes=2 with three agents (c10d, the rendezvous
# hosted by h1's agent, liveness TTL keep_alive_interval x keep_alive_max_attempt = 2 s). h1 and
# h2 train PyTorch gloo DDP (2 workers each); h3 arrives when the round is full and waits for a
# place, its warm spares ready. Then h2 is lost, as FAULT says:
#   kill   every process on it (agent, guardian, workers, spares) killed with SIGKILL at once
#   cut    its network cut (its link down): h1 learns of it from the keep-alive only
# Checks: from the kill to every rank's first step of the
# next round (h1 and h3, world 4) takes at most the TTL + 1 s; h3's workers were handed to its
# spares ("(2 warm)" in its recovery line), and so were h1's; they train on together (step 20 on
# both) and stop cleanly on SIGTERM (the job is endless: its length never races the spares).
# Usage: spare_node_test.sh DDPRUN kill|cut
set -u
ddprun=$1 fault=$2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/hosts.sh"
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null ||
  skip_or_fail "PyTorch is not installed (scripts/setup.sh installs python3-torch)"
hosts_up 3
ttl=2  # keep_alive_interval=0.5 x keep_alive_max_attempt=4

start_agent() {  # NAME HOST
  start "$2" "$1" env DDP_STEPS=1000000 DDP_PAUSE=0.05 "$ddprun" --nnodes=2 --rdzv_backend=c10d \
    --rdzv_endpoint=h1:29400 --rdzv_id=spare "--rdzv_conf=keep_alive_interval=0.5,keep_alive_max_attempt=4" \
    --max_restarts=3 --nproc_per_node=2 /usr/bin/python3 -u "$here/ddp_worker.py"
}
spares_ready() { [ "$(grep -c 'warm spare for local rank . ready' "$out/$1.err")" -ge 2 ]; }
give_up() { bad "$1"; tail -n 30 "$out"/a*.err; finish; }

start_agent a1 1
start_agent a2 2
wait_line "$out/a1.out" 'step 3 .*world=4' 60 || give_up "h1 and h2 never trained together"
start_agent a3 3
wait_line "$out/a3.err" 'this node waits for a place' 30 || give_up "h3 did not wait for a place"
deadline=$((SECONDS + 30))
until spares_ready a1 && spares_ready a3; do
  [ $SECONDS -lt $deadline ] || give_up "the warm spares of h1 and h3 were not ready within 30 s"
  sleep 0.05
done
# h1's lines of step 20 so far (round 0 may or may not have reached it, as the spares' start
# takes): the next round's are counted beyond them.
before=$(grep -c 'step 20 .*world=4' "$out/a1.out")
killed=$(date +%s.%N)
case $fault in
  kill) ip netns pids "ns-$id-h2" | xargs -r kill -KILL ;;
  cut) ip -n "ns-$id-h2" link set "h2-$id" down ;;
  *) echo "unknown fault $fault"; exit 2 ;;
esac
went_on() { grep -q 'step 20 .*world=4' "$out/a3.out" && [ "$(grep -c 'step 20 .*world=4' "$out/a1.out")" -ge $((before + 2)) ]; }
deadline=$((SECONDS + 60))
until went_on || [ $SECONDS -ge $deadline ]; do sleep 0.1; done
went_on && ok "h1 and h3 train on together after the loss of h2" || bad "h1 and h3 did not train on together"
for i in 1 3; do ip netns pids "ns-$id-h$i" | xargs -r ps -o pid=,comm= -p | awk '$2 == "ddprun" {print $1}' | xargs -r kill -TERM; done
wait "$pid_a1"; r1=$?
wait "$pid_a3"; r3=$?
[ $r1 -eq 143 ] && [ $r3 -eq 143 ] && ok "h1 and h3 stop on SIGTERM (exits $r1/$r3)" || bad "exits h1 $r1, h3 $r3 (143 expected)"

# Every rank's first step of the next round: its first "step 0" after the kill.
/usr/bin/python3 - "$killed" "$ttl" "$out/a1.out" "$out/a3.out" <<'PY'
import re, sys
killed, ttl, files = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
first = {}
for f in files:
    for t, host, world, rank in re.findall(r"step 0 t=(\S+) host=(\S+) world=(\d+) rank=(\d+)", open(f).read()):
        if float(t) > killed and world == "4":
            first.setdefault(rank, (float(t) - killed, host))
took = max((s for s, _ in first.values()), default=-1)
print("  from the kill to each rank's first step: " +
      ", ".join("rank %s on %s %.2f s" % (r, h, s) for r, (s, h) in sorted(first.items())))
ok = sorted(first) == ["0", "1", "2", "3"] and 0 < took <= ttl + 1
print(("ok: " if ok else "FAILED: ") + "every rank of h1 and h3 stepped %.2f s after the kill (<= TTL %g s + 1 s)" % (took, ttl))
sys.exit(0 if ok else 1)
PY
[ $? -eq 0 ] && passed=$((passed + 1)) || failed=$((failed + 1))
for a in a1 a3; do
  line=$(grep -m1 'restarted in' "$out/$a.err")
  echo "  $a: ${line#*ddprun: }"
  [[ $line == *"(2 warm)"* ]] && ok "$a's workers of the next round were handed to its warm spares" ||
    bad "$a's workers of the next round did not all start warm"
done
[ "${failed:-0}" -eq 0 ] || tail -n 40 "$out"/a*.err
finish
