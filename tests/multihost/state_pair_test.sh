#!/usr/bin/env bash
# A node lost together with its buddy (docs/usage.md: State across nodes): four namespaced hosts,
# a PyTorch gloo DDP job of 2 to 3 nodes (c10d, one worker a node) that saves with
# ddprun.state.save after every step; three nodes train, the fourth waits for a place. Once
# every rank has saved step 5, the nodes of group ranks 1 and 2 are lost at once (every process
# killed): group rank 1's state was on its own node and on its buddy, group rank 2. The survivor
# and the waiting node meet as a job of 2 nodes.
# Checks: the node that now has rank 1 says that no node holds its state (its node and buddy
# were lost together) and to resume from a disk checkpoint; every rank's ddprun.state.load()
# returns None and says why (no step in common), none loads a state; the job trains from step 0
# to its end on both nodes (exit 0).
# Usage: state_pair_test.sh DDPRUN
set -u
ddprun=$1
here=$(cd "$(dirname "$0")" && pwd)
worker=$(cd "$here/../python" && pwd)/state_worker.py
source "$here/hosts.sh"
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null ||
  skip_or_fail "PyTorch is not installed (scripts/setup.sh installs python3-torch)"
hosts_up 4

start_agent() {  # NAME HOST
  start "$2" "$1" env STATE_MODE=none STATE_STEPS=30 STATE_MB=4 STATE_PAUSE=0.1 "$ddprun" --nnodes=2:3 \
    --rdzv_backend=c10d --rdzv_endpoint=h1:29400 --rdzv_id=statepair \
    "--rdzv_conf=keep_alive_interval=0.5,keep_alive_max_attempt=4,last_call_timeout=1" --max_restarts=3 --nproc_per_node=1 \
    /usr/bin/python3 -u "$worker"
}
give_up() { bad "$1"; tail -n 30 "$out"/a*.err; finish; }

# h1 hosts the rendezvous and arrives first (group rank 0): it must outlive the loss.
start_agent a1 1
wait_line "$out/a1.err" 'joining the rendezvous' 30 || give_up "h1 did not join"
for i in 2 3; do start_agent "a$i" "$i"; done
for i in 1 2 3; do
  wait_line "$out/a$i.out" 'SAVED 5 ' 90 || give_up "h$i never saved step 5"
done
start_agent a4 4
wait_line "$out/a4.err" 'this node waits for a place' 30 || give_up "h4 did not wait for a place"
# The hosts of group ranks 1 and 2 (a node's buddy is the next group rank).
host_of() { grep -l "round 0: node $1 of 3" "$out"/a[123].err | sed 's/.*a\([0-9]\)\.err/\1/'; }
g1=$(host_of 1) g2=$(host_of 2) g0=$(host_of 0)
[ -n "$g0" ] && [ -n "$g1" ] && [ -n "$g2" ] || give_up "the group ranks of round 0 are not in the logs"
[ "$g0" = 1 ] || give_up "h1 (the rendezvous' host) is not group rank 0 of round 0 (h$g0 is)"
for h in "$g1" "$g2"; do ip netns pids "ns-$id-h$h" | xargs -r kill -KILL; done
wait "$(eval echo "\$pid_a$g0")"; r0=$?
wait "$pid_a4"; r4=$?
[ $r0 -eq 0 ] && [ $r4 -eq 0 ] && ok "h$g0 and h4 end the job (exits $r0/$r4), h$g1 and its buddy h$g2 lost" ||
  give_up "exits h$g0 $r0, h4 $r4 (0 expected)"
said=$(grep -h "no node holds rank 1's in-memory state" "$out/a$g0.err" "$out/a4.err")
echo "  ${said#*ddprun: }"
[[ $said == *"lost together"* && $said == *"disk checkpoint"* ]] &&
  ok "the node that has rank 1 now says its state is gone with its node and buddy" || bad "nothing said that rank 1's state is gone"
nothing=$(grep -hc "ranks hold no step in common" "$out/a$g0.err" "$out/a4.err" | paste -sd+ | bc)
resumed=$(cat "$out/a$g0.out" "$out/a4.out" | grep -c RESUMED)
[ "$nothing" -ge 1 ] && [ "$resumed" -eq 0 ] &&
  ok "load() returned None on every rank, none resumed (the rank that held state said why)" ||
  bad "$resumed rank(s) resumed, $nothing said there was no step in common"
finals=$(grep -ho 'FINAL [0-9a-f]*' "$out/a$g0.out" "$out/a4.out" | sort -u | wc -l)
[ "$(grep -ho 'FINAL' "$out/a$g0.out" "$out/a4.out" | wc -l)" -eq 2 ] && [ "$finals" -eq 1 ] &&
  ok "both ranks trained from step 0 to the end" || bad "the job did not train to its end on both ranks"
[ "${failed:-0}" -eq 0 ] || tail -n 40 "$out"/a*.err
finish
