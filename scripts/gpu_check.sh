#!/usr/bin/env bash
# The runtime's checks on a machine with a GPU, from a build made elsewhere and packaged by
# scripts/gpu_package.sh (this script builds nothing). One line per check: PASS or FAIL, the
# check, its figure. Exits 1 when a check failed; the logs stay in the folder printed at the end.
#
# Usage: scripts/gpu_check.sh [PACK_DIR]     (default: build-gpu-pack in the checkout)
#
# Several ranks on one GPU: NCCL refuses two ranks of one communicator on a GPU unless they look
# like separate hosts, so when a run has more ranks than GPUs each process gets its own
# NCCL_HOSTID and the loopback interface (a wrapper), and DDPRUN_NCCL_SHARE_DEVICES=1 lets the
# ranks share devices. NCCL then uses its socket transport between them: slow, but every code
# path of a multi-rank job runs.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pack=$(cd "${1:-$root/build-gpu-pack}" && pwd) || exit 2
bin=$pack/bin
for p in ddprun gpu_tests train_linear_cuda runtime_bench; do
  [[ -x $bin/$p ]] || { echo "gpu_check: $bin/$p is missing: run scripts/gpu_package.sh where ddprun builds" >&2; exit 2; }
done
nccl=$(find /opt /usr/local /usr/lib -name libnccl.so.2 2>/dev/null | head -n 1)
[[ -n $nccl ]] || { echo "gpu_check: libnccl.so.2 not found under /opt, /usr/local, /usr/lib" >&2; exit 2; }
nccl_dir=$(dirname "$nccl")
export LD_LIBRARY_PATH=$pack/lib:$nccl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# The nccl backend is a plugin ddprun::runtime loads at run time (gpu_package.sh packs it).
export DDPRUN_NCCL_BACKEND=$(ls "$pack"/lib/libddprun_runtime_nccl-*.so | head -n 1)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[[ $gpus -ge 1 ]] || gpus=1
logs=$(mktemp -d /tmp/ddprun-gpu-check.XXXXXX)
wrapper=$logs/separate_hosts.sh
cat > "$wrapper" <<'EOF'
#!/bin/sh
export NCCL_HOSTID="rank-$LOCAL_RANK" NCCL_SOCKET_IFNAME=lo
exec "$@"
EOF
chmod +x "$wrapper"
failures=0

line() {  # PASS|FAIL, check, figure
  printf '%s  %-58s %s\n' "$1" "$2" "$3"
  [[ $1 == PASS ]] || failures=$((failures + 1))
}
verdict() { if "$@"; then echo PASS; else echo FAIL; fi; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
less() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a != "" && a + 0 < b + 0) }'; }
# a and b within 1e-4 relative (checksums of runs with different rank counts).
close() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; s = (a < 0 ? -a : a)
  exit !(a != "" && b != "" && d <= 1e-4 * (s > 1 ? s : 1)) }'; }
# The value of "key": in the first JSON line of a log.
field() { sed -n "s/.*\"$2\": \([0-9.e+-]*\).*/\1/p" "$logs/$1" | head -n 1; }
# The checksum rank 0 of a train_linear_cuda run printed (empty if none).
checksum() { sed -n 's/.*RESULT rank=0 .*checksum=\([^ ]*\).*/\1/p' "$logs/$1" | head -n 1; }

# launch LOG N PROGRAM ARGS...: ddprun with N ranks (sharing GPUs when N > gpus) and the options
# in the array `extra`; output in $logs/LOG. Sets rc and secs.
extra=()
launch() {
  local log=$logs/$1 n=$2 t0
  shift 2
  local pre=()
  if ((n > gpus)); then pre=(env DDPRUN_NCCL_SHARE_DEVICES=1 "$wrapper"); fi
  t0=$(now)
  timeout 600 "$bin/ddprun" --standalone --nproc_per_node="$n" --log_level info "${extra[@]}" --no_python \
    "${pre[@]}" "$@" > "$log" 2>&1
  rc=$?
  secs=$(since "$t0")
}

check_gpu_tests() {
  local t0 pass half
  t0=$(now)
  timeout 600 "$bin/gpu_tests" > "$logs/gpu_tests.log" 2>&1
  rc=$?
  pass=$(grep -c '^PASS' "$logs/gpu_tests.log")
  line "$(verdict test "$rc" = 0)" "gpu_tests, one rank per GPU ($gpus), as threads" "$pass checks passed, $(since "$t0") s"
  launch gpu_tests_2.log 2 "$bin/gpu_tests"
  pass=$(grep -c ']:PASS' "$logs/gpu_tests_2.log")
  line "$(verdict test "$rc" = 0)" "gpu_tests, 2 ranks (processes) under ddprun" "$pass rank-checks passed, $secs s"
  half=$(grep -c ']:PASS bf16 and fp16' "$logs/gpu_tests_2.log")
  line "$(verdict test "$half" = 2)" "bf16 and fp16 all_reduce and reduce_scatter, 2 ranks" "passed on $half of 2 ranks"
}

