#!/usr/bin/env bash
# How PyTorch 2.x workers really start, on a machine with a GPU (issue 20): start-up is not a
# hang, the progress hook catches a stopped rank of an unmodified script, stacks behind wrapper
# scripts and without eu-stack or gdb, no deprecation warning, GPU counting without CUDA, NUMA
# by PCI bus id, and init_process_group('nccl') timed under ddprun and torchrun.
# One line per check: PASS or FAIL, the check, its figure. Exits 1 when a check failed; the logs
# stay in the folder printed at the end. scripts/gpu_check.sh may call it.
#
# Here, where ddprun builds:   scripts/gpu_check_startup.sh package [BUILD_DIR [PACK_DIR]]
# On the GPU machine:          scripts/gpu_check_startup.sh [PACK_DIR]
# PACK_DIR (default build-gpu-startup in the checkout, which git ignores) holds bin/ddprun,
# bin/ddprun-stack, bin/test_worker, share/ddprun/python/ (found beside ddprun as when
# installed) and lib/ (the shared libraries they need beyond the C/C++ runtime).
# The GPU machine needs python3 with PyTorch 2.x and torchrun on PATH, and nvidia-smi.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

package() {
  local build out p
  build=$(cd "${1:-$root/build}" && pwd) || exit 2
  out=${2:-$root/build-gpu-startup}
  cmake --build "$build" -j2 --target ddprun ddprun-stack test_worker || exit 1
  rm -rf "$out" && mkdir -p "$out/bin" "$out/lib" "$out/share/ddprun"
  strip -o "$out/bin/ddprun" "$build/launcher/ddprun"
  strip -o "$out/bin/ddprun-stack" "$build/launcher/ddprun-stack"
  cp "$build/tests/test_worker" "$out/bin/"  # not stripped: its stack must name its functions
  cp -r "$build/share/ddprun/python" "$out/share/ddprun/"
  local skip='^(linux-vdso|ld-linux|libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|libcuda|libnvidia|libnccl)\.'
  for p in launcher/ddprun launcher/ddprun-stack tests/test_worker; do
    ldd "$build/$p" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
  done | sort -u | while read -r name path; do
    [[ $name =~ $skip ]] || cp -L "$path" "$out/lib/$name"
  done
  echo "commit $(git -C "$root" rev-parse HEAD)" > "$out/MANIFEST"
  du -sh "$out"
  echo "gpu_check_startup: $out ready; on the GPU machine: scripts/gpu_check_startup.sh $(basename "$out")"
}
if [[ ${1:-} == package ]]; then
  shift
  package "$@"
  exit
fi

pack=$(cd "${1:-$root/build-gpu-startup}" && pwd) || exit 2
bin=$pack/bin
for p in ddprun ddprun-stack test_worker; do
  [[ -x $bin/$p ]] || { echo "gpu_check_startup: $bin/$p is missing: run '$0 package' where ddprun builds" >&2; exit 2; }
done
export LD_LIBRARY_PATH=$pack/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
logs=$(mktemp -d /tmp/ddprun-gpu-startup.XXXXXX)
failures=0
line() {  # PASS|FAIL, check, figure
  printf '%s  %-66s %s\n' "$1" "$2" "$3"
  [[ $1 == PASS ]] || failures=$((failures + 1))
}
verdict() { if "$@"; then echo PASS; else echo FAIL; fi; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
less() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a != "" && a + 0 < b + 0) }'; }

# An unmodified DDP script on NCCL (nothing about heartbeats in it): init with device_id, then
# STEPS steps, a line every 10.
cat > "$logs/train.py" <<'EOF'
import os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
steps = int(sys.argv[1])
device = torch.device("cuda", 0)  # the one GPU (several ranks look like several hosts to NCCL)
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device)
model = DDP(torch.nn.Linear(256, 256).to(device))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(steps):
    opt.zero_grad()
    model(torch.randn(64, 256, device=device)).square().mean().backward()
    opt.step()
    if step % 10 == 0:
        torch.cuda.synchronize()
        print(f"step {step}", flush=True)
dist.destroy_process_group()
print("RESULT done", flush=True)
EOF
# Each rank a separate host to NCCL (one GPU), through a wrapper that does not exec: Python runs
# below a shell, as under srun-style scripts.
cat > "$logs/wrap.sh" <<'EOF'
#!/bin/sh
export NCCL_HOSTID="rank-$LOCAL_RANK" NCCL_SOCKET_IFNAME=lo
"$@"
exit $?
EOF
chmod +x "$logs/wrap.sh"

