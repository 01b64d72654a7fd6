#!/usr/bin/env bash
# A straggler that no node sees among its own ranks (README: Hangs, stragglers): PyTorch gloo
# DDP across two namespaced hosts, one worker each (static node ranks: h1 holds rank 0, h2 rank
# 1; the store on h1's agent); rank 1 is busy 0.3 s in Python before each step, so rank 0 waits
# for it in every all-reduce. Each node puts its pace windows in the workers' store; the node of
# group rank 0 (h1) judges over both and names rank 1 and its host, once; h2, with one rank, names
# none itself; both end 0 (slow is no hang).
# Usage: straggler_test.sh DDPRUN
set -u
ddprun=$1
here=$(cd "$(dirname "$0")" && pwd)
worker=$here/../python/hang_worker.py
source "$here/hosts.sh"
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null ||
  skip_or_fail "PyTorch is not installed (scripts/setup.sh installs python3-torch)"
hosts_up 2
fail=0
for i in 1 2; do
  start "$i" "h$i" "$ddprun" --nnodes=2 --node_rank=$((i - 1)) --master_addr=h1 --master_port=29400 \
    --nproc_per_node=1 --hang_floor=3 --hang_stop=5 --events_file="$out/events$i.jsonl" --metrics_port=0 \
    /usr/bin/python3 -u "$worker" --steps 90 --slow_rank 1 --slow_s 0.3
done
# While the job runs on, h1's metrics count it (read until they do, at most 3 s: the metrics are
# refreshed on the agent's tick): ddprun_job_stragglers 1.
metric=""
if wait_line "$out/h1.err" "is a straggler across the job" 60; then
  port=$(grep -oE "metrics on port [0-9]+" "$out/h1.err" | grep -oE "[0-9]+$" | head -1)
  metric=$(on 1 /usr/bin/python3 -c "
import time, urllib.request as u
end, m = time.monotonic() + 3, ''
while time.monotonic() < end and m != 'ddprun_job_stragglers 1':
    text = u.urlopen('http://127.0.0.1:$port/metrics', timeout=5).read().decode()
    m = ([l for l in text.splitlines() if l.startswith('ddprun_job_stragglers')] or [''])[0]
    time.sleep(0.1)
print(m)")
fi
wait "$pid_h1"; r1=$?
wait "$pid_h2"; r2=$?
named=$(grep -h "is a straggler across the job" "$out/h1.err")
echo "  exits $r1/$r2"
echo "  h1: $named"
check() { if eval "$1"; then echo "ok: $2"; else echo "FAILED: $2"; fail=1; fi; }
check '[ "$r1" -eq 0 ] && [ "$r2" -eq 0 ]' "both nodes end 0"
check 'echo "$named" | grep -q "rank 1 (host h2) is a straggler across the job.s 2 nodes"' "h1 names rank 1 on h2"
check '[ "$(echo "$named" | grep -c .)" -eq 1 ]' "once"
check '[ "$metric" = "ddprun_job_stragglers 1" ]' "h1's metric while it runs: $metric"
check '! grep -q "straggler" "$out/h2.err"' "h2 names nothing (its one rank has none to compare with)"
check 'grep "\"straggler\"" "$out/events1.jsonl" | grep -q "\"across_nodes\":true"' "h1's event log has the straggler event"
check '! grep -q "hang" "$out/h1.err" "$out/h2.err"' "no hang reported"
[ $fail -eq 0 ] || cat "$out/h1.err" "$out/h2.err"
exit $fail
