#!/usr/bin/python3
"""The workers' store at scale, with PyTorch's own clients: N TCPStore clients (threads of one
process, as init_process_group makes them: connect, VALIDATE and PING on 2.x) ADD a counter, the
one that reaches N SETs a key, all WAIT for it. The time from the first client's start to the last
release, against ddprun-store and against PyTorch's own server (torch_store_server.py: libuv where
the build has it), in turns, one line each and the ratio.

  bench/torch_barrier.py [--clients 1000,4096,16384] [--store build/rendezvous/ddprun-store]
                         [--chroot /var/tmp/trixie]   # PyTorch 2.6 (../shared/tools/torch2-chroot.sh)

The clients and each server are separate processes: each holds one descriptor per client, and
RLIMIT_NOFILE's hard limit (20,000 on the 2-core machine, which cannot raise it) bounds both.
"""
import argparse
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CLIENTS = r'''
import datetime, sys, threading, time
import torch, torch.distributed as dist
port, n = int(sys.argv[1]), int(sys.argv[2])
threading.stack_size(256 * 1024)
kw = dict(is_master=False, timeout=datetime.timedelta(seconds=600))
def connect():
    try:
        return dist.TCPStore("127.0.0.1", port, use_libuv=False, **kw)
    except TypeError:  # 1.13: no use_libuv
        return dist.TCPStore("127.0.0.1", port, **kw)
errors, held = [], []
def client():
    try:
        s = connect()
        if s.add("count", 1) == n:
            s.set("go", "1")
        s.wait(["go"])
        held.append(s)
    except Exception as e:
        errors.append(repr(e))
t0 = time.monotonic()
ts = [threading.Thread(target=client) for _ in range(n)]
for t in ts:
    t.start()
for t in ts:
    t.join()
took = time.monotonic() - t0
print(f"took {took:.3f}" if not errors else f"failed {len(errors)}/{n}: {errors[0][:200]}", flush=True)
'''


def python_cmd(chroot, binds):
    if not chroot:
        return ["/usr/bin/python3"]
    cmd = [os.path.join(HERE, "in_chroot.sh"), chroot]
    for b in binds:
        cmd += ["--bind", b]
    return cmd + ["--", "/usr/bin/python3"]


def start(cmd):
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    m = re.search(r"127\.0\.0\.1:(\d+)", line)
    if not m:
        p.kill()
        raise SystemExit(f"torch_barrier: {cmd[0]} printed no port: {line!r}")
    return p, int(m.group(1)), line.strip()


def stop(p):
    p.stdin.close()
    p.terminate()
    p.wait(timeout=30)


def barrier(py, port, n, limit):
    try:
        out = subprocess.run(py + ["-c", CLIENTS, str(port), str(n)], capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return None, f"over {limit:.0f} s"
    m = re.search(r"took ([0-9.]+)", out.stdout)
    return (float(m.group(1)), "") if m else (None, (out.stdout + out.stderr).strip().splitlines()[-1][:120])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", default="1000,4096,16384")
    ap.add_argument("--store", default=os.path.join(ROOT, "build", "rendezvous", "ddprun-store"))
    ap.add_argument("--chroot", default="")
    ap.add_argument("--limit", type=float, default=300, help="seconds before a barrier is given up")
    a = ap.parse_args()
    py = python_cmd(a.chroot, [HERE])
    for n in (int(x) for x in a.clients.split(",")):
        ours, port, _ = start([a.store, "--host", "127.0.0.1", "--port", "0", "--log_level", "warn",
                               "--max_connections", str(max(65536, n + 1024))])
        x, why_x = barrier(py, port, n, a.limit)
        stop(ours)
        theirs, port, banner = start(py + [os.path.join(HERE, "torch_store_server.py")])
        y, why_y = barrier(py, port, n, a.limit)
        stop(theirs)
        ratio = f"{y / x:.1f}x" if x and y else "-"
        print(f"{n:>6} clients | ddprun-store {x if x else why_x} s | {banner.split('(')[-1].rstrip(')')}: "
              f"{y if y else why_y} s | {ratio}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