check_startup() {  # a start (import torch, NCCL init) longer than --worker_timeout is no hang
  local t0 rc first
  t0=$(now)
  timeout 600 "$bin/ddprun" --standalone --nproc_per_node=1 --worker_timeout=2 --no_python \
    python3 -u "$logs/train.py" 300 > "$logs/startup.log" 2>&1
  rc=$?
  line "$(verdict test "$rc" = 0)" "an unmodified NCCL script under --worker_timeout=2 finishes" \
    "rc $rc after $(since "$t0") s (its start alone takes longer than 2 s)"
  local warned
  warned=$(grep -c 'NCCL_ASYNC_ERROR_HANDLING is deprecated' "$logs/startup.log")
  line "$(verdict test "$warned" = 0)" "PyTorch 2.x: no NCCL_ASYNC_ERROR_HANDLING deprecation line" "$(python3 -c \
    'import torch; print("torch", torch.__version__)' 2>&1)"
  timeout 600 "$bin/ddprun" --standalone --nproc_per_node=1 --no_progress_hook --no_python \
    python3 -u "$logs/train.py" 20 > "$logs/no_hook.log" 2>&1
  first=$(grep -c 'NCCL_ASYNC_ERROR_HANDLING is deprecated' "$logs/no_hook.log")
  line "$(verdict test "$first" -ge 1)" "... and the line does come without the hook (both names set)" \
    "$first line(s) with --no_progress_hook"
}

# The pid of the only child of `pid` (the Python below a wrapper), empty if none.
child_of() { tr ' ' '\n' < "/proc/$1/task/$1/children" 2>/dev/null | grep -m1 .; }

check_sigstop() {  # 2 ranks behind a wrapper; rank 1's Python SIGSTOPped mid-training
  local log=$logs/sigstop.log events=$logs/sigstop.events pid py t0 rc ok=FAIL
  "$bin/ddprun" --standalone --nproc_per_node=2 --worker_timeout=3 --stop_timeout=2 --events_file="$events" \
    --no_python "$logs/wrap.sh" python3 -u "$logs/train.py" 100000 > "$log" 2>&1 &
  local agent=$!
  for _ in $(seq 600); do grep -q ']:step 20' "$log" && break; sleep 0.1; done  # poll: an outside view
  pid=$(sed -n 's/.*"workers_started".*"pids":\[[0-9]*,\([0-9]*\)\].*/\1/p' "$events")
  py=$(child_of "$pid")
  [[ -n $py ]] && kill -STOP "$py"
  t0=$(now)
  wait "$agent"
  rc=$?
  [[ $rc == 124 ]] && grep -q 'no heartbeat for' "$log" && less "$(since "$t0")" 30 && ok=PASS
  line "$ok" "rank 1 (python $py below wrap.sh $pid) SIGSTOPped: caught as hung" "rc $rc, $(since "$t0") s after SIGSTOP"
  ok=FAIL
  grep -A3 'stacks of the workers on' "$log" | grep -q 'train.py' && ! grep -q '(no stack)' "$log" && ok=PASS
  line "$ok" "both ranks' Python stacks, found below the wrapper" \
    "$(grep -A3 'stacks of the workers on' "$log" | grep -m1 -o 'rank.*' | cut -c1-70)"
}

check_native_stack() {  # a hung native worker, on a machine without eu-stack or gdb
  local tools rc
  tools=$(command -v eu-stack gdb | tr '\n' ' ')
  timeout 120 "$bin/ddprun" --standalone --nproc_per_node=1 --worker_timeout=1 --stop_timeout=1 --no_python \
    /bin/sh -c "$bin/test_worker heartbeat:2:50 stuck; exit \$?" > "$logs/native.log" 2>&1
  rc=$?
  local named
  named=$(grep -c 'rank 0: ddprun_test_stuck_in_all_reduce (test_worker.cpp:' "$logs/native.log")
  line "$(verdict test "$named" -ge 1 -a "$rc" = 124)" "a hung native worker's stack with names (ddprun-stack)" \
    "rc $rc; eu-stack/gdb on this machine: ${tools:-none}"
}

# LOCAL_WORLD_SIZE that `ddprun --nproc_per_node=gpu` gives (empty: it refused), under `env`.
gpu_count() {
  env "$@" "$bin/ddprun" --standalone --nproc_per_node=gpu --log_level warn --no_python \
    /bin/sh -c 'echo "n=$LOCAL_WORLD_SIZE"' 2>/dev/null | sed -n 's/^\[default0\]:n=//p'
}

# The median wall time, in ms, of 11 runs of ddprun --nproc_per_node=$1 with a /bin/true worker.
median_ms() {
  local i t0 all=()
  for i in $(seq 11); do
    t0=$(date +%s%N)
    "$bin/ddprun" --standalone --nproc_per_node="$1" --log_level warn --no_python /bin/true > /dev/null 2>&1
    all+=($(( ($(date +%s%N) - t0) / 1000 )))
  done
  printf '%s\n' "${all[@]}" | sort -n | awk '{ v[NR] = $1 } END { printf "%.1f", v[6] / 1000 }'
}

