#!/usr/bin/python3
"""Counts the rendezvous store's requests per node for one round (docs/rounds-protocol.md, "Cost
per round"): K agents (c10d, --nnodes=K, one worker each, every agent is_host=0) meet in an
external `ddprun-store --count_requests` on loopback and run one round to success; the store's
tally, by operation and key, is divided by K.

  bench/count_store_requests.py [--build build] [--agents 4,16,64] [--worker_s 0]
                                [--keep_alive_interval 5] [--raw] [--check]

--worker_s S runs `sleep S` as the worker (the keep-alive ring then runs S seconds). --raw also
prints the store's own table. --check exits 1 unless each node made exactly one arrival, the
round's records were read with 3 requests in all (the last arrival's WAIT naming K keys and its
MULTI_GET of them, group rank 0's MULTI_GET; 2 when K = 1), and each node made 27 + 8/K requests.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(a, k, worker_s, interval, raw):
    store = subprocess.Popen([a.store, "--port", "0", "--count_requests",
                              "--log_level", "warn"], stdout=subprocess.PIPE, text=True)
    m = re.match(r"listening on (\S+):(\d+)", store.stdout.readline())
    if not m:
        raise SystemExit("ddprun-store did not say where it listens")
    port = m.group(2)
    worker = ["/bin/true"] if worker_s <= 0 else ["/bin/sleep", str(worker_s)]
    cmd = [a.ddprun, f"--nnodes={k}", "--rdzv_backend=c10d",
           f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=count", "--nproc_per_node=1",
           f"--rdzv_conf=is_host=0,join_timeout=300,keep_alive_interval={interval}",
           "--log_level", "warn", "--no_python"] + worker
    agents = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(k)]
    codes = [p.wait(timeout=600) for p in agents]
    store.send_signal(signal.SIGTERM)
    out, _ = store.communicate(timeout=60)
    if any(codes):
        raise SystemExit(f"K={k}: agents exited {codes}")
    if raw:
        print(out)
    rows = []
    woken = 0
    for line in out.splitlines():
        f = line.split()
        if f and f[0] == "waits_woken":
            woken = int(f[1])
        elif len(f) == 5 and f[0] not in ("op", "total"):
            rows.append((f[0], f[1], int(f[2]), int(f[3]), int(f[4])))
        elif len(f) == 4 and f[0] not in ("op", "total"):  # a request without a key (PING)
            rows.append((f[0], "", int(f[1]), int(f[2]), int(f[3])))
    return rows, woken


def key_name(key):
    # "/ddprun/rdzv/count/r<n>/node/<n>" -> "r<R>/node/<n>"
    key = re.sub(r"^/?ddprun/rdzv/count/", "", key)
    return key.replace("r<n>/", "r<R>/")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--agents", default="4,16,64")
    ap.add_argument("--worker_s", type=float, default=0)
    ap.add_argument("--keep_alive_interval", type=float, default=5)
    ap.add_argument("--raw", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--ddprun", help="default: BUILD/launcher/ddprun")
    ap.add_argument("--store", help="default: BUILD/rendezvous/ddprun-store")
    a = ap.parse_args()
    a.ddprun = a.ddprun or os.path.join(a.build, "launcher", "ddprun")
    a.store = a.store or os.path.join(a.build, "rendezvous", "ddprun-store")
    ks = [int(x) for x in a.agents.split(",")]
    table = defaultdict(dict)  # (op, key) -> k -> (requests, bytes in, bytes out) per node
    totals = {}
    for k in ks:
        rows, woken = run(a, k, a.worker_s, a.keep_alive_interval, a.raw)
        r = bi = bo = 0
        for op, key, count, bin_, bout in rows:
            table[(op, key_name(key))][k] = (count / k, bin_ / k, bout / k)
            r += count
            bi += bin_
            bo += bout
        totals[k] = (r / k, bi / k, bo / k, woken / k)
        print(f"K={k}: {r} requests, {bi} B in, {bo} B out, {woken} waits woken", file=sys.stderr)
    head = "| op | key | " + " | ".join(f"K={k} requests (B in/out)" for k in ks) + " |"
    print(head)
    print("|" + "---|" * (2 + len(ks)))
    for (op, key), by_k in sorted(table.items(), key=lambda x: (x[0][1], x[0][0])):
        cells = []
        for k in ks:
            if k in by_k:
                c, i, o = by_k[k]
                cells.append(f"{c:.2f} ({i:.0f}/{o:.0f})")
            else:
                cells.append("-")
        print(f"| {op} | `{key}` | " + " | ".join(cells) + " |")
    print("| all | | " + " | ".join(f"{totals[k][0]:.2f} ({totals[k][1]:.0f}/{totals[k][2]:.0f})" for k in ks) + " |")
    print("| waits woken | | " + " | ".join(f"{totals[k][3]:.2f}" for k in ks) + " |")
    if a.check:
        bad = []
        for k in ks:
            arrivals = table[("ADD", "r<R>/join")].get(k, (0, 0, 0))[0]
            reads = round(k * sum(table[(op, "r<R>/node/<n>")].get(k, (0, 0, 0))[0]
                                  for op in ("WAIT", "CHECK", "GET", "MULTI_GET")))
            want = 3 if k > 1 else 2
            per_node = totals[k][0]
            if arrivals != 1 or reads != want or abs(per_node - (27 + 8 / k)) > 1e-6:
                bad.append(f"K={k}: {arrivals} arrivals, {reads} record reads in all, {per_node:.2f} requests per node "
                           f"(want 1, {want}, {27 + 8 / k:.2f})")
        if bad:
            raise SystemExit("; ".join(bad))


if __name__ == "__main__":
    main()
