#!/usr/bin/env bash
# Self-fencing across two namespaced hosts: h2's agent is SIGSTOPped for 12 s while its workers
# run. The other node counts h2 lost after the liveness TTL (3 s) and starts a smaller group; h2's
# guardian must have killed h2's workers before then, so that no worker of h2 runs while the new
# group does (each worker prints its wall-clock time every 0.1 s; both hosts share the clock).
# When h2's agent resumes, it joins again and the job finishes on both hosts.
# Usage: fence_test.sh BACKEND(c10d|etcd) DDPRUN
set -u
backend=$1 ddprun=$2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/hosts.sh"
hosts_up 3
case $backend in
  c10d) rdzv=(--rdzv_backend=c10d --rdzv_endpoint=h1:29400
              "--rdzv_conf=keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=2") ;;
  etcd) rdzv=(--rdzv_backend=etcd --rdzv_endpoint=h3:2379 "--rdzv_conf=lease_ttl=3,last_call_timeout=2")
        etcd_up 3 ;;
  *) echo "unknown backend $backend"; exit 2 ;;
esac
for i in 1 2; do
  start "$i" "a$i" env TICK_SECONDS=12 "$ddprun" --nnodes=1:2 --rdzv_id=fence "${rdzv[@]}" --nproc_per_node=1 \
    /usr/bin/python3 -u "$here/tick_worker.py"
done
wait_line "$out/a2.out" 'tick .* world=2' 60 || { echo "FAILED: h2's worker never ran"; cat "$out"/a*.err; exit 1; }
victim=$(ip netns pids "ns-$id-h2" | xargs -r ps -o pid=,comm= -p | awk '$2 == "ddprun" {print $1}')
kill -STOP "$victim"
stopped=$(date +%s.%N)
stopped_ms=$(($(date +%s%N) / 1000000))
wait_line "$out/a1.out" 'world=1' 30 || { echo "FAILED: h1 never went on alone"; cat "$out"/a*.err; exit 1; }
while (($(date +%s%N) / 1000000 - stopped_ms < 12000)); do sleep 0.2; done  # stopped for 12 s
kill -CONT "$victim"
wait "$pid_a1"; r1=$?
wait "$pid_a2"; r2=$?
/usr/bin/python3 - "$out/a1.out" "$out/a2.out" "$stopped" "$r1" "$r2" <<'PY'
import re, sys
f1, f2, stopped, r1, r2 = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
ticks = lambda f: [(float(t), w) for t, w in re.findall(r"tick t=(\S+) host=\S+ world=(\d+)", open(f).read())]
alone = [t for t, w in ticks(f1) if w == "1"]
h2_before = [t for t, w in ticks(f2) if t < (alone[-1] if alone else 0) + 1]
overlap = [t for t in h2_before if alone and alone[0] <= t <= alone[-1]]
last_h2 = max((t for t in h2_before if t < (alone[0] if alone else 0)), default=0)
print("h2 stopped at %.2f s; its last tick %.2f s; h1's group without h2 ran %.2f-%.2f s; h2 ticks inside: %d; "
      "exits %d/%d" % (0, last_h2 - stopped, (alone[0] - stopped) if alone else -1, (alone[-1] - stopped) if alone else -1,
                       len(overlap), r1, r2))
ok = alone and not overlap and r1 == 0 and r2 == 0 and last_h2 < alone[0]
print(("ok: " if ok else "FAILED: ") + "a member SIGSTOPped for 12 s never has a worker running beside the group "
      "started without it; the job then finishes with it")
sys.exit(0 if ok else 1)
PY
rc=$?
[ $rc -eq 0 ] || cat "$out"/a*.err
exit $rc
