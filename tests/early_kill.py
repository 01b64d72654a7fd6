#!/usr/bin/python3
"""kill -9 of ddprun at a random moment of its first milliseconds, COUNT times: afterwards no
temporary directory of ddprun's (TMPDIR's ddprun-*, under /dev/shm by default), no cgroup of its
own (ddprun-PID-*) and no worker may be left. Run inside a private mount and pid namespace
(early_kill_test.sh), where /dev/shm and /tmp are its own.
Usage: early_kill.py DDPRUN COUNT MAX_DELAY_MS"""
import glob
import os
import random
import signal
import subprocess
import sys
import time


def guardians():
    found = []
    for p in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(p, "rb") as f:
                if b"--ddprun-guardian" in f.read():
                    found.append(p)
        except OSError:
            pass
    return found


def wait_until(cond, seconds):
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.002)  # polling the process table, with a deadline
    return cond()


def own_cgroup():
    with open("/proc/self/cgroup") as f:
        rel = [l.strip()[3:] for l in f if l.startswith("0::")]
    return "/sys/fs/cgroup" + (rel[0] if rel and rel[0] != "/" else "") if rel else None


def main():
    ddprun, count, max_ms = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    rng = random.Random(int(os.environ.get("DDPRUN_TEST_SEED", "1")))
    cg = own_cgroup()
    pids, delays = [], []
    for i in range(count):
        p = subprocess.Popen([ddprun, "--standalone", "--nproc_per_node=1", "--no_python", "/bin/sleep", "30"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        delay = rng.uniform(0, max_ms) / 1000
        time.sleep(delay)
        p.kill()
        p.wait()
        pids.append(p.pid)
        delays.append(delay)
        if not wait_until(lambda: not guardians(), 5):
            print(f"FAILED: a guardian still runs 5 s after kill -9 number {i}")
            return 1
    leftovers = glob.glob("/dev/shm/ddprun-*") + glob.glob("/tmp/ddprun-*")
    cgroups = [d for pid in pids for d in glob.glob(f"{cg}/ddprun-{pid}-*")] if cg else []
    alive = lambda: subprocess.run(["pgrep", "-f", "^/bin/sleep 30$"], stdout=subprocess.PIPE).stdout.split()
    wait_until(lambda: not alive(), 5)
    workers = alive()
    print(f"{count} kill -9s at 0-{max_ms:g} ms (median {sorted(delays)[len(delays) // 2] * 1000:.2f} ms): "
          f"{len(leftovers)} temporary directories, {len(cgroups)} cgroups, {len(workers)} workers left")
    for what, found in (("temporary directories", leftovers), ("cgroups", cgroups), ("workers", workers)):
        if found:
            print(f"FAILED: {what} left: {found[:5]}")
    return 1 if leftovers or cgroups or workers else 0


if __name__ == "__main__":
    sys.exit(main())
