#!/usr/bin/env bash
# A lost node's state comes from its buddy (docs/usage.md: State across nodes). Three namespaced
# hosts: h1 and h2 train a PyTorch gloo DDP job (c10d, --nnodes=2, 2 workers each, world 4) that
# saves with ddprun.state.save after every step, STATE_MB of state that differs per rank (each
# rank's data order and RNG states); h3 waits for a place. Once h2's ranks have saved a step, h2
# is lost (every process on it killed with SIGKILL). h3 takes its place (h1 keeps its group
# rank, h3 takes h2's): the lost ranks' state comes from the copies h1 kept as h2's buddy.
# Checks: every rank resumes at one step, at most the buddy's lag behind the last step the
# survivors had saved; the new node's ranks say where their state came from; every rank ends with
# the parameters of a run that lost nothing from that step (bit for bit).
# MODE:
#   fast  copies at the default pace, far quicker than a step
#   slow  copies slower than a step (--state_copy_rate=24M, 8 MB a rank, two ranks a node): each
#         save waits until every rank's buddy holds the one before; the same checks hold. The
#         model and optimizer are saved as replicated (each rank copies a quarter of them): the
#         lost ranks' quarters come from the buddy too
#   crash no node is lost: rank 2 (h2's first, or h1's) exits 1 after its save of step 4, so its
#         node is the first back in the next round. Checks: every rank resumes at step 4 from
#         its own node (no rank moves, none takes its state from another node), with the
#         parameters of the same crash on one host; it prints the time from the crash to every
#         rank's next step (bench/state_bench.py --crash_node)
# Usage: state_node_test.sh DDPRUN fast|slow|crash
set -u
ddprun=$1 mode=${2:-fast}
here=$(cd "$(dirname "$0")" && pwd)
worker=$(cd "$here/../python" && pwd)/state_worker.py
source "$here/hosts.sh"
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null ||
  skip_or_fail "PyTorch is not installed (scripts/setup.sh installs python3-torch)"
hosts_up 3
case $mode in
  fast) steps=40 mb=${STATE_MB:-16} rate=1G kill_at=8 replicated= ;;
  slow) steps=8 mb=8 rate=24M kill_at=4 replicated=1 ;;
  crash) steps=6 mb=${STATE_MB:-8} rate=1G kill_at=4 replicated= ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac

step_s=${STEP_S:-0.1}  # the pause after each save: the rest of a step
smode=none
[ "$mode" = crash ] && smode=crash
# Every rank holds after its save of step kill_at+1 until h2 is killed and the others met again:
# the loss falls inside the training, however slowly h3 started (the job once ended first).
hold_at=$((kill_at + 1))
[ "$mode" = crash ] && hold_at=-1
# A 4 s liveness TTL (1 s x 4): at 2 s, a node whose warm spares were importing PyTorch beside
# another test's workers on two cores once missed its renewals and was taken for lost.
start_agent() {  # NAME HOST
  start "$2" "$1" env STATE_MODE=$smode STATE_CRASH_STEP=$kill_at STATE_CRASH_RANK=2 STATE_REPLICATED=$replicated STATE_STEPS=$steps STATE_MB=$mb STATE_PAUSE=$step_s STATE_HOLD_STEP=$hold_at STATE_HOLD="$out/hold" "$ddprun" --nnodes=2 \
    --rdzv_backend=c10d --rdzv_endpoint=h1:29400 --rdzv_id=statenode ${STATE_LOG:+--log_level=$STATE_LOG} \
    "--rdzv_conf=keep_alive_interval=1,keep_alive_max_attempt=4" --max_restarts=3 --nproc_per_node=2 \
    --state_copy_rate=$rate /usr/bin/python3 -u "$worker"
}
give_up() { bad "$1"; tail -n 30 "$out"/a*.err; finish; }

# The same job on one host (world 4), every rank restarted after its save of step $1 (a
# worker's crash), resuming there from its own state: FINAL lines in $out/ref.out.
reference() {
  on 3 env STATE_MODE=crash STATE_REPLICATED=$replicated STATE_CRASH_STEP="$1" STATE_STEPS=$steps STATE_MB=$mb "$ddprun" --nproc_per_node=4 \
    --max_restarts=1 /usr/bin/python3 -u "$worker" >"$out/ref.out" 2>"$out/ref.err"
  ref=$(grep -o 'FINAL [0-9a-f]*' "$out/ref.out" | sort -u)
}

