#!/usr/bin/env bash
# etcd under chaos, across namespaced hosts: three ddprun agents (h1-h3, one PyTorch gloo DDP
# worker each) and a 3-member etcd cluster (h4-h6; heartbeat 100 ms, election timeout 1 s,
# etcd's defaults), ddprun's defaults (lease_ttl 5 s): an election, split votes and all, is ridden
# out because a majority of members saying they have no leader holds the lease (nobody can
# revoke it then; docs/multi-node.md, etcd outages). One case per run, while the job trains:
#   leader   the leader SIGKILLed and started again 4 s later; then the new leader SIGSTOPped
#            3 s; then a follower SIGSTOPped 8 s (longer than the lease)
#   cut      the leader's network cut (its link down) for 10 s (etcd with --pre-vote)
#   deposed  the same without --pre-vote (etcd 3.4's default): the member cut off campaigns alone,
#            and its higher term deposes the leader when its link is back: seconds without a
#            leader, ridden out because a majority says it has none (every node fenced before)
#   rolling  every member restarted in turn (SIGTERM, started again, healthy again)
#     -> the cluster keeps its quorum, so the job trains on: one round, restart count 0 on every
#        node, no fence lapse, every rank ends after the same step with the same parameters
#   quorum   two members SIGSTOPped for 16 s: every node's fence lapses, its worker is gone
#            before the lease could expire (5 s); each agent then ends with an error naming etcd
#            (or, had etcd come back sooner, the job would meet again and finish)
#   brief    the same for 5 s: fenced the same way; etcd is back as the requests give up, so the
#            nodes meet again (on new leases where the old leader revoked theirs) and finish, or
#            end with the error naming etcd (failed 1 of 4 runs before: 'requested lease not found')
#   node     h3's network cut: its fence kills its worker before h1 and h2 go on without it
#            (no split brain); h1 and h2 finish, h3 ends with an error naming etcd
# Usage: etcd_chaos_test.sh CASE DDPRUN
set -u
chaos=$1 ddprun=$2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lib.sh"
source "$here/hosts.sh"
need etcd etcdctl
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null ||
  skip "PyTorch is not installed (scripts/setup.sh installs python3-torch)"
data=$(mktemp -d /dev/shm/ddprun-etcd-XXXXXX 2>/dev/null || mktemp -d)  # no disk stalls of this machine
trap 'hosts_down; rm -rf "$data"' EXIT
hosts_up 6

endpoints=h4:2379,h5:2379,h6:2379
cluster=""
for k in 1 2 3; do cluster+="${cluster:+,}e$k=http://$(addr $((k + 3))):2380"; done
launches=0
# cut: --pre-vote, etcd 3.5's default: without it a member cut off campaigns on its own, and its
# higher term, when its link is back, deposes the leader (measured: 8 s without a leader).
prevote=""
[ "$chaos" = cut ] && prevote=--pre-vote=true
now() { date +%s.%N; }
# Holds a fault for SECS (the fault's length, not a wait for a condition).
hold() { local end=$(($(date +%s%N) / 1000000 + $1 * 1000)); while (($(date +%s%N) / 1000000 < end)); do sleep 0.1; done; }
ctl() { on 1 env ETCDCTL_API=3 etcdctl --endpoints=$endpoints --dial-timeout=1s --command-timeout=2s "$@"; }

