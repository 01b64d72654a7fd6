"""A PyTorch gloo DDP worker for the multi-host tests: a fixed linear regression, each rank on
its shard of one fixed dataset (equal shards, so the averaged gradient is the full batch's and
the result does not depend on the world size). Prints a line per step (wall time, host, world)
and the parameters' checksum at the end; rank 0 then computes the same training alone, without
torch.distributed, in the interpreter it has (no second PyTorch import), and prints its checksum
and step count as the reference.

Environment: DDP_STEPS (40), DDP_PAUSE seconds between steps (0.05)."""
import os
import socket
import time

import torch

STEPS = int(os.environ.get("DDP_STEPS", "40"))
PAUSE = float(os.environ.get("DDP_PAUSE", "0.05"))


def data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=g)
    return x, x.sum(1, keepdim=True) * 0.5


def checksum(model):
    w = torch.cat([p.detach().flatten() for p in model.parameters()])
    return w.sum().item(), w.abs().sum().item()


def train(model, step_fn, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        opt.zero_grad()
        step_fn().backward()
        opt.step()
        yield step


def distributed():
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    x, y = data()
    x, y = x[rank::world], y[rank::world]
    host = socket.gethostname()
    for step in train(ddp, lambda: ((ddp(x) - y) ** 2).mean(), STEPS):
        print("step %d t=%.3f host=%s world=%d rank=%d" % (step, time.time(), host, world, rank), flush=True)
        time.sleep(PAUSE)
    print("checksum %.6f %.6f world=%d host=%s" % (*checksum(model), world, host), flush=True)
    dist.destroy_process_group()
    if rank == 0:  # one process's training of the same steps, in this interpreter (torch is imported)
        reference()


def reference():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    x, y = data()
    for _ in train(model, lambda: ((model(x) - y) ** 2).mean(), STEPS):
        pass
    print("reference %.6f %.6f steps=%d" % (*checksum(model), STEPS), flush=True)


if __name__ == "__main__":
    distributed()
