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


def guardians(ddprun):
    """The guardians left, and the killed ddprun's children not yet turned into one (forked, not
    yet exec'd: they still show ddprun's command line, and become a guardian when next scheduled;
    every ddprun started here was killed and reaped, so any other process with its command line
    is such a child)."""
    found = []
    for p in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(p, "rb") as f:
                cmdline = f.read()
            if b"--ddprun-guardian\0" in cmdline or cmdline.split(b"\0")[0] == ddprun.encode():
                found.append(p.split("/")[2])
        except OSError:
            pass
    return found


def wait_until(cond, seconds, step=0.002):
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(step)  # polling the process table, with a deadline
    return cond()


def own_cgroups():
    """This process's cgroup v2 directory where the hierarchy may be mounted (a hybrid machine has it
    at /sys/fs/cgroup/unified)."""
    with open("/proc/self/cgroup") as f:
        rel = [l.strip()[3:] for l in f if l.startswith("0::")]
    rel = rel[0] if rel and rel[0] != "/" else ""
    return [d for d in ("/sys/fs/cgroup" + rel, "/sys/fs/cgroup/unified" + rel) if os.path.exists(d + "/cgroup.controllers")]


def own_cgroup_of_the_test():
    """As root, a cgroup of this test's own below its cgroup: the jobs' cgroups are made below it,
    so that only they are counted (another test's ddprun in another pid namespace may have the same
    pid). The cgroup in use, or None."""
    for base in own_cgroups():
        mine = f"{base}/early-kill-test-{os.getpid()}"
        try:
            os.mkdir(mine)
            with open(f"{mine}/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))
            return mine
        except OSError:
            try:
                os.rmdir(mine)
            except OSError:
                pass
    return None


def main():
    ddprun, count, max_ms = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    rng = random.Random(int(os.environ.get("DDPRUN_TEST_SEED", "1")))
    mine = own_cgroup_of_the_test() if os.geteuid() == 0 else None
    cgs = own_cgroups()
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
    # The guardians finish on their own; on a loaded machine some take seconds to be scheduled.
    t0 = time.monotonic()
    if not wait_until(lambda: not guardians(ddprun), 120, 0.05):
        print(f"FAILED: guardians still run 120 s after the last kill -9: {guardians(ddprun)}")
        return 1
    settled = time.monotonic() - t0
    leftovers = glob.glob("/dev/shm/ddprun-*") + glob.glob("/tmp/ddprun-*")
    cgroups = [d for cg in cgs for pid in pids for d in glob.glob(f"{cg}/ddprun-{pid}-*")]
    alive = lambda: subprocess.run(["pgrep", "-f", "^/bin/sleep 30$"], stdout=subprocess.PIPE).stdout.split()
    wait_until(lambda: not alive(), 5)
    workers = alive()
    print(f"{count} kill -9s at 0-{max_ms:g} ms (median {sorted(delays)[len(delays) // 2] * 1000:.2f} ms): "
          f"{len(leftovers)} temporary directories, {len(cgroups)} cgroups, {len(workers)} workers left; "
          f"(every guardian done {settled:.2f} s after the last kill)")
    if mine:
        with open(os.path.dirname(mine) + "/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))
        try:
            os.rmdir(mine)
        except OSError as e:
            print(f"FAILED: the test's cgroup {mine} cannot be removed ({e}): something of the jobs is left in it")
            cgroups.append(mine)
    for what, found in (("temporary directories", leftovers), ("cgroups", cgroups), ("workers", workers)):
        if found:
            print(f"FAILED: {what} left: {found[:5]}")
    return 1 if leftovers or cgroups or workers else 0


if __name__ == "__main__":
    sys.exit(main())
