#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), then runs the main job: a real multi-worker PyTorch DDP
# training run on CPU whose workers rendezvous through ddprun's store.
# Usage: scripts/run_main_job.sh [NUM_WORKERS]   (default 4)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
build=${DDPRUN_BUILD_DIR:-$root/build}
n=${1:-4}

# The store, on a free port it picks and prints.
exec 3< <("$build/rendezvous/ddprun-store" --host 127.0.0.1 --port 0 --log_level warn)
store_pid=$!
trap 'kill $store_pid 2>/dev/null || true' EXIT
read -r line <&3
port=${line##*:}
echo "main job: ddprun-store $line, $n workers"

# Until the launcher (issue 3) lands, start the workers here with torchrun's environment.
pids=()
for ((rank = 0; rank < n; rank++)); do
  RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=$n LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
  TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RESTART_COUNT=0 OMP_NUM_THREADS=1 \
    /usr/bin/python3 -u "$root/examples/ddp_train.py" > >(sed -u "s/^/[rank$rank]: /") 2>&1 &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