member_up() {  # K: member K (1-3) on host K+3, started on its data (again)
  local k=$1 i=$(($1 + 3))
  launches=$((launches + 1))
  start "$i" "etcd${k}_$launches" etcd --name "e$k" --data-dir "$data/e$k" --listen-client-urls "http://$(addr $i):2379" \
    --advertise-client-urls "http://$(addr $i):2379" --listen-peer-urls "http://$(addr $i):2380" \
    --initial-advertise-peer-urls "http://$(addr $i):2380" --initial-cluster "$cluster" --initial-cluster-state new \
    --heartbeat-interval 100 --election-timeout 1000 --log-level error $prevote
}
member_pid() { ip netns pids "ns-$id-h$(($1 + 3))" | xargs -r ps -o pid=,comm= -p | awk '$2 == "etcd" {print $1}'; }
healthy() {  # all three members healthy within SECS
  local end=$((SECONDS + $1))
  until ctl endpoint health >/dev/null 2>&1; do [ $SECONDS -lt $end ] || return 1; sleep 0.1; done
}
leader() {  # the leading member's number, once there is one (20 s)
  local end=$((SECONDS + 20)) l=""
  while [ -z "$l" ] && [ $SECONDS -lt $end ]; do
    l=$(ctl endpoint status -w json 2>/dev/null | /usr/bin/python3 -c '
import json, sys
for s in json.load(sys.stdin):
    if s["Status"]["header"]["member_id"] == s["Status"]["leader"]: print(int(s["Endpoint"][1]) - 3)' 2>/dev/null)
  done
  echo "$l"
}
link() { ip -n "ns-$id-h$1" link set "h$1-$id" "$2"; }  # host I's network: up or down
workers_on() {  # host I's workers (python3 running chaos_worker.py: the agent's own arguments name it too)
  ip netns pids "ns-$id-h$1" | xargs -r ps -o comm=,args= -p 2>/dev/null | awk '$1 ~ /^python/ && /chaos_worker/' | wc -l
}
gone_pids=()
gone_at() {  # I FILE: in the background, the time host I's last worker is gone (30 s at most)
  (end=$((SECONDS + 30)); while [ "$(workers_on "$1")" != 0 ] && [ $SECONDS -lt $end ]; do sleep 0.05; done
   now >"$2") &
  gone_pids+=($!)
}
minus() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a - b}'; }

