#!/usr/bin/env python3
"""Rendezvous through etcd vs through ddprun's c10d store, side by side in one run.

For N agents (2, 16, 64 by default): the time from starting them to every agent's "rendezvous
round 0 complete"; then, with 3 agents running workers, the time from a kill -9 of one agent
(not the c10d host) to the survivors' "rendezvous round 1 complete". Same loss-detection window
for both: c10d keep-alives every 0.5 s, 2 missed; etcd lease TTL 1 s. etcd: a 3-member cluster
on loopback. Usage: bench/rdzv_bench.py --ddprun build/launcher/ddprun [--agents 2,16,64]"""
import argparse, os, re, shutil, signal, socket, subprocess, sys, tempfile, time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_etcd(tmp, heartbeat_ms=50, election_ms=500):
    clients, peers = [free_port() for _ in range(3)], [free_port() for _ in range(3)]
    initial = ",".join(f"m{i}=http://127.0.0.1:{peers[i]}" for i in range(3))
    procs = []
    for i in range(3):
        procs.append(subprocess.Popen(
            ["etcd", "--name", f"m{i}", "--data-dir", os.path.join(tmp, f"m{i}"),
             "--listen-client-urls", f"http://127.0.0.1:{clients[i]}", "--advertise-client-urls", f"http://127.0.0.1:{clients[i]}",
             "--listen-peer-urls", f"http://127.0.0.1:{peers[i]}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peers[i]}",
             "--initial-cluster", initial, "--heartbeat-interval", str(heartbeat_ms), "--election-timeout", str(election_ms), "--log-level", "error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    endpoints = ",".join(f"127.0.0.1:{p}" for p in clients)
    for _ in range(100):
        if subprocess.run(["etcdctl", f"--endpoints={endpoints}", "put", "bench/ready", "1"],
                          capture_output=True).returncode == 0:
            return procs, endpoints
        time.sleep(0.1)
    raise SystemExit("etcd did not start")


class Agent:
    def __init__(self, argv):
        self.p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        os.set_blocking(self.p.stderr.fileno(), False)
        self.err = ""

    def poll(self):
        try:
            chunk = self.p.stderr.read()
        except (TypeError, OSError):
            chunk = None
        if chunk:
            self.err += chunk
        return self.err


def wait_all(agents, text, limit=120):
    deadline = time.time() + limit
    while time.time() < deadline:
        if all(text in a.poll() for a in agents):
            return time.time()
        time.sleep(0.005)
    raise SystemExit(f"timed out waiting for '{text}': " + agents[0].poll()[-500:])


def finish(agents):
    for a in agents:
        if a.p.poll() is None:
            a.p.send_signal(signal.SIGKILL)
        a.p.wait()


def backend_args(kind, endpoint, run_id, nnodes):
    if kind == "etcd":
        return ["--rdzv_backend=etcd", f"--rdzv_endpoint={endpoint}", f"--rdzv_id={run_id}",
                "--rdzv_conf=lease_ttl=1,last_call_timeout=1,join_timeout=120", f"--nnodes={nnodes}"]
    return ["--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint}", f"--rdzv_id={run_id}", f"--nnodes={nnodes}",
            "--rdzv_conf=keep_alive_interval=0.5,keep_alive_max_attempt=2,last_call_timeout=1,join_timeout=120"]


def start_agents(ddprun, kind, etcd_endpoints, run_id, n, nnodes, program):
    agents = []
    if kind == "etcd":
        endpoint = etcd_endpoints
    else:
        host = Agent([ddprun] + backend_args(kind, "127.0.0.1:0", run_id, nnodes) + program)
        port = None
        while port is None:
            m = re.search(r"hosting the rendezvous store on port (\d+)", host.poll())
            port = m.group(1) if m else None
            time.sleep(0.002)
        agents.append(host)
        endpoint = f"127.0.0.1:{port}"
    while len(agents) < n:
        agents.append(Agent([ddprun] + backend_args(kind, endpoint, run_id, nnodes) + program))
    return agents


def rendezvous_time(ddprun, kind, etcd, n, i):
    t0 = time.time()
    agents = start_agents(ddprun, kind, etcd, f"rdzv-{kind}-{n}-{i}", n, str(n), ["--no_python", "/bin/true"])
    t = wait_all(agents, "rendezvous round 0 complete") - t0
    for a in agents:
        a.p.wait(timeout=120)
    return t


def node_loss_time(ddprun, kind, etcd, i):
    agents = start_agents(ddprun, kind, etcd, f"loss-{kind}-{i}", 3, "2:3", ["--no_python", "/bin/sleep", "30"])
    wait_all(agents, "rendezvous round 0 complete")
    victim = agents[-1]
    t0 = time.time()
    victim.p.send_signal(signal.SIGKILL)
    t = wait_all(agents[:-1], "rendezvous round 1 complete") - t0
    finish(agents)
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--agents", default="2,16,64")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    if not shutil.which("etcd"):
        raise SystemExit("etcd is not installed (scripts/setup.sh installs etcd-server)")
    with tempfile.TemporaryDirectory() as tmp:
        procs, endpoints = start_etcd(tmp)
        try:
            print("| agents | c10d rendezvous (median) | etcd rendezvous (median) | etcd / c10d |")
            print("|---|---|---|---|")
            for n in [int(x) for x in a.agents.split(",")]:
                times = {k: sorted(rendezvous_time(a.ddprun, k, endpoints, n, i) for i in range(a.rounds))
                         for k in ("c10d", "etcd")}
                c, e = times["c10d"][len(times["c10d"]) // 2], times["etcd"][len(times["etcd"]) // 2]
                print(f"| {n} | {c:.3f} s | {e:.3f} s | {e / c:.2f}x |", flush=True)
            print()
            print("| node loss to running again (3 agents) | c10d (median) | etcd (median) | etcd / c10d |")
            print("|---|---|---|---|")
            loss = {k: sorted(node_loss_time(a.ddprun, k, endpoints, i) for i in range(a.rounds)) for k in ("c10d", "etcd")}
            c, e = loss["c10d"][len(loss["c10d"]) // 2], loss["etcd"][len(loss["etcd"]) // 2]
            print(f"| kill -9 of a non-host agent | {c:.3f} s | {e:.3f} s | {e / c:.2f}x |")
        finally:
            for p in procs:
                p.kill()
                p.wait()


if __name__ == "__main__":
    main()
