#!/usr/bin/env bash
# Installs what a build needs and builds only what this job runs (scripts/setup.sh ddprun
# train_mlp; the tests are scripts/test.sh's), then runs the main job: ddprun launches
# train_mlp, a data-parallel MLP trained on CPU with ddprun's runtime (gloo, bucketed gradient
# all-reduce), on NUM_WORKERS workers. Rank 1 crashes at step 125 of the first attempt; ddprun restarts the
# group and it resumes from its last checkpoint, ending with the same parameters as a run that
# never crashed.
# Usage: scripts/run_main_job.sh [NUM_WORKERS]   (default 4)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh" ddprun train_mlp  # what this job runs; scripts/test.sh builds the rest
build=${DDPRUN_BUILD_DIR:-$root/build}
n=${1:-4}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "main job: ddprun --standalone --nproc_per_node=$n --max_restarts=1 train_mlp --steps 300 --crash_at_step 125"
"$build/launcher/ddprun" --standalone --nproc_per_node="$n" --max_restarts=1 \
  "$build/examples/train_mlp" --steps 300 --checkpoint "$work/mlp.ckpt" --crash_at_step 125 | tee "$work/out.txt"
echo
echo "main job: the same training without a crash, for comparison"
"$build/launcher/ddprun" --standalone --nproc_per_node="$n" --log_level warn \
  "$build/examples/train_mlp" --steps 300 | grep RESULT | tee "$work/plain.txt"
a=$(grep -m1 -o 'checksum=[^ ]*' "$work/out.txt")
b=$(grep -m1 -o 'checksum=[^ ]*' "$work/plain.txt")
if [ "$a" = "$b" ]; then
  echo "main job: crashed-and-resumed run and uninterrupted run end with the same parameters ($a)"
else
  echo "main job: MISMATCH: resumed $a, uninterrupted $b" >&2
  exit 1
fi
