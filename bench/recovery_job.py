#!/usr/bin/python3
"""The job bench/recovery_bench.py and tests/python/warm_spare_torch_test.py restart: PyTorch DDP
over gloo, a checkpoint after every step, rank --crash_rank dying at step --crash_step of the
first attempt, resumed from the checkpoint. The data of step s comes from seed s, so a resumed
run ends with the same parameters as an uninterrupted one (RESULT ... checksum=C).

--times DIR: the crashing rank writes DIR/crash (time.time() just before it dies); every rank
writes DIR/first.ATTEMPT.RANK at the end of its first step of each attempt.
--go FILE: the crashing rank waits for FILE before it dies (the bench creates it once the warm
spares are ready, so that every launcher is timed from the same state).
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_no_libuv  # with USE_LIBUV=0 only: for a PyTorch 2.x built without libuv


def note(path, value):
    with open(path + ".tmp", "w") as f:
        f.write(repr(value))
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--crash_step", type=int, default=10)
    ap.add_argument("--crash_rank", type=int, default=1)
    ap.add_argument("--step_sleep", type=float, default=0.0)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--times", default="")
    ap.add_argument("--go", default="")
    args = ap.parse_args()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch_no_libuv.apply()
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = 0
    ckpt = os.path.join(args.ckpt, "ckpt.pt")
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1
    ddp = DDP(model)
    for step in range(start, args.steps):
        if attempt == 0 and rank == args.crash_rank and step == args.crash_step:
            while args.go and not os.path.exists(args.go):
                time.sleep(0.01)
            if args.times:
                note(os.path.join(args.times, "crash"), time.time())
            os._exit(1)
        g = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(32, 16, generator=g)
        y = x.sum(dim=1, keepdim=True).tanh()
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        if step == start and args.times:
            note(os.path.join(args.times, f"first.{attempt}.{rank}"), time.time())
        if rank == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    sys.stdout.write(f"RESULT rank={rank} world={world} attempt={attempt} checksum={checksum:.6f}\n")
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
