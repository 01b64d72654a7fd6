#!/usr/bin/python3
"""Issue 44's fleet benchmark with real agents: K ddprun agents on loopback, each a separate
process (c10d, --nnodes=K, one worker each). The lightweight-node half (thousands of nodes
in one process, against a real ddprun-store) is bench/fleet_bench.cpp.

  round    K agents, one /bin/true worker each: wall from starting the K-1 non-host agents (the
           host agent already listens) until every agent has exited 0 (meet, run, end); the host
           agent's CPU over that time (it serves the rendezvous store: the serial part a real
           cluster cannot spread), from /proc/PID/stat at the start to its rusage at exit; all
           agents' CPU per agent. Then a least-squares fit of the host's CPU against K and the
           ratio CPU(4K)/CPU(K). The floor: the same K agents started at once, each a one-node
           job of its own (standalone, --master_port=0): on one machine their own lives share
           its cores, and the ratio is what the meeting adds.
  crash    K agents (--max_restarts=1), each worker prints its pid and the time (`date`) and
           sleeps; kill -9 of one worker (not its agent) -> the K new workers: the last one
           started (its process made: /proc/PID/stat's start time, in 10 ms ticks of
           CLOCK_BOOTTIME), and the last one's time printed. On one machine the K workers' own
           starts (a shell, then `date`) share its cores too: the floor is the same K workers
           started at once by one process, without ddprun, to the last one's time printed.
  torchrun torchrun's c10d rendezvous (--torchrun_py: ../shared/tools/torchrun_fixed.py, run with
           this script's python) at --torchrun K, one run each.

  bench/fleet_bench.py [--ddprun build/launcher/ddprun] [--agents 64,256,1024] [--crash 256]
                       [--torchrun 64] [--repeat 3]

The open-file limit is raised to the hard limit (the host agent holds 3 connections per agent).
"""
import argparse
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import multinode_bench  # noqa: E402  (wait_for_port, torchrun_rendezvous)

TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def drain(stream):
    threading.Thread(target=lambda: [None for _ in stream], daemon=True).start()


def reap(procs, timeout):
    """Waits for every process; returns (exit codes, CPU seconds of each from its rusage)."""
    deadline = time.monotonic() + timeout
    codes, cpus = [], []
    for p in procs:
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                # None left behind: each agent's guardian then ends its workers.
                for q in procs:
                    if q.poll() is None:
                        q.kill()
                for q in procs:
                    q.wait()
                raise SystemExit(f"agents did not end within {timeout:.0f} s (killed)")
            time.sleep(0.01)
        p.returncode = os.waitstatus_to_exitcode(status)
        codes.append(p.returncode)
        cpus.append(ru.ru_utime + ru.ru_stime)
    return codes, cpus


