#!/usr/bin/env bash
# A native trainer's usual mistakes under ddprun (tests/e2e/mistakes_worker.cpp), each of which
# must end in an error that names it: mismatched collectives (counts, types; with and without
# DDPRUN_DISTRIBUTED_DEBUG=detail), a Reducer whose parameters differ, a trainer that never
# broadcasts its parameters, a missing finalize(), an exception on one rank, a rank stuck outside
# any collective; and a world of one without the launcher.
# Usage: tests/runtime_mistakes_test.sh DDPRUN MISTAKES_WORKER TRAIN_MLP
source "$(dirname "$0")/lib.sh"
ddprun=$1
worker=$2
train=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# run NAME NPROC [ddprun options...] -- MODE: ddprun's output in $work/NAME.txt, exit code in rc,
# seconds in secs. Its temporary directory in $work, where the stacks a hang keeps go with it.
run() {
  local name=$1 n=$2; shift 2
  local opts=()
  while [ "$1" != -- ]; do opts+=("$1"); shift; done
  shift
  local t0; t0=$(date +%s.%N)
  TMPDIR=$work timeout 120 "$ddprun" --standalone --nproc_per_node="$n" --log_level warn "${opts[@]}" "$worker" "$@" \
    >"$work/$name.txt" 2>&1
  rc=$?
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
}
show() { echo "--- $1 (exit $rc, $secs s):"; tail -25 "$work/$1.txt"; }
# check WHAT NAME CONDITION: CONDITION is evaluated by bash, with $out = NAME's output file.
check() { local what=$1 name=$2 out="$work/$2.txt"; if eval "$3"; then ok "$what ($secs s)"; else bad "$what"; show "$name"; fi; }
below() { awk -v s="$secs" -v l="$1" 'BEGIN { exit !(s < l) }'; }

# Counts: 8 floats on rank 0, 4 on rank 1. Without the debug mode, found at the time-out.
MW_TIMEOUT_MS=2000 run count 2 -- count_mismatch
check "count mismatch: a CollectiveMismatchError naming both ranks' calls, at the time-out" count '
  grep -q "ERROR mismatch: gloo: all_reduce #1 on rank" $out &&
  grep -qF "rank 0 called all_reduce(count 8, float32, sum); rank 1 called all_reduce(count 4, float32, sum)" $out'
MW_TIMEOUT_MS=60000 DDPRUN_DISTRIBUTED_DEBUG=detail run count_debug 2 -- count_mismatch
check "count mismatch with DDPRUN_DISTRIBUTED_DEBUG=detail: the same error at once, not after the 60 s time-out" count_debug '
  grep -qF "rank 0 called all_reduce(count 8, float32, sum); rank 1 called all_reduce(count 4, float32, sum)" $out &&
  below 15'

# No false alarm: a Reducer with many buckets on three lanes, checked before every collective,
# trains exactly as without the checks.
secs=-
plain=$(timeout 120 "$ddprun" --standalone --nproc_per_node=4 --log_level warn "$train" --steps 100 --bucket_cap_mb 0.004 2>&1 | grep -m1 -o 'checksum=.*')
checked=$(DDPRUN_DISTRIBUTED_DEBUG=detail timeout 120 "$ddprun" --standalone --nproc_per_node=4 --log_level warn "$train" --steps 100 --bucket_cap_mb 0.004 2>&1 | grep -m1 -o 'checksum=.*')
if [ -n "$plain" ] && [ "$plain" = "$checked" ]; then ok "train_mlp under DDPRUN_DISTRIBUTED_DEBUG=detail: no mismatch reported, same $plain"
else bad "train_mlp under DDPRUN_DISTRIBUTED_DEBUG=detail: '$checked' vs '$plain'"; fi

# Types of different sizes: Gloo's own thread used to abort the process (SIGABRT, exit 134).
MW_TIMEOUT_MS=2000 run dtype 2 -- dtype_mismatch
check "dtype mismatch: named (float64 vs float32), no abort" dtype '
  grep -qF "rank 0 called all_reduce(count 4, float64, sum); rank 1 called all_reduce(count 4, float32, sum)" $out &&
  ! grep -q "terminate called" $out && [ $rc -ne 134 ]'
MW_TIMEOUT_MS=60000 DDPRUN_DISTRIBUTED_DEBUG=detail run dtype_debug 2 -- dtype_mismatch
check "dtype mismatch with the debug mode: named at once, no abort" dtype_debug '
  grep -qF "rank 0 called all_reduce(count 4, float64, sum); rank 1 called all_reduce(count 4, float32, sum)" $out &&
  ! grep -q "terminate called" $out && [ $rc -ne 134 ] && below 15'

# A Reducer whose parameter sizes differ on rank 1.
MW_TIMEOUT_MS=2000 run reducer 2 -- reducer_mismatch
check "Reducer with different parameters: a UsageError naming the ranks, no SIGABRT" reducer '
  grep -qF "ERROR usage: Reducer: the ranks registered different parameters (rank 0: 2 parameters of 20 elements; rank 1: 2 parameters of 24 elements)" $out &&
  ! grep -q "terminate called" $out && [ $rc -ne 134 ]'

# No broadcast_tensors: the Reducer broadcasts rank 0's parameters at construction.
run bcast 3 -- no_broadcast
p0=$(sed -n 's/.*PARAMS rank 0: //p' "$work/bcast.txt")
check "a trainer without broadcast_tensors: every replica starts from rank 0's parameters" bcast '
  [ $rc -eq 0 ] && [ -n "$p0" ] && [ $(grep -c "PARAMS rank [0-9]: $p0\$" $out) -eq 3 ]'

# finalize() forgotten: the optimizer's read of the gradient says so, before any is applied.
run final 2 -- no_finalize
check "a missing finalize(): a UsageError naming finalize() before the first gradient is applied" final '
  grep -q "ERROR usage: Reducer: grad(0) after mark_ready(0) and before finalize(): .*call finalize()" $out &&
  ! grep -q "APPLIED step" $out'

# An exception on rank 1 with a short time-out: rank 1 is the root cause, at once.
MW_TIMEOUT_MS=3000 run raise 2 -- raise
check "an exception on rank 1: rank 1 is the root cause, its message shown, before the 3 s time-out" raise '
  grep -A8 "Root cause" $out | grep -q "rank       : 1 " &&
  grep -q "ERROR other: the data loader found a corrupt batch" $out && below 2.5'

# Rank 0 stops calling collectives (its last heartbeat a second after rank 1's); rank 1 waits in
# all_reduce and misses its heartbeat first: rank 0 is blamed all the same.
MW_TIMEOUT_MS=60000 run stuck 2 --worker_timeout=3 --stop_timeout=2 -- stuck_outside
check "a rank stuck outside any collective is the root cause of the hang" stuck '
  grep -A8 "Root cause" $out | grep -q "rank       : 0 " &&
  grep -A8 "Root cause" $out | grep -q "rank 0 (host .*, pid [0-9]*) is stuck outside any collective in .*stuck_outside_collectives" &&
  grep -A8 "Root cause" $out | grep -q "; rank 1 waits for it in .*; rank 1: no heartbeat for"'

# No launcher at all: a world of one, with a one-line notice.
t0=$(date +%s.%N)
env -u RANK -u WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT -u LOCAL_RANK -u LOCAL_WORLD_SIZE \
  timeout 60 "$worker" no_broadcast >"$work/one.txt" 2>&1
rc=$?
secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
check "without a launcher: a world of one, said in one line" one '
  [ $rc -eq 0 ] && grep -q "PARAMS rank 0: " $out && [ $(grep -c "running as a world of one" $out) -eq 1 ]'
finish
