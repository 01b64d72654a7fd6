"""A PyTorch gloo DDP worker for the etcd chaos tests: trains a fixed linear regression until the
file named by CHAOS_STOP exists on some rank (a flag all-reduced every step, so that every rank
stops after the same step). Prints "step N t=<wall time> host=<h> world=<W>" per step and, at
the end, "done steps=N checksum=<sum> world=<W> host=<h>": equal lines on every rank mean they
trained in lockstep to the end. CHAOS_PAUSE: seconds between steps (0.05)."""
import os
import socket
import time

import torch
import torch.distributed as dist

STOP = os.environ["CHAOS_STOP"]
PAUSE = float(os.environ.get("CHAOS_PAUSE", "0.05"))

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
ddp = torch.nn.parallel.DistributedDataParallel(model)
g = torch.Generator().manual_seed(1)
x = torch.randn(60, 8, generator=g)
y = x.sum(1, keepdim=True) * 0.5
x, y = x[rank::world], y[rank::world]
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
host = socket.gethostname()
step = 0
while True:
    stop = torch.tensor([1.0 if os.path.exists(STOP) else 0.0])
    dist.all_reduce(stop, op=dist.ReduceOp.MAX)
    if stop.item() > 0:
        break
    opt.zero_grad()
    ((ddp(x) - y) ** 2).mean().backward()
    opt.step()
    print("step %d t=%.3f host=%s world=%d" % (step, time.time(), host, world), flush=True)
    step += 1
    time.sleep(PAUSE)
w = torch.cat([p.detach().flatten() for p in model.parameters()])
print("done steps=%d checksum=%.6f world=%d host=%s" % (step, w.sum().item(), world, host), flush=True)
dist.destroy_process_group()
