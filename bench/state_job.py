#!/usr/bin/python3
"""The job bench/state_bench.py runs: PyTorch DDP over gloo with --state_mb MB of state per rank
(a small model trained for real, and state tensors the optimizer step changes), a step of
--step_s seconds (a sleep in forward stands for a GPU's compute, leaving the CPU to the copy),
rank 1 dying halfway through step --crash_step + 1 of the first attempt. It saves with
torch.save every --every steps (--mode disk) or ddprun.state.save every step (--mode memory; --mode
persist also asks the agent to write it to DIR/persist.RANK.state every --every steps; --mode
replicated saves it all as replicated, each rank copying its share), and
resumes from what it saved.

Writes DIR/crash (time.time() before the crash), DIR/first.RANK (time.time() after the first
step of attempt 1) and prints "STEP rank=R attempt=A step=S save=SECONDS fence=SECONDS
time=SECONDS" a step (what the save took; what the step's optimizer waited for the last save's
copy: in the step's time) and at the end "RESULT rank=R attempt=A resumed=S stall=SECONDS saves=N
step=SECONDS rss=BYTES area=BYTES copy=SECONDS load=SECONDS" (copy: the save thread's time per
save, in attempt 1; load: the state's load, into the model and optimizer included).
"""
import argparse
import os
import resource
import time

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--mode", choices=["disk", "memory", "persist", "replicated"], required=True)
ap.add_argument("--state_mb", type=float, default=256)
ap.add_argument("--steps", type=int, default=14)
ap.add_argument("--crash_step", type=int, default=8)
ap.add_argument("--every", type=int, default=5)
ap.add_argument("--step_s", type=float, default=1.0)
ap.add_argument("--dir", required=True)
a = ap.parse_args()
in_memory = a.mode in ("memory", "persist", "replicated")
# --mode replicated: the state is alike on every rank (DDP's model, the optimizer's state): each
# rank copies its share of it (save(..., replicated=)).
replicated = ("model", "optimizer", "big") if a.mode == "replicated" else ()
if in_memory:
    import ddprun.state  # before the optimizer: its fence (PyTorch 1.x)

attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Linear(256, 256)
ddp = torch.nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
chunks = max(1, int(a.state_mb // 64))
big = [torch.zeros(int(a.state_mb * 2**20) // 4 // chunks) for _ in range(chunks)]  # the state's bulk
ckpt = os.path.join(a.dir, f"ckpt.{rank}.pt")

start = 0
load_s = time.perf_counter()
if in_memory:
    found = ddprun.state.load()
    if found is not None:
        model.load_state_dict(found[1]["model"])
        optimizer.load_state_dict(found[1]["optimizer"])
        for b, s in zip(big, found[1]["big"]):
            b.copy_(s)
        start = found[0] + 1
        del found  # keep none of the loaded tensors alive
elif os.path.exists(ckpt):
    saved = torch.load(ckpt)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    for b, s in zip(big, saved["big"]):
        b.copy_(s)
    start = saved["step"] + 1
    del saved
load_s = time.perf_counter() - load_s  # the state's load, into the model and optimizer

stall, saves, step_times, fenced = 0.0, 0, [], 0.0
for step in range(start, a.steps):
    t0 = time.perf_counter()
    if attempt == 0 and rank == 1 and step == a.crash_step + 1:
        time.sleep(a.step_s / 2)
        with open(os.path.join(a.dir, "crash"), "w") as f:
            f.write(repr(time.time()))
        os._exit(1)
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(step * 10 + rank))
    time.sleep(a.step_s)  # the accelerator's share of the step
    loss = ddp(x).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    for b in big:
        b[step % b.numel()] += 1.0  # the optimizer's state changes at every step
    step_times.append(time.perf_counter() - t0)
    if step == start and attempt > 0:
        with open(os.path.join(a.dir, f"first.{rank}"), "w") as f:
            f.write(repr(time.time()))
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "big": big, "step": step}
    s0 = time.perf_counter()
    if in_memory:
        ddprun.state.save(step, state, replicated=replicated)
        if a.mode == "persist" and step % a.every == a.every - 1:
            ddprun.state.persist(os.path.join(a.dir, f"persist.{rank}.state"))
    elif step % a.every == a.every - 1:
        torch.save(state, ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)
        saves += 1
    stall += time.perf_counter() - s0
    waited = ddprun.state.stats()["fence_waited_s"] if in_memory else 0.0
    print(f"STEP rank={rank} attempt={attempt} step={step} save={time.perf_counter() - s0:.5f} "
          f"fence={waited - fenced:.5f} time={step_times[-1]:.5f}", flush=True)
    fenced = waited

area, copy = 0, 0.0
if in_memory:
    ddprun.state.wait()
    s = ddprun.state.stats()
    stall, saves = s["stall_s"], s["saves"]
    copy = s["copy_s"] / max(1, saves)
    if os.environ.get("DDPRUN_STATE_FD"):
        area = os.fstat(int(os.environ["DDPRUN_STATE_FD"])).st_blocks * 512
steps_run = max(1, len(step_times))
print(f"RESULT rank={rank} attempt={attempt} resumed={start} stall={stall / steps_run:.5f} saves={saves} "
      f"step={sorted(step_times)[len(step_times) // 2] if step_times else 0:.4f} "
      f"rss={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024} area={area} copy={copy:.4f} load={load_s:.4f}", flush=True)
dist.destroy_process_group()