check_train() {
  local n sums=() ok=PASS us
  for n in 1 2 4; do
    launch "train_$n.log" "$n" "$bin/train_linear_cuda" --steps 200
    sums+=("$(checksum "train_$n.log")")
    [[ $rc == 0 ]] || ok=FAIL
  done
  close "${sums[0]}" "${sums[1]}" && close "${sums[0]}" "${sums[2]}" || ok=FAIL
  line "$ok" "train_linear_cuda on 1, 2, 4 ranks: equal checksums" "${sums[*]}"
  us=$(sed -n 's/.*RESULT rank=0 .*step_us=\([0-9.]*\).*/\1/p' "$logs/train_1.log")
  line "$(verdict test -n "$us")" "train_linear_cuda, 1 rank: host time per step" "${us:-?} us (260 us before issue 19)"
}

check_faults() {
  launch stalled.log 2 "$bin/train_linear_cuda" --steps 200 --timeout_s 5 --fault stall --fault_step 50
  local ok=FAIL
  grep -q 'timed out after 5 s' "$logs/stalled.log" && [[ $rc != 0 ]] && less "$secs" 30 && ok=PASS
  line "$ok" "a stalled peer: time-out and abort (timeout 5 s)" "the job ended after $secs s, rc $rc"
  launch dead.log 2 "$bin/train_linear_cuda" --steps 200 --timeout_s 30 --fault exit --fault_step 50
  ok=FAIL
  grep -q -- '--fault exit at step 50' "$logs/dead.log" && [[ $rc != 0 ]] && less "$secs" 15 && ok=PASS
  local said="rank 0 said nothing (stopped by ddprun first)"
  grep -q ']:train_linear_cuda: nccl' "$logs/dead.log" && said="rank 0: $(grep -o ']:train_linear_cuda: nccl.*' \
    "$logs/dead.log" | head -n 1 | cut -c 22-120)"
  line "$ok" "a dead peer: the job ends well within the time-out (30 s)" "after $secs s, rc $rc; $said"
  extra=(--max_restarts=1)
  launch restart.log 2 "$bin/train_linear_cuda" --steps 200 --fault kill --fault_step 50
  extra=()
  local sum
  sum=$(checksum restart.log)
  ok=FAIL
  [[ $rc == 0 ]] && close "$sum" "$(checksum train_2.log)" && ok=PASS
  line "$ok" "a rank SIGKILLed at step 50 and restarted: same checksum" "${sum:-no result}, $secs s in all"
}

check_bench() {
  local us synced step n small big flat red
  timeout 600 "$bin/runtime_bench" cost --backend nccl > "$logs/cost.log" 2>&1
  us=$(field cost.log us_per_collective)
  synced=$(field cost.log us_per_collective_synced)
  step=$(field cost.log us_per_reducer_step)
  line "$(verdict less "$us" 10.0001)" "per-collective host cost, 257 floats, 1 rank (<= 10 us)" \
    "${us:-?} us; synchronized ${synced:-?} us; two-bucket Reducer step ${step:-?} us"
  n=$((gpus > 1 ? gpus : 2))
  launch busbw.log "$n" "$bin/runtime_bench" busbw --backend nccl
  small=$(grep '"bytes": 1048576,' "$logs/busbw.log" | sed -n 's/.*"busbw_gbps": \([0-9.]*\).*/\1/p')
  big=$(grep '"bytes": 268435456,' "$logs/busbw.log" | sed -n 's/.*"busbw_gbps": \([0-9.]*\).*/\1/p')
  line "$(verdict test "$rc" = 0)" "runtime_bench busbw on device memory, $n ranks" \
    "busBw ${small:-?} GB/s at 1 MiB, ${big:-?} GB/s at 256 MiB"
  launch resnet.log "$n" "$bin/runtime_bench" resnet50 --backend nccl
  flat=$(field resnet.log flat_s)
  red=$(field resnet.log reducer_s)
  line "$(verdict test "$rc" = 0)" "Reducer vs one flat all_reduce, ResNet-50, $n ranks" \
    "flat ${flat:-?} s, Reducer ${red:-?} s ($(awk -v a="$red" -v b="$flat" 'BEGIN { if (b > 0) printf "%.3f", a / b }')x)"
}

echo "ddprun gpu_check: $(head -n 1 "$pack/MANIFEST" 2>/dev/null), $gpus GPU(s), NCCL from $nccl"
check_gpu_tests
check_train
check_faults
check_bench
echo "logs: $logs"
((failures == 0)) || exit 1
