#!/usr/bin/python3
"""PyTorch 1.13's side of bench/runtime_bench.py, run under ddprun (gloo, env://):
  busbw     dist.all_reduce (float32 sum) from 4 KiB to 256 MiB, same iterations as runtime_bench
  ddp       backward time of ResNet-50's parameter shapes with DDP minus without (DDP's overhead)
Rank 0 prints one JSON object per measurement."""
import json
import statistics
import sys
import time

import torch
import torch.distributed as dist


def busbw():
    n = dist.get_world_size()
    size = 4096
    while size <= 256 << 20:
        buf = torch.ones(size // 4, dtype=torch.float32)
        iters = 50 if size <= 1 << 20 else 10 if size <= 16 << 20 else 3
        dist.all_reduce(buf)
        times = []
        for _ in range(iters):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            times.append(time.perf_counter() - t0)
        t = torch.tensor([statistics.median(times)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        t = t.item()
        if dist.get_rank() == 0:
            print(json.dumps({"kind": "busbw", "impl": "torch", "ranks": n, "bytes": size, "seconds": t,
                              "busbw_gbps": size / t / 1e9 * 2 * (n - 1) / n}), flush=True)
        size *= 4


def resnet50_shapes():
    s = []
    conv = lambda o, i, k: s.append((o, i, k, k))  # noqa: E731
    bn = lambda c: s.extend([(c,), (c,)])  # noqa: E731
    conv(64, 3, 7)
    bn(64)
    inp = 64
    for blocks, width in ((3, 64), (4, 128), (6, 256), (3, 512)):
        out = width * 4
        for b in range(blocks):
            conv(width, inp, 1); bn(width)
            conv(width, width, 3); bn(width)
            conv(out, width, 1); bn(out)
            if b == 0:
                conv(out, inp, 1); bn(out)
            inp = out
    s.append((1000, 2048))
    s.append((1000,))
    return s


class Shapes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.ones(sh)) for sh in resnet50_shapes()])

    def forward(self, x):
        return sum((p * x).sum() for p in self.ps)


def ddp():
    from torch.nn.parallel import DistributedDataParallel as DDP
    local = Shapes()
    model = DDP(Shapes())
    x = torch.tensor(0.5)

    def timed(m):
        times = []
        for _ in range(6):
            m.zero_grad(set_to_none=False)
            loss = m(x)
            dist.barrier()
            t0 = time.perf_counter()
            loss.backward()
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])

    t_local = timed(local)
    t_ddp = timed(model)
    if dist.get_rank() == 0:
        params = sum(p.numel() for p in local.parameters())
        print(json.dumps({"kind": "ddp", "ranks": dist.get_world_size(), "tensors": len(resnet50_shapes()),
                          "params": params, "backward_local_s": t_local, "backward_ddp_s": t_ddp,
                          "ddp_overhead_s": t_ddp - t_local}), flush=True)


if __name__ == "__main__":
    dist.init_process_group("gloo", init_method="env://")
    {"busbw": busbw, "ddp": ddp}[sys.argv[1]]()
    dist.destroy_process_group()
