#!/usr/bin/env bash
# One trial of the node-loss case of bench/recovery_bench.py (run it as root): three namespaced
# hosts (tests/multihost/hosts.sh), a launcher on each, --nnodes=2 over c10d (the rendezvous
# hosted by h1's launcher), PyTorch gloo DDP with 2 workers a host (tests/multihost/ddp_worker.py).
# h1 and h2 train; h3 arrives when they do and waits for a place. Then every process on h2 is
# SIGKILLed at once. Prints "seconds S" (from the kill to every rank's first step of the next
# round, world 4) or "none within T s", then the lines the launchers printed about it.
# Usage: node_loss_trial.sh KIND(torchrun|cold|warm) DDPRUN TORCHRUN PYTHON [BOUND_S]
set -u
kind=$1 ddprun=$2 torchrun=$3 python=$4 bound=${5:-60}
here=$(cd "$(dirname "$0")" && pwd)
tests=$here/../tests/multihost
source "$tests/hosts.sh"
hosts_up 3
case $kind in
  torchrun) launch=("$python" "$torchrun" --nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=h1:29400 --rdzv_id=loss) ;;
  cold | warm) launch=("$ddprun" --nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=h1:29400 --rdzv_id=loss
                      "--warm_spares=$([ "$kind" = warm ] && echo 1 || echo 0)") ;;
  *) echo "unknown kind $kind" >&2; exit 2 ;;
esac
for i in 1 2 3; do
  [ "$i" = 3 ] && { wait_line "$out/a1.out" 'step 3 .*world=4' 60 || { echo "failed: no training"; tail "$out"/a*; exit 1; }; }
  # torchrun runs the script with its own interpreter (unbuffered); ddprun runs the command.
  start "$i" "a$i" env DDP_STEPS=100000 DDP_PAUSE=0.05 PYTHONUNBUFFERED=1 "${launch[@]}" --max_restarts=3 \
    --nproc_per_node=2 $([ "$kind" = torchrun ] || echo "$python -u") "$tests/ddp_worker.py"
done
# Ready to lose h2: h3 waits (ddprun says so; torchrun: 10 s of training after h3 started) and,
# warm, every spare of h1 and h3 is ready.
spares() { [ "$(grep -c 'warm spare for local rank . ready' "$out/$1.err")" -ge 2 ]; }
deadline=$((SECONDS + 60))
case $kind in
  torchrun) t=$((SECONDS + 10)); while [ $SECONDS -lt $t ]; do sleep 0.2; done ;;
  cold) wait_line "$out/a3.err" 'waits for a place' 60 ;;
  warm) until spares a1 && spares a3 || [ $SECONDS -ge $deadline ]; do sleep 0.05; done ;;
esac
killed=$(date +%s.%N)
ip netns pids "ns-$id-h2" | xargs -r kill -KILL
# Every rank's first step after the kill: its first "step 0" of world 4 after it.
firsts() {
  cat "$out/a1.out" "$out/a3.out" | awk -v k="$killed" '
    /step 0 t=/ { for (i = 1; i <= NF; i++) { if ($i ~ /^t=/) t = substr($i, 3); if ($i ~ /^rank=/) r = $i; if ($i ~ /^world=/) w = $i }
                   if (t + 0 > k + 0 && w == "world=4" && !(r in seen)) { seen[r] = t; n++ } }
    END { m = 0; for (r in seen) if (seen[r] - k > m) m = seen[r] - k; printf "%d %.3f\n", n, m }'
}
end=$((SECONDS + bound))
while read -r n took < <(firsts) && [ "$n" -lt 4 ] && [ $SECONDS -lt $end ]; do sleep 0.1; done
read -r n took < <(firsts)
if [ "$n" -ge 4 ]; then echo "seconds $took"; else echo "none within $bound s ($n of 4 ranks stepped)"; fi
grep -hE 'restarted in|waits for a place|Rendezvous.*(complete|timed out|closed)|RendezvousTimeout|num_nodes_waiting|membership' \
  "$out"/a1.err "$out"/a3.err 2>/dev/null | tail -n 8 | cut -c1-300