check_gpu_count() {
  local smi first n uuid_n empty_n idx_n gpu_ms one_ms maps
  smi=$(nvidia-smi -L | grep -c '^GPU')
  first=$(nvidia-smi -L | sed -n '1s/.*(UUID: \(GPU-[^)]*\)).*/\1/p')
  n=$(gpu_count -u CUDA_VISIBLE_DEVICES)
  uuid_n=$(gpu_count CUDA_VISIBLE_DEVICES="$first")
  idx_n=$(gpu_count CUDA_VISIBLE_DEVICES=0)
  empty_n=$(gpu_count CUDA_VISIBLE_DEVICES=)
  line "$(verdict test "$n" = "$smi" -a "$uuid_n" = 1 -a "$idx_n" = 1 -a -z "$empty_n")" \
    "--nproc_per_node=gpu counts as nvidia-smi -L, CUDA_VISIBLE_DEVICES applied" \
    "$n of $smi; by UUID ${uuid_n:-none}, by index ${idx_n:-none}, empty ${empty_n:-refused}"
  gpu_ms=$(median_ms gpu)
  one_ms=$(median_ms "$smi")
  line "$(verdict less "$gpu_ms" "$(awk -v a="$one_ms" 'BEGIN { print a + 5 }')")" \
    "--nproc_per_node=gpu costs <= 5 ms more than a number" "median $gpu_ms ms vs $one_ms ms (11 runs each)"
  maps=$("$bin/ddprun" --standalone --nproc_per_node=gpu --log_level warn --no_python \
    /bin/sh -c 'grep -c -e libcuda -e libcudart "/proc/$PPID/maps"' 2>/dev/null | sed -n 's/^\[default0\]://p')
  line "$(verdict test "$maps" = 0)" "the launcher maps neither libcuda nor libcudart" "${maps:-?} mapping(s)"
}

check_numa() {  # local rank 0's NUMA node is its GPU's, by PCI bus id
  local bus sysfs said
  bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i 0 | tr 'A-F' 'a-f' | sed 's/^0000\(....:\)/\1/')
  sysfs=$(cat "/sys/bus/pci/devices/$bus/numa_node" 2>/dev/null)
  said=$(CUDA_VISIBLE_DEVICES=0 "$bin/ddprun" --standalone --nproc_per_node=1 --numa_binding=node --report_bindings \
    --no_python /bin/true 2>&1 | sed -n 's/.*local rank 0: .*NUMA node \([0-9]*\).*/\1/p')
  if [[ -z $sysfs || $sysfs -lt 0 ]]; then
    line PASS "--numa_binding: GPU 0 has no NUMA node in sysfs ($bus): nothing to compare" "bound to ${said:-?}"
  else
    line "$(verdict test "$said" = "$sysfs")" "--numa_binding=node binds local rank 0 to its GPU's NUMA node" \
      "GPU $bus: sysfs $sysfs, ddprun ${said:-?}"
  fi
}

check_init_time() {  # where the 0.2 s went: the same script under each launcher and variant
  local d="$bin/ddprun --log_level=warn"
  python3 "$root/bench/init_bench.py" --backend nccl --nproc 1 --reps 5 --ddprun "$bin/ddprun" --torchrun torchrun \
    --variant "ddprun-numa=$d --numa_binding=node" \
    --variant "ddprun-localhost=env INIT_BENCH_SET=MASTER_ADDR=localhost $d" \
    --variant "ddprun-nofaulthdl=env INIT_BENCH_UNSET=PYTHONFAULTHANDLER $d" > "$logs/init.log" 2>&1
  local rc=$? ours theirs
  sed 's/^/      /' "$logs/init.log" | head -20
  ours=$(awk '$1 == "ddprun" { print $13 }' "$logs/init.log")
  theirs=$(awk '$1 == "torchrun" { print $13 }' "$logs/init.log")
  line "$(verdict less "$ours" "$(awk -v a="$theirs" 'BEGIN { print a * 1.1 + 1 }')")" \
    "init_process_group('nccl', device_id) at torchrun's speed (+10%)" "ddprun ${ours:-?} ms, torchrun ${theirs:-?} ms (rc $rc)"
}

echo "ddprun gpu_check_startup: $(head -n 1 "$pack/MANIFEST" 2>/dev/null), $(nvidia-smi -L | grep -c '^GPU') GPU(s)"
check_startup
check_sigstop
check_native_stack
check_gpu_count
check_numa
check_init_time
echo "logs: $logs"
((failures == 0)) || exit 1
