#!/usr/bin/python3
"""Where a PyTorch worker's init_process_group spends its time, under ddprun and under torchrun
(Debian's PyTorch 1.13 through ../shared/tools/torchrun_fixed.py), side by side.

Each worker times, with init_process_group's own steps wrapped (PyTorch 1.13 names):
  import      import torch, torch.distributed
  rendezvous  rendezvous("env://"): the TCPStore to MASTER_ADDR:MASTER_PORT (a server on rank 0
              when TORCHELASTIC_USE_AGENT_STORE is not True: it waits for every rank)
  new_group   _new_process_group_helper: ProcessGroupGloo / ProcessGroupNCCL set-up
  barrier     _store_based_barrier: every rank's ADD, polled every 10 ms by 1.13
  init        init_process_group as a whole (with the wait for slower ranks)
  group_init  from the last rank's import to the last rank's init: the group's own init time
  first_op    the first all_reduce of one float
and prints its environment. The report: the median of each step over ranks and runs, per
launcher, and the environment variables that differ between the launchers' workers.

Usage: bench/init_bench.py [--ddprun build/launcher/ddprun] [--torchrun CMD] [--backend gloo|nccl]
                           [--nproc 1,8] [--reps 3] [--variant NAME=COMMAND ...]
  --torchrun  the command that starts torchrun, e.g. torchrun (default: Python on torchrun_fixed.py)
  --variant   one more launcher to compare, e.g.
              'ddprun-localhost=env INIT_BENCH_SET=MASTER_ADDR=localhost build/launcher/ddprun'
              (INIT_BENCH_SET=K=V,... and INIT_BENCH_UNSET=K,... change the worker's environment
              before it imports torch; PYTHONFAULTHANDLER in INIT_BENCH_UNSET also turns it off)
       (nccl: one GPU per rank, LOCAL_RANK's, through device_id where PyTorch has it)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCHRUN_FIXED = os.path.join(os.path.dirname(ROOT), "shared", "tools", "torchrun_fixed.py")
STEPS = ["import", "rendezvous", "new_group", "barrier", "init", "group_init", "first_op"]

WORKER = r"""
import json, os, sys, time
# A variant's changes to what the launcher gave (INIT_BENCH_SET=K=V,...; INIT_BENCH_UNSET=K,...).
for kv in filter(None, os.environ.pop("INIT_BENCH_SET", "").split(",")):
    os.environ[kv.split("=", 1)[0]] = kv.split("=", 1)[1]
for k in filter(None, os.environ.pop("INIT_BENCH_UNSET", "").split(",")):
    os.environ.pop(k, None)
    if k == "PYTHONFAULTHANDLER":
        import faulthandler
        faulthandler.disable()
T = {}
t = time.perf_counter()
import torch, torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
T["import"] = time.perf_counter() - t

def timed(name, fn):
    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            T[name] = T.get(name, 0.0) + time.perf_counter() - t
    return wrapper

def timed_iterator(name, fn):  # rendezvous() returns an iterator: the work is in next()
    def wrapper(*a, **k):
        it = fn(*a, **k)
        while True:
            t = time.perf_counter()
            try:
                value = next(it)
            except StopIteration:
                return
            T[name] = T.get(name, 0.0) + time.perf_counter() - t
            yield value
    return wrapper

c10d.rendezvous = timed_iterator("rendezvous", c10d.rendezvous)
for name, attr in (("new_group", "_new_process_group_helper"), ("barrier", "_store_based_barrier")):
    if hasattr(c10d, attr):
        setattr(c10d, attr, timed(name, getattr(c10d, attr)))
backend = sys.argv[1]
kwargs = {}
if backend == "nccl":
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    if "device_id" in dist.init_process_group.__code__.co_varnames:
        kwargs["device_id"] = device
t = time.perf_counter()
T["imported_at"] = time.time()
dist.init_process_group(backend, **kwargs)
T["init"] = time.perf_counter() - t
T["init_done_at"] = time.time()
x = torch.ones(1, device="cuda" if backend == "nccl" else "cpu")
t = time.perf_counter()
dist.all_reduce(x)
if backend == "nccl":
    torch.cuda.synchronize()
T["first_op"] = time.perf_counter() - t
sys.stdout.write("TIMES " + json.dumps(T) + "\n")
if os.environ["RANK"] == "0":
    sys.stdout.write("ENV " + json.dumps(dict(os.environ)) + "\n")
sys.stdout.flush()
dist.destroy_process_group()
"""


def run(launcher, nproc, backend, script, env):
    cmd = launcher + ["--standalone", f"--nproc_per_node={nproc}", script, backend]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-2000:]}")
    times, worker_env = [], {}
    for line in p.stdout.splitlines():
        body = line.split(":", 1)[1] if line.startswith("[") else line
        if body.startswith("TIMES "):
            times.append(json.loads(body[6:]))
        elif body.startswith("ENV "):
            worker_env = json.loads(body[4:])
    # What the launcher can be blamed for: from the last rank's import to the last rank's init.
    group_init = max(t["init_done_at"] for t in times) - max(t["imported_at"] for t in times)
    for t in times:
        t["group_init"] = group_init
    return times, worker_env


def report(name, nproc, samples):
    cells = []
    for step in STEPS:
        values = [s[step] for s in samples if step in s]
        cells.append(f"{statistics.median(values) * 1000:9.1f}" if values else f"{'-':>9}")
    print(f"{name:>18} | {nproc:5} | " + " | ".join(cells))


def env_differences(ours, theirs, inherited):
    keys = sorted(set(ours) | set(theirs))
    for k in keys:
        a, b = ours.get(k), theirs.get(k)
        if a == b or (k in inherited and a == inherited[k] and b == inherited[k]):
            continue
        if k in ("RANK", "LOCAL_RANK", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE",
                 "DDPRUN_HEARTBEAT_FILE"):
            a, b = ("set" if a else a), ("set" if b else b)  # differ by nature, per run
            if a == b:
                continue
        print(f"  {k:34} ddprun: {a!s:40.40}  torchrun: {b!s:.40}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", default=os.path.join(ROOT, "build", "launcher", "ddprun"))
    ap.add_argument("--torchrun", default=f"{sys.executable} {TORCHRUN_FIXED}")
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--nproc", default="1,8")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--variant", action="append", default=[])
    args = ap.parse_args()
    env = dict(os.environ, PYTHON_EXEC=sys.executable, LOGLEVEL="WARNING")
    launchers = {"ddprun": [args.ddprun, "--log_level=warn"], "torchrun": args.torchrun.split()}
    for v in args.variant:
        name, command = v.split("=", 1)
        launchers[name] = command.split()
    envs = {}
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "init_worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        print(f"init_process_group('{args.backend}'), medians over ranks and {args.reps} runs, ms")
        print(f"{'launcher':>18} | ranks | " + " | ".join(f"{s:>9}" for s in STEPS))
        for nproc in (int(n) for n in args.nproc.split(",")):
            samples = {name: [] for name in launchers}
            for _ in range(args.reps):  # in turn, so that a change in the machine's load hits both
                for name, launcher in launchers.items():
                    times, envs[name] = run(launcher, nproc, args.backend, script, env)
                    samples[name] += times
            for name in launchers:
                report(name, nproc, samples[name])
    print("\nEnvironment differences of rank 0 (beyond what both inherit and per-run values):")
    env_differences(envs["ddprun"], envs["torchrun"], env)


if __name__ == "__main__":
    main()
