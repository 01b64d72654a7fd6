#!/usr/bin/python3
"""Multi-node benchmarks on loopback (every agent is a separate ddprun process on this machine):

  rendezvous   K agents (c10d, --nnodes=K, one /bin/true worker each): time from starting the
               K-1 non-host agents (the host is already listening) until every agent has exited
               0, i.e. rendezvous + the workers' run + the end-of-job handshake. K = 2, 16, 64,
               256; next to torchrun's c10d rendezvous (../shared/tools/torchrun_fixed.py) where
               it completes within its time limit.
  node loss    4 agents (c10d 2:4, keep_alive_interval=1, keep_alive_max_attempt=2); kill -9 of a
               non-host agent -> the last survivor's new worker has started (timestamps the
               workers print).

Usage: bench/multinode_bench.py [--ddprun build/launcher/ddprun] [--agents 2,16,64,256]
"""
import argparse
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCHRUN = os.path.join(os.path.dirname(ROOT), "shared", "tools", "torchrun_fixed.py")


def wait_for_port(proc):
    buf = ""
    while True:
        line = proc.stderr.readline()
        if not line:
            raise SystemExit(f"host agent ended early: {buf}")
        buf += line
        m = re.search(r"hosting the rendezvous store on port (\d+)", line)
        if m:
            return m.group(1)


def ddprun_rendezvous(ddprun, k):
    common = [f"--nnodes={k}", "--rdzv_backend=c10d", "--rdzv_id=bench", "--nproc_per_node=1",
              "--rdzv_conf=join_timeout=120", "--log_level", "info", "--no_python", "/bin/true"]
    host = subprocess.Popen([ddprun, "--rdzv_endpoint=127.0.0.1:0"] + common, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    port = wait_for_port(host)
    t0 = time.monotonic()
    others = [subprocess.Popen([ddprun, f"--rdzv_endpoint=127.0.0.1:{port}"] + common, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL) for _ in range(k - 1)]
    codes = [p.wait(timeout=300) for p in others]
    host.stderr.read()
    codes.append(host.wait(timeout=300))
    took = time.monotonic() - t0
    if any(codes):
        raise SystemExit(f"ddprun rendezvous of {k} agents failed: {codes}")
    return took


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_rendezvous(k, limit):
    port = free_port()
    cmd = [sys.executable, TORCHRUN, f"--nnodes={k}", "--nproc_per_node=1", "--rdzv_backend=c10d",
           f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=bench", "--no_python", "/bin/true"]
    t0 = time.monotonic()
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(k)]
    try:
        codes = [p.wait(timeout=max(1, limit - (time.monotonic() - t0))) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
            p.wait()
        return None
    took = time.monotonic() - t0
    return took if not any(codes) else None


def node_loss(ddprun):
    worker = 'echo "start $WORLD_SIZE $(date +%s.%N)"; exec sleep 1000'
    common = ["--nnodes=2:4", "--rdzv_backend=c10d", "--rdzv_id=loss", "--nproc_per_node=1", "--log_level", "info",
              "--rdzv_conf=keep_alive_interval=1,keep_alive_max_attempt=2,last_call_timeout=30,join_timeout=60",
              "--no_python", "/bin/sh", "-c", worker]
    host = subprocess.Popen([ddprun, "--rdzv_endpoint=127.0.0.1:0"] + common, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    port = wait_for_port(host)
    agents = [host] + [subprocess.Popen([ddprun, f"--rdzv_endpoint=127.0.0.1:{port}"] + common, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True) for _ in range(3)]
    for a in agents:  # every worker of the 4-node round has started
        line = a.stdout.readline()
        assert "start 4" in line, line
    victim = agents[3]
    t_kill = time.time()
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    restarted = []
    for a in agents[:3]:
        line = a.stdout.readline()
        m = re.search(r"start (\d+) (\d+\.\d+)", line)
        assert m and m.group(1) == "3", line
        restarted.append(float(m.group(2)))
    for a in agents[:3]:
        a.send_signal(signal.SIGTERM)
    for a in agents[:3]:
        a.wait(timeout=60)
    return max(restarted) - t_kill


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", default=os.path.join(ROOT, "build", "launcher", "ddprun"))
    ap.add_argument("--agents", default="2,16,64,256")
    ap.add_argument("--torchrun_limit", type=float, default=120, help="seconds before a torchrun point is given up")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print("Rendezvous of K agents on loopback (c10d, one /bin/true worker each): start -> every agent exited 0")
    print(f"{'K':>5} | {'ddprun s':>9} | {'torchrun s':>10} | {'speed-up':>8}")
    for k in [int(x) for x in args.agents.split(",")]:
        ours = statistics.median([ddprun_rendezvous(args.ddprun, k) for _ in range(3)])
        theirs = torchrun_rendezvous(k, args.torchrun_limit) if k <= 64 and os.path.exists(TORCHRUN) else None
        t = f"{theirs:10.2f}" if theirs else f"{'not run' if k > 64 else 'timeout':>10}"
        ratio = f"{theirs / ours:7.0f}x" if theirs else f"{'-':>8}"
        print(f"{k:>5} | {ours:>9.3f} | {t} | {ratio}", flush=True)
    losses = [node_loss(args.ddprun) for _ in range(3)]
    print(f"\nkill -9 of one of 4 agents (keep_alive_interval=1, max_attempt=2) -> survivors' new workers "
          f"running: {statistics.median(losses):.2f} s (median of 3; runs: {', '.join(f'{x:.2f}' for x in losses)})")


if __name__ == "__main__":
    main()
