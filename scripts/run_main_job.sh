#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), then runs the main job: a real multi-worker PyTorch DDP
# training run on CPU, launched by ddprun (its workers rendezvous through ddprun's store).
# Usage: scripts/run_main_job.sh [NUM_WORKERS]   (default 4)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
build=${DDPRUN_BUILD_DIR:-$root/build}
n=${1:-4}
echo "main job: ddprun --standalone --nproc_per_node=$n examples/ddp_train.py"
PYTHON_EXEC=/usr/bin/python3 exec "$build/launcher/ddprun" --standalone --nproc_per_node="$n" \
  "$root/examples/ddp_train.py" --epochs 5