ttl=5  # ddprun's default lease_ttl, not given below
nnodes=3
[ "$chaos" = node ] && nnodes=2:3
agent() {  # I: the agent of host I
  start "$1" "a$1" env CHAOS_STOP="$out/stop" "$ddprun" ${CHAOS_AGENT_ARGS:-} --nnodes=$nnodes --rdzv_backend=etcd --rdzv_endpoint=$endpoints \
    --rdzv_id=chaos --rdzv_conf=last_call_timeout=3 --max_restarts=3 --nproc_per_node=1 \
    /usr/bin/python3 -u "$here/chaos_worker.py"
}
agents_end() {  # waits (60 s) for the three agents; rc_I: each one's exit status
  local i p end=$((SECONDS + 60))
  for i in 1 2 3; do
    [ -n "${judged[$i]:-}" ] && continue  # ended and judged (replace_ended)
    p=pid_a$i
    while kill -0 "${!p}" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.1; done
    kill -0 "${!p}" 2>/dev/null && { bad "h$i's agent still runs 60 s after the job was told to stop"; kill -KILL -- "-${!p}"; }
    wait "${!p}"
    printf -v "rc_$i" '%s' $?
  done
}
# MIN = MAX: where some agents ended with the error naming etcd (their requests gave up as etcd
# came back) and the others rejoined, the others wait for the missing nodes in a round that
# cannot close, up to join_timeout, as for any node lost at MIN = MAX (docs/multi-node.md). Each
# agent that ended so while the others still run 10 s later is started again on its host, as a
# pod's restart would, and the three meet and finish. An agent that ended is judged once (rc_I,
# judged[I]); one that ended otherwise is judged below as before.
judged=()
replace_ended() {
  local i p rc first=0 end=$((SECONDS + 30)) running
  while :; do
    running=0
    for i in 1 2 3; do
      [ -n "${judged[$i]:-}" ] && continue
      p=pid_a$i
      if kill -0 "${!p}" 2>/dev/null; then running=$((running + 1)); continue; fi
      wait "${!p}"
      rc=$?
      printf -v "rc_$i" '%s' "$rc"
      judged[$i]=1
      [ "$first" = 0 ] && first=$SECONDS
    done
    [ "$running" = 0 ] && return 0  # every agent ended: each is judged below, as before
    [ "$first" != 0 ] && [ $((SECONDS - first)) -ge 10 ] && break  # the others run on: they wait
    [ $SECONDS -ge $end ] && return 0
    sleep 0.2
  done
  for i in 1 2 3; do
    [ -n "${judged[$i]:-}" ] || continue
    p=rc_$i
    if [ "${!p}" != 0 ] && grep -q 'cannot reach etcd at h4:2379, h5:2379, h6:2379' "$out/a$i.err"; then
      ok "h$i's agent ended with exit ${!p} naming etcd while the others rejoined: h$i started again"
      mv "$out/a$i.out" "$out/a$i.first.out"
      mv "$out/a$i.err" "$out/a$i.first.err"
      agent "$i"
      unset "judged[$i]"
    fi
  done
}
first_step() { /usr/bin/python3 -c '
import re, sys
t = [float(m.group(1)) for m in re.finditer(r"step \d+ t=(\S+) host=\S+ world=" + sys.argv[2], open(sys.argv[1]).read())]
print(t[0] if t else "")' "$1" "$2"; }
longest_pause() { /usr/bin/python3 -c '
import re, sys
t = [float(x) for x in re.findall(r"step \d+ t=(\S+)", open(sys.argv[1]).read())]
print("%.2f" % max((b - a for a, b in zip(t, t[1:])), default=0))' "$1"; }

# Every agent of HOSTS (default 1 2 3) exited 0; their ranks' last lines agree (same step, same
# parameters, world = the number of hosts).
finished_together() {
  local i hosts=(${@:-1 2 3}) files=()
  for i in "${hosts[@]}"; do
    files+=("$out/a$i.out")
    p=rc_$i
    [ "${!p}" = 0 ] && ok "h$i's agent exited 0" || bad "h$i's agent exited ${!p}"
  done
  local lines
  lines=$(grep -ho 'done steps=.*' "${files[@]}" | sed 's/ host=.*//' | sort | uniq -c)
  echo "  $lines"
  echo "$lines" | grep -qE "^ *${#hosts[@]} done steps=[0-9]+ checksum=\S+ world=${#hosts[@]}\$" &&
    ok "the ranks ended after the same step with the same parameters" ||
    bad "the ranks' last lines differ or are missing"
}

# The cluster kept its quorum: one round, restart count 0, no fence lapse, on every node.
trained_on() {
  local i
  for i in 1 2 3; do
    local e="$out/a$i.err"
    if [ "$(grep -c 'started ranks' "$e")" = 1 ] && grep -q 'round 0: .*(restart count 0' "$e" &&
      ! grep -qE 'liveness lapsed|stopped answering|lost its etcd lease|restarting' "$e"; then
      ok "h$i: one attempt (round 0, restart count 0), no lapse, no node lost"
    else
      bad "h$i restarted or lapsed:"; grep -E 'round|lapsed|restart|lost|etcd' "$e" | head -20
    fi
  done
  echo "  longest pause between two steps on h1: $(longest_pause "$out/a1.out") s;" \
    "leases held by a leaderless majority: $(cat "$out"/a?.err | grep -c 'etcd has no leader')"
}

for k in 1 2 3; do member_up "$k"; done
healthy 20 || { bad "etcd did not come up"; cat "$out"/etcd*.err; finish; }
for i in 1 2 3; do agent "$i"; done
for i in 1 2 3; do
  wait_line "$out/a$i.out" 'step 20 .*world=3' 90 || { bad "h$i never trained"; cat "$out/a$i.err"; finish; }
done
t0=$(now)

case $chaos in
  leader)
    l=$(leader); kill -KILL "$(member_pid "$l")"; echo "  e$l (the leader) SIGKILLed"
    hold 4
    member_up "$l"
    healthy 20 || bad "e$l did not come back"
    # The new leader paused 3 s (an election), within the leases: etcd before the fix of
    # etcd-io/etcd#12528 (PR #16822) lets a leader paused past a lease revoke it as it resumes.
    l=$(leader); p=$(member_pid "$l"); kill -STOP "$p"; echo "  e$l (the new leader) SIGSTOPped 3 s"
    hold 3
    kill -CONT "$p"
    healthy 20 || bad "the cluster did not heal"
    f=$(($(leader) % 3 + 1)); p=$(member_pid "$f"); kill -STOP "$p"; echo "  e$f (a follower) SIGSTOPped 8 s"
    hold 8
    kill -CONT "$p"
    healthy 20 || bad "the cluster did not heal"
    hold 2 ;;
  cut | deposed)
    l=$(leader); link $((l + 3)) down; echo "  e$l (the leader) cut off"
    hold 10
    link $((l + 3)) up
    healthy 20 || bad "the cluster did not heal"
    hold 2 ;;
  rolling)
    for k in 1 2 3; do
      p=$(member_pid "$k"); kill -TERM "$p"
      end=$((SECONDS + 10)); while kill -0 "$p" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.05; done
      member_up "$k"
      healthy 20 || bad "e$k did not come back"
      echo "  e$k restarted"
    done
    hold 2 ;;
  quorum | brief)
    l=$(leader); a=$(member_pid "$l"); b=$(member_pid $((l % 3 + 1)))
    for i in 1 2 3; do gone_at "$i" "$out/gone$i"; done
    kill -STOP "$a" "$b"; t_stop=$(now); echo "  e$l (the leader) and e$((l % 3 + 1)) SIGSTOPped"
    held=16  # past the fence (3.75 s) and the round's last request (5 s)
    [ $chaos = brief ] && held=5  # back as the requests give up: the nodes rejoin, on new leases where theirs expired
    hold "${CHAOS_QUORUM_HOLD:-$held}"
    kill -CONT "$a" "$b"
    healthy 20 || bad "the cluster did not heal"
    wait "${gone_pids[@]}"
    for i in 1 2 3; do
      g=$(cat "$out/gone$i")
      /usr/bin/python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) - float(sys.argv[2]) < float(sys.argv[3]) else 1)' "$g" "$t_stop" "$ttl" &&
        ok "h$i's worker was gone $(minus "$g" "$t_stop") s after the quorum was lost (before a lease could expire)" ||
        bad "h$i's worker ran on $(minus "$g" "$t_stop") s after the quorum was lost"
    done
    # A node whose worker died first of its peers' fencing (gloo: connection reset) has nothing
    # left to fence: the worker gone in time is the guarantee; at least one node says it lapsed.
    wait_line "$out/a1.err" 'liveness lapsed' 10 || wait_line "$out/a2.err" 'liveness lapsed' 1 ||
      wait_line "$out/a3.err" 'liveness lapsed' 1 && ok "the nodes say their liveness lapsed" || bad "no node fenced"
    touch "$out/stop"  # a round met again stops at its first step
    [ $chaos = brief ] && replace_ended
    agents_end ;;
  node)
    gone_at 3 "$out/gone3"
    link 3 down; t_cut=$(now); echo "  h3 cut off"
    wait_line "$out/a1.out" 'world=2' 40 || bad "h1 and h2 never went on without h3"
    wait "${gone_pids[@]}"
    g=$(cat "$out/gone3") w2=$(first_step "$out/a1.out" 2)
    echo "  h3's worker gone $(minus "$g" "$t_cut") s after the cut; h1 and h2 went on $(minus "${w2:-0}" "$t_cut") s after it"
    /usr/bin/python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) else 1)' "$g" "${w2:-0}" &&
      ok "h3's worker was gone before h1 and h2 went on without it (no split brain)" ||
      bad "h3's worker still ran when h1 and h2 went on without it"
    grep -q 'liveness lapsed' "$out/a3.err" && ok "h3 says its liveness lapsed" || bad "h3 did not say it was fenced"
    link 3 up
    hold 2 ;;
  *) echo "unknown case $chaos"; exit 2 ;;
esac
touch "$out/stop"
# An agent that ends, ends with 0 or with an error that names etcd.
clear_end() {  # I
  local p=rc_$1
  if [ "${!p}" = 0 ]; then return 0; fi
  grep -q 'cannot reach etcd at h4:2379, h5:2379, h6:2379' "$out/a$1.err" &&
    ok "h$1's agent ended with exit ${!p}: $(grep -o 'lost etcd at [^(]*' "$out/a$1.err" | head -1)" ||
    { bad "h$1's agent exited ${!p} without saying why"; cat "$out/a$1.err"; }
  return 1
}
case $chaos in
  leader | cut | deposed | rolling) agents_end; finished_together; trained_on ;;
  quorum | brief)  # the agents ended meanwhile (all with a clear error), or meet again and finish
    all=0
    for i in 1 2 3; do clear_end "$i" || all=1; done
    [ $all = 0 ] && finished_together ;;
  node)  # h1 and h2 train on and finish; h3 ends, or meets them again
    agents_end
    if clear_end 3; then finished_together; else finished_together 1 2; fi ;;
esac
[ "$failed" = 0 ] || { keep_out=1; echo "  logs: $out"; }
finish
