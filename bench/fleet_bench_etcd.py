#!/usr/bin/python3
"""Issue 44's etcd fleet benchmark with real agents: K ddprun agents on loopback, each a separate
process (--rdzv_backend=etcd against a 3-member etcd cluster on loopback, started here as
bench/rdzv_bench.py starts it; --nnodes=K, one /bin/true worker each), --runs times for each K,
at the default settings unless --rdzv_conf is given (e.g. lease_ttl=1).

For each run: did all K agents exit 0 within --limit (met, ran, ended); the wall time; the etcd
members' CPU over the run (the 3 processes' utime+stime, summed); all agents' CPU per agent; how
many agents logged a lease that expired or was revoked ("etcd lease expired", "etcd lease is
gone") or a member that lost its lease ("lost its etcd lease"), and the first error line of a
run that failed. Then, per K, how many runs
met, and the medians.

  bench/fleet_bench_etcd.py [--ddprun build/launcher/ddprun] [--agents 64,256] [--runs 10]
                            [--rdzv_conf lease_ttl=1] [--limit 300] [--data_dir /dev/shm]

etcd runs with its own heartbeat and election timeout (100 ms, 1 s) unless told otherwise, its
data in a temporary directory under --data_dir (the system's temporary directory: a disk; a
tmpfs such as /dev/shm takes the disk's fsync out of what is measured).
"""
import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import rdzv_bench  # noqa: E402  (start_etcd)
import fleet_bench  # noqa: E402  (proc_cpu, reap)


def one_run(ddprun, endpoints, etcd_pids, k, run_id, conf, limit, logs):
    conf_arg = [f"--rdzv_conf={conf}"] if conf else []
    cpu0 = sum(fleet_bench.proc_cpu(p) for p in etcd_pids)
    t0 = time.monotonic()
    agents, files = [], []
    for i in range(k):
        f = open(os.path.join(logs, f"{run_id}.{i}.err"), "w")
        files.append(f)
        agents.append(subprocess.Popen(
            [ddprun, f"--nnodes={k}", "--rdzv_backend=etcd", f"--rdzv_endpoint={endpoints}", f"--rdzv_id={run_id}",
             "--nproc_per_node=1"] + conf_arg + ["--no_python", "/bin/true"],
            stdout=subprocess.DEVNULL, stderr=f))
    try:
        codes, cpus = fleet_bench.reap(agents, limit)
        met = not any(codes)
    except SystemExit:
        for a in agents:
            if a.poll() is None:
                a.kill()
        for a in agents:
            a.wait()
        codes, cpus, met = [a.returncode for a in agents], [0.0], False
    wall = time.monotonic() - t0
    cpu = sum(fleet_bench.proc_cpu(p) for p in etcd_pids) - cpu0
    for f in files:
        f.close()
    expired = lost = 0
    first_error = ""
    for i in range(k):
        with open(os.path.join(logs, f"{run_id}.{i}.err"), errors="replace") as f:
            text = f.read()
        expired += "etcd lease expired" in text or "etcd lease is gone" in text
        lost += "lost its etcd lease" in text
        if not first_error and codes[i] != 0:
            errs = [line for line in text.splitlines() if "error" in line.lower() or "fail" in line.lower()]
            first_error = (errs[-1] if errs else text.strip().splitlines()[-1:] or ["(nothing)"])[0] if text else "(nothing)"
    return met, wall, cpu, sum(cpus) / k, expired, lost, first_error[:300]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", default=os.path.join(ROOT, "build", "launcher", "ddprun"))
    ap.add_argument("--agents", default="64,256")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--rdzv_conf", default="", help="e.g. lease_ttl=1 (default: ddprun's defaults)")
    ap.add_argument("--limit", type=float, default=300, help="seconds a run may take before it counts as not met")
    ap.add_argument("--data_dir", default=None, help="where etcd keeps its data (default: the temporary directory)")
    ap.add_argument("--heartbeat_ms", type=int, default=100)
    ap.add_argument("--election_ms", type=int, default=1000)
    a = ap.parse_args()
    if not shutil.which("etcd"):
        raise SystemExit("etcd is not installed (scripts/setup.sh installs etcd-server)")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(f"etcd, 3 members on loopback (heartbeat {a.heartbeat_ms} ms, election {a.election_ms} ms, data under "
          f"{a.data_dir or tempfile.gettempdir()}); rdzv_conf '{a.rdzv_conf or '(defaults)'}'; load {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(dir=a.data_dir) as tmp:
        procs, endpoints = rdzv_bench.start_etcd(tmp, a.heartbeat_ms, a.election_ms)
        pids = [p.pid for p in procs]
        try:
            print("\n| K | run | met | wall s | etcd CPU s | agents' CPU per agent ms | agents whose lease expired | "
                  "lost-lease warnings | first error |\n|---|---|---|---|---|---|---|---|---|", flush=True)
            summary = []
            for k in [int(x) for x in a.agents.split(",")]:
                runs = []
                for i in range(a.runs):
                    r = one_run(a.ddprun, endpoints, pids, k, f"fleet-etcd-{k}-{i}-{os.getpid()}", a.rdzv_conf, a.limit, tmp)
                    runs.append(r)
                    print(f"| {k} | {i} | {'yes' if r[0] else 'NO'} | {r[1]:.2f} | {r[2]:.2f} | {1e3 * r[3]:.0f} | {r[4]} | "
                          f"{r[5]} | {r[6]} |", flush=True)
                met = [r for r in runs if r[0]]
                summary.append((k, len(met), len(runs), met))
            print("\n| K | met | wall s, median (min-max) | etcd CPU s, median (min-max) |\n|---|---|---|---|")
            for k, n, of, met in summary:
                def med(xs):
                    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})" if xs else "-"
                print(f"| {k} | {n} of {of} | {med([r[1] for r in met])} | {med([r[2] for r in met])} |")
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait()
    print(f"load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
