#!/usr/bin/python3
"""A PyTorch gloo DDP training job that can hang, or pause without hanging, on purpose: the
worker of the hang tests (hang_torch_test.py) and of bench/hang_bench.py.

  --hang KIND --rank R --at STEP: at step STEP, rank R
     stuck     loops in Python, sleeping, outside any collective (a data loader that never returns)
     spin      loops in Python holding the GIL (busy, 100% CPU)
     sigstop   stops itself with SIGSTOP
     mismatch  calls a broadcast while the other ranks are in DDP's all-reduce
  --first_step S   the first step takes S seconds longer (compilation, a large load)
  --eval_at STEP --eval_s S   an evaluation loop (forward passes only, no optimizer step) of S s
                              (--eval_rank R: rank R's alone, the others wait in a barrier)
  --save_at STEP --save_s S   rank 0 saves a checkpoint with torch.save to a file that takes S s
                              to write (no forward, no step) while the others wait in a barrier
  --write_at STEP --write_s S --write_dir D
                              rank 0 writes a checkpoint of its own (plain file writes, as numpy
                              or safetensors do: no torch.save) to D for S s while the others wait
                              in a barrier
  --one_write_at STEP --one_write_mb N --write_dir D
                              rank 0 writes N MB to a file in D in one write() (to a slow file
                              system: a long uninterruptible wait) while the others wait in a barrier
  --log_mb_s X                 every rank's thread writes X MB/s to a log file in --write_dir (a
                              logger, not a save: it must not hide a hang)
  --slow_rank R --slow_s S    rank R is a straggler: busy S s in Python before each step
Prints "step N" on rank 0 after each step and "DONE rank=R" at the end.
"""
import argparse
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class SlowFile:
    """A file-like object torch.save writes to, as slow as a loaded network filesystem."""

    def __init__(self, seconds):
        self.seconds = seconds

    def write(self, data):
        if self.seconds:
            time.sleep(self.seconds)
            self.seconds = 0
        return len(data)

    def flush(self):
        pass


def say_hang(kind):
    print(f"HANG {kind} {time.time():.3f}", flush=True)


def load_batch(x, i, batch, hang, rank, at, step):
    if hang in ("stuck", "spin", "sigstop", "mismatch") and rank == at[0] and step == at[1]:
        say_hang(hang)
    if hang == "stuck" and rank == at[0] and step == at[1]:
        while True:
            time.sleep(0.1)
    if hang == "spin" and rank == at[0] and step == at[1]:
        n = 0
        while True:
            n += 1
    return x[i:i + batch]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--step_s", type=float, default=0.05)
    ap.add_argument("--hang", default="")
    ap.add_argument("--rank", type=int, default=1)
    ap.add_argument("--at", type=int, default=5)
    ap.add_argument("--first_step", type=float, default=0)
    ap.add_argument("--eval_at", type=int, default=-1)
    ap.add_argument("--eval_s", type=float, default=0)
    ap.add_argument("--eval_rank", type=int, default=-1)  # that rank alone evaluates; the others wait in a barrier
    ap.add_argument("--save_at", type=int, default=-1)
    ap.add_argument("--save_s", type=float, default=0)
    ap.add_argument("--write_at", type=int, default=-1)
    ap.add_argument("--write_s", type=float, default=0)
    ap.add_argument("--write_dir", default="")
    ap.add_argument("--one_write_at", type=int, default=-1)
    ap.add_argument("--one_write_mb", type=int, default=0)
    ap.add_argument("--log_mb_s", type=float, default=0)
    ap.add_argument("--slow_rank", type=int, default=-1)
    ap.add_argument("--slow_s", type=float, default=0)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    x, y = torch.randn(256, 16), torch.randn(256, 1)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if a.log_mb_s:
        import threading

        def log():
            line = b"x" * 1023 + b"\n"
            with open(os.path.join(a.write_dir, f"log.{rank}.{os.getpid()}"), "wb") as f:
                while True:
                    for _ in range(int(a.log_mb_s * 100)):
                        f.write(line)
                    f.flush()
                    time.sleep(0.1)

        threading.Thread(target=log, daemon=True).start()
    for step in range(a.steps):
        if step == 0 and a.first_step > 0:
            time.sleep(a.first_step)
        if step == a.save_at:
            if rank == 0:
                torch.save(model.state_dict(), SlowFile(a.save_s))
            dist.barrier()
        if step == a.eval_at:  # (at the save's step: right after it, as at an epoch's end)
            end = time.monotonic() + a.eval_s
            with torch.no_grad():
                while time.monotonic() < end and a.eval_rank in (-1, rank):
                    model(x)
                    time.sleep(0.05)
            if a.eval_rank >= 0:
                dist.barrier()
        if step == a.write_at:
            if rank == 0:
                path = os.path.join(a.write_dir, f"ckpt.{os.getpid()}.bin")
                end, chunk = time.monotonic() + a.write_s, bytes(4 << 20)
                with open(path, "wb") as f:  # 40 MB/s, a loaded network file system's pace
                    while time.monotonic() < end:
                        f.write(chunk)
                        time.sleep(0.1)
                os.unlink(path)
            dist.barrier()
        if step == a.one_write_at:
            if rank == 0:
                fd = os.open(os.path.join(a.write_dir, f"one.{os.getpid()}"), os.O_WRONLY | os.O_CREAT, 0o600)
                print(f"HANG one_write {time.time():.3f}", flush=True)
                os.write(fd, bytes(a.one_write_mb << 20))
                os.close(fd)
                print("one write done", flush=True)
            dist.barrier()
        i = (step * 16) % 240
        batch = load_batch(x, i, 16, a.hang, rank, (a.rank, a.at), step)
        if a.hang == "sigstop" and rank == a.rank and step == a.at:
            os.kill(os.getpid(), signal.SIGSTOP)
        if a.hang == "mismatch" and rank == a.rank and step == a.at:
            dist.broadcast(torch.zeros(3), src=0)
        if rank == a.slow_rank:  # a straggler: busy in Python before each step
            end = time.monotonic() + a.slow_s
            while time.monotonic() < end:
                pass
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(batch), y[i:i + 16]).backward()
        opt.step()
        time.sleep(a.step_s)
        if rank == 0:
            print(f"step {step}", flush=True)
    dist.barrier()
    print(f"DONE rank={rank}", flush=True)


if __name__ == "__main__":
    main()