def agents_round(ddprun, k, extra=()):
    common = [f"--nnodes={k}", "--rdzv_backend=c10d", "--rdzv_id=fleet", "--nproc_per_node=1",
              "--rdzv_conf=join_timeout=300", "--log_level", "info", "--no_python", *extra, "/bin/true"]
    host = subprocess.Popen([ddprun, "--rdzv_endpoint=127.0.0.1:0"] + common, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    port = multinode_bench.wait_for_port(host)
    drain(host.stderr)
    cpu0 = proc_cpu(host.pid)
    t0 = time.monotonic()
    others = [subprocess.Popen([ddprun, f"--rdzv_endpoint=127.0.0.1:{port}"] + common, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL) for _ in range(k - 1)]
    codes, cpus = reap([host] + others, 600)
    wall = time.monotonic() - t0
    if any(codes):
        raise SystemExit(f"ddprun: {k} agents: exit codes {sorted(set(codes))}")
    return wall, cpus[0] - cpu0, sum(cpus) / k


def agents_alone(ddprun, k, extra=()):
    """The floor of agents_round: the same K agents started at once, each a one-node job of its
    own (standalone, its workers' store on a free port): their own costs, without the meeting."""
    common = ["--master_port=0", "--nproc_per_node=1", "--log_level", "info", "--no_python", *extra, "/bin/true"]
    t0 = time.monotonic()
    procs = [subprocess.Popen([ddprun] + common, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(k)]
    codes, _ = reap(procs, 600)
    if any(codes):
        raise SystemExit(f"ddprun: {k} agents alone: exit codes {sorted(set(codes))}")
    return time.monotonic() - t0


# The crash case's worker: its pid and the time, then a sleep.
CRASH_WORKER = 'echo "start $$ $(date +%s.%N)"; exec sleep 1000'


def worker_start(stream):
    """(pid, time) from a crash worker's first line on `stream`."""
    line = stream.readline()
    m = re.search(r"start (\d+) (\d+\.\d+)", line)
    if not m:
        raise SystemExit(f"crash: a worker printed {line!r}")
    return int(m.group(1)), float(m.group(2))


def crash_restart(ddprun, k, extra=()):
    common = [f"--nnodes={k}", "--rdzv_backend=c10d", "--rdzv_id=crash", "--nproc_per_node=1", "--max_restarts=1",
              "--rdzv_conf=join_timeout=300", "--log_level", "info", "--no_python", *extra,
              "/bin/sh", "-c", CRASH_WORKER]
    host = subprocess.Popen([ddprun, "--rdzv_endpoint=127.0.0.1:0"] + common, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    port = multinode_bench.wait_for_port(host)
    drain(host.stderr)
    agents = [host] + [subprocess.Popen([ddprun, f"--rdzv_endpoint=127.0.0.1:{port}"] + common,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                       for _ in range(k - 1)]

    first = [worker_start(a.stdout) for a in agents]  # every worker of round 0 runs
    time.sleep(0.5)
    victim = first[k // 2][0]
    t_kill, t_kill_boot = time.time(), time.clock_gettime(time.CLOCK_BOOTTIME)
    os.kill(victim, signal.SIGKILL)
    again = [worker_start(a.stdout) for a in agents]
    made = max(started_at(pid) for pid, _ in again) - t_kill_boot
    printed = max(t for _, t in again) - t_kill
    for a in agents:
        a.send_signal(signal.SIGTERM)
    reap(agents, 120)
    return made, printed


def started_at(pid):
    """A process's start on CLOCK_BOOTTIME, to a clock tick (/proc/PID/stat's starttime)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19]) / TICK


def workers_floor(k):
    """The crash case's K workers started at once by one process, without ddprun: start -> the
    last one's time printed."""
    t0 = time.time()
    procs = [subprocess.Popen(["/bin/sh", "-c", CRASH_WORKER], stdout=subprocess.PIPE, text=True) for _ in range(k)]
    last = max(worker_start(p.stdout)[1] for p in procs)
    for p in procs:
        p.kill()
        p.wait()
    return last - t0


def fit(points):
    n = len(points)
    sx = sum(x for x, _ in points)
    sy = sum(y for _, y in points)
    sxx = sum(x * x for x, _ in points)
    sxy = sum(x * y for x, y in points)
    a = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    return a, (sy - a * sx) / n


def med(xs):
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", default=os.path.join(ROOT, "build", "launcher", "ddprun"))
    ap.add_argument("--agents", default="64,256,1024")
    ap.add_argument("--crash", type=int, default=256, help="agents in the crash case (0: none)")
    ap.add_argument("--torchrun", default="64", help="K for torchrun's c10d ('' for none)")
    ap.add_argument("--torchrun_limit", type=float, default=300)
    ap.add_argument("--torchrun_py", default=multinode_bench.TORCHRUN if os.path.exists(multinode_bench.TORCHRUN)
                    else "/work/shared/tools/torchrun_fixed.py", help="torchrun with the c10d fixes")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--agent_args", default="", help="more flags for every agent (say --agent_args=--no_state)")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(f"open files limit raised to {hard} (was {soft}); processes limit "
          f"{resource.getrlimit(resource.RLIMIT_NPROC)[0]}; load {os.getloadavg()[0]:.2f}")
    print("\nK agents on loopback (c10d, one /bin/true worker each): start -> every agent exited 0; "
          f"median of {a.repeat} (min-max)\n")
    print("The floor: the same K agents at once, each a one-node job of its own (no meeting).\n")
    print("| K | wall s | host agent's CPU s | all agents' CPU per agent ms | floor: each alone, wall s | ratio |")
    print("|---|---|---|---|---|---|")
    host_cpu = {}
    for k in [int(x) for x in a.agents.split(",") if x]:
        runs, floor = [], []
        for _ in range(a.repeat):
            runs.append(agents_round(a.ddprun, k, a.agent_args.split()))
            floor.append(agents_alone(a.ddprun, k, a.agent_args.split()))
        host_cpu[k] = statistics.median(r[1] for r in runs)
        wall = statistics.median(r[0] for r in runs)
        print(f"| {k} | {med([r[0] for r in runs])} | {med([r[1] for r in runs])} | "
              f"{med([1e3 * r[2] for r in runs])} | {med(floor)} | {wall / statistics.median(floor):.2f} |", flush=True)
    if len(host_cpu) >= 2:
        slope, c = fit(sorted(host_cpu.items()))
        print(f"\nhost agent's CPU per round (least squares over medians): {slope * 1e3:.3f} ms x K + {c * 1e3:.0f} ms")
        ks = sorted(host_cpu)
        for lo, hi in zip(ks, ks[1:]):
            print(f"CPU(K={hi}) / CPU(K={lo}) = {host_cpu[hi] / host_cpu[lo]:.2f} (nodes x {hi / lo:.0f})")
    if a.crash:
        runs, floor = [], []
        for _ in range(a.repeat):
            runs.append(crash_restart(a.ddprun, a.crash, a.agent_args.split()))
            floor.append(workers_floor(a.crash))
        printed = statistics.median(r[1] for r in runs)
        print(f"\nkill -9 of one worker of {a.crash} nodes (--max_restarts=1) -> every node's new worker: "
              f"started {med([r[0] for r in runs])} s, its time printed {med([r[1] for r in runs])} s; "
              f"the floor (the {a.crash} workers started at once, no ddprun) {med(floor)} s; "
              f"ratio {printed / statistics.median(floor):.2f}", flush=True)
    for k in [int(x) for x in a.torchrun.split(",") if x]:
        if not os.path.exists(a.torchrun_py):
            print(f"torchrun: {a.torchrun_py} not found")
            break
        multinode_bench.TORCHRUN = a.torchrun_py
        took = multinode_bench.torchrun_rendezvous(k, a.torchrun_limit)
        print(f"torchrun c10d, {k} agents, /bin/true: " +
              (f"{took:.2f} s" if took else f"did not complete within {a.torchrun_limit:.0f} s"), flush=True)
    print(f"load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
