#!/usr/bin/python3
"""A small but real data-parallel training job on CPU: PyTorch DDP over gloo, rendezvous through
env:// (MASTER_ADDR/PORT, RANK, WORLD_SIZE), i.e. through whatever store the launcher provides.

Each rank trains a 2-layer MLP on its shard of a fixed synthetic regression set; DDP averages the
gradients, so every rank ends with the same parameters. Prints per-epoch loss on rank 0 and a
final line per rank: RESULT rank=R world=W loss=L checksum=C.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=64, help="per-rank batch size")
    args = ap.parse_args()

    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # same data and same initial model on every rank
    x = torch.randn(args.samples, 32)
    w_true = torch.randn(32, 1)
    y = torch.tanh(x @ w_true) + 0.01 * torch.randn(args.samples, 1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    shard = torch.arange(rank, args.samples, world)
    loss = torch.tensor(0.0)
    for epoch in range(args.epochs):
        g = torch.Generator().manual_seed(epoch)
        order = shard[torch.randperm(len(shard), generator=g)]
        for i in range(0, len(order), args.batch):
            idx = order[i:i + args.batch]
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x[idx]), y[idx])
            loss.backward()
            opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        if rank == 0:
            print(f"epoch {epoch} loss {mean.item() / world:.5f}", flush=True)
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    # One write per line: under a launcher that does not keep lines whole (torchrun), print()'s
    # separate write of "\n" lets another rank's output land in the middle.
    sys.stdout.write(f"RESULT rank={rank} world={world} loss={loss.item():.6f} checksum={checksum:.6f}\n")
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