start_agent a1 1
wait_line "$out/a1.err" 'joining the rendezvous' 30 || give_up "h1 did not join"
start_agent a2 2
wait_line "$out/a1.out" 'SAVED 2 ' 90 || give_up "h1 and h2 never trained together"
if [ "$mode" = crash ]; then
  wait "$pid_a1"; r1=$?
  wait "$pid_a2"; r2=$?
  [ $r1 -eq 0 ] && [ $r2 -eq 0 ] && ok "h1 and h2 end the job after rank 2's crash (exits $r1/$r2)" || give_up "exits h1 $r1, h2 $r2 (0 expected)"
  crashed=$(grep -ho 'CRASHING after step [0-9]* t=[0-9.]*' "$out/a1.out" "$out/a2.out" | sed 's/.*t=//')
  resumed=$(grep -ho 'RESUMED [0-9]* ' "$out/a1.out" "$out/a2.out" | sort | uniq -c | sed 's/^ *//')
  [ "$resumed" = "4 RESUMED $kill_at " ] && ok "every rank resumed at step $kill_at" || bad "resumed: $(echo $resumed) (4 at $kill_at expected)"
  for i in 1 2; do
    places=$(grep -o 'round [01]: node [0-9]* of 2' "$out/a$i.err" | sed 's/: node / /' | awk '{print $3}' | paste -sd' ')
    [ "$(echo "$places" | wc -w)" -eq 2 ] && [ "${places% *}" = "${places#* }" ] && ok "h$i kept its group rank ($places)" ||
      bad "h$i's group ranks in rounds 0 and 1: $places"
  done
  taken=$(grep -h "in-memory state (step" "$out/a1.err" "$out/a2.err" | grep -c 'taken from')
  [ "$taken" -eq 0 ] && ok "no rank took its state from another node" || bad "$taken rank(s) took their state from another node"
  back=$(grep -ho 'SAVED [0-9]* rank=[0-9]* host=h[0-9] t=[0-9.]*' "$out/a1.out" "$out/a2.out" |
    awk -v k="${crashed:-0}" -v s=$((kill_at + 1)) '{split($3, r, "="); split($5, t, "="); if ($2 == s && t[2] > k && !(r[2] in f)) f[r[2]] = t[2] - k}
                        END {m = 0; n = 0; for (x in f) {n++; if (f[x] > m) m = f[x]}; printf "%d %.2f", n, m}')
  echo "  MEASURED state_mb=$mb step_s=$step_s crash_to_step_s=${back#* } ranks_back=${back% *} taken=$taken"
  reference "$kill_at"
  finals=$(grep -ho 'FINAL [0-9a-f]*' "$out/a1.out" "$out/a2.out")
  [ "$(echo "$finals" | grep -c FINAL)" -eq 4 ] && [ "$(echo "$ref" | grep -c FINAL)" -eq 1 ] && [ "$(echo "$finals" | sort -u)" = "$ref" ] &&
    ok "every rank ends with the parameters of the same crash on one host" ||
    bad "the parameters differ from the same crash on one host: $(echo "$finals" | sort | uniq -c) vs $ref"
  [ "${failed:-0}" -eq 0 ] || tail -n 40 "$out"/a*.err
  finish
fi
start_agent a3 3
wait_line "$out/a3.err" 'this node waits for a place' 30 || give_up "h3 did not wait for a place"
wait_line "$out/a2.out" "SAVED $kill_at " 60 || give_up "h2's ranks never saved step $kill_at"
# The copies' marks in the workers' store: the agents delete each step's once a later one is
# replicated (they were two keys a step for the whole round). From step 3 on, the ranks of h1
# count those of steps before step - 2 still there.
stale=$(sed -n 's/.*SAVED \([3-9]\|[1-9][0-9]\+\) .* stale=\([0-9]*\).*/\1 \2/p' "$out/a1.out")
[ "$(echo "$stale" | grep -c .)" -ge 2 ] && [ -z "$(echo "$stale" | awk '$2 != 0')" ] &&
  ok "no step's copy marks are left in the workers' store once a later step is replicated" ||
  bad "the copies' marks of old steps stay in the workers' store (step, stale marks: $(echo $stale))"
# The memory the agent of h1 holds (its areas are memfds, counted apart; this is the buddy's copies).
agent_rss=$(ip netns pids "ns-$id-h1" | xargs -r ps -o rss=,comm= -p | awk '$2 == "ddprun" {print int($1 / 1024)}' | head -1)
killed=$(date +%s.%N)
ip netns pids "ns-$id-h2" | xargs -r kill -KILL
wait_line "$out/a1.err" 'rendezvous round [1-9][0-9]* complete' 60 || give_up "h1 and h3 never met after h2 was lost"
touch "$out/hold"
wait "$pid_a1"; r1=$?
wait "$pid_a3"; r3=$?
[ $r1 -eq 0 ] && [ $r3 -eq 0 ] && ok "h1 and h3 end the job (exits $r1/$r3)" || give_up "exits h1 $r1, h3 $r3 (0 expected)"

resumed=$(grep -ho 'RESUMED [0-9]* .*rank=[0-9]* host=h[0-9]' "$out/a1.out" "$out/a3.out")
echo "$resumed" | sed 's/^/  /'
at=$(echo "$resumed" | awk '{print $2}' | sort -u)
[ "$(echo "$resumed" | grep -c RESUMED)" -eq 4 ] && [ "$(echo "$at" | wc -l)" -eq 1 ] &&
  ok "every rank resumed at one step ($at)" || give_up "the ranks did not all resume once, at one step"
# The buddy's lag: from the newest step a rank still held (committed) to the step resumed.
last=$(echo "$resumed" | grep -o 'steps=\[[0-9, ]*\]' | grep -o '[0-9]*' | sort -n | tail -1)
lag=$((last - at))
[ "$at" -ge $((kill_at - 2)) ] && [ $lag -ge 0 ] && [ $lag -le 1 ] &&
  ok "the ranks held steps up to $last when h2 was lost; the job resumed at $at (the buddy's lag: $lag)" ||
  bad "resumed at step $at, a rank held $last (a lag of at most 1 expected)"
# From the loss to every rank's first step after it (its save), and the stall the saves added.
back=$(grep -ho 'SAVED [0-9]* rank=[0-9]* host=h[0-9] t=[0-9.]*' "$out/a1.out" "$out/a3.out" |
  awk -v k="$killed" -v s=$((at + 1)) '{split($3, r, "="); split($5, t, "="); if ($2 == s && t[2] > k && !(r[2] in f)) f[r[2]] = t[2] - k}
                      END {m = 0; n = 0; for (x in f) {n++; if (f[x] > m) m = f[x]}; printf "%d %.2f", n, m}')
stall=$(grep -ho 'STALL [0-9.]* saves=[0-9]*' "$out/a1.out" "$out/a3.out" |
  awk '{split($3, s, "="); t += $2; n += s[2]} END {if (n) printf "%.3f", t / n}')
echo "  MEASURED state_mb=$mb step_s=$step_s lost_to_step_s=${back#* } ranks_back=${back% *} lag_steps=$lag resumed_at=$at stall_per_save_s=$stall agent_rss_mb=$agent_rss"
# The resumed round's saves are of its course (the agents begin it as the round settles: its
# generations from round << 40), on both nodes, so no abandoned state of an older round is taken for theirs.
courses=$(grep -ho 'STALL .* course=[0-9-]*' "$out/a1.out" "$out/a3.out" | sed 's/.*course=//' | sort -u)
[ "$(echo "$courses" | grep -c .)" -eq 1 ] && [ "${courses:--1}" -ge 1 ] &&
  ok "the resumed round's saves are of its course ($courses) on every rank" ||
  bad "the last saves' courses: $(echo $courses) (one, of the resumed round, at least 1, expected)"
if [ -n "$replicated" ]; then  # each of the 4 ranks saved its state, and a quarter of the replicated part
  sizes=$(grep -ho 'STALL .* bytes=[0-9]* model_and_optimizer=[0-9]*' "$out/a1.out" "$out/a3.out" | sed 's/.*bytes=\([0-9]*\) model_and_optimizer=\([0-9]*\)/\1 \2/')
  [ "$(echo "$sizes" | grep -c .)" -eq 4 ] &&
    [ -z "$(echo "$sizes" | awk -v mb=$mb '$1 > mb * 1048576 + $2 / 4 + 65536')" ] &&
    ok "each rank's save held its own state and a quarter of the model and optimizer (bytes, theirs: $(echo $sizes))" ||
    bad "the saves did not share the replicated part out (bytes, the model and optimizer's: $(echo $sizes))"
fi
grep -h "in-memory state (step" "$out/a1.err" "$out/a3.err" | sed 's/^.*ddprun: /  /'
taken1=$(grep -h "in-memory state (step" "$out/a1.err" | grep -c 'taken from')
taken3=$(grep -h "in-memory state (step" "$out/a3.err" | grep -c 'taken from')
[ "$taken1" -eq 0 ] && [ "$taken3" -ge 2 ] &&
  ok "h3's ranks took their state from h1, the buddy that held it; h1's stayed in place" ||
  bad "ranks that took their state from another node: $taken1 on h1 (0 expected), $taken3 on h3 (2 expected)"
# A run that lost nothing from that step: the same job (world 4) on one host, every rank
# restarted after its save of step $at (a worker's crash), resuming there from its own state.
# (Not an uninterrupted run: DDP's first step after any restart sums the gradients of 4 ranks in
# its first bucket order, not the rebuilt one, which rounds differently.)
reference "$at"
finals=$(grep -ho 'FINAL [0-9a-f]*' "$out/a1.out" "$out/a3.out")
[ "$(grep -c "RESUMED $at " "$out/ref.out")" -eq 4 ] && [ "$(echo "$ref" | grep -c FINAL)" -eq 1 ] &&
  [ "$(echo "$finals" | grep -c FINAL)" -eq 4 ] && [ "$(echo "$finals" | sort -u)" = "$ref" ] &&
  ok "every rank ends with the parameters of a run that lost nothing from step $at" ||
  bad "the parameters differ from a run resumed at step $at: $(echo "$finals" | sort | uniq -c) vs $ref"
[ "${failed:-0}" -eq 0 ] || tail -n 40 "$out"/a*.err
finish
