#!/usr/bin/python3
"""Recovery from a crash, end to end: torchrun, ddprun starting cold (--warm_spares=0) and ddprun
with warm spares, side by side in one run, on the same job (bench/recovery_job.py: PyTorch DDP
over gloo, a checkpoint a step, rank 1 dying at step 10 of the first attempt, resumed from the
checkpoint). Timed from the crash (the dying rank's time.time() just before os._exit) to every
rank's first step of the next attempt (the latest of the ranks' time.time() after their first
optimizer step): what the job loses, imports, init_process_group, model and checkpoint load
included.

The crashing rank waits, before it dies, for a file the bench creates: at once for torchrun and
cold ddprun, once every warm spare says it is ready for warm ddprun (spares are made after the
group's first heartbeat and import at the lowest priority: on a machine this busy they may take
seconds, a cost paid while training, not at the failure).

Runs are interleaved (torchrun, cold, warm, then reversed), the median of --reps each.

--crash_after S: the crashing rank dies S seconds after the launch (or at step 10 if that comes
later) in every set-up, warm spares ready or not. --hogs N: N processes spinning at normal
priority beside the job, for all of the run (a node whose data loaders keep its cores busy).

--node-loss (as root): the node-loss case instead, across three namespaced hosts
(bench/node_loss_trial.sh): --nnodes=2 over c10d with every launcher's defaults (keep-alive 5 s x
3), 2 workers a host; h3 waits for a place; every process on h2 SIGKILLed; timed from the kill to
every rank's first step of the next round. A launcher that does not recover within --bound
seconds is reported as such.

--torchrun names torchrun's script, or (a name without "/") its module, run with --python's -m:
torch.distributed.run for PyTorch 2.x's own. For PyTorch 2.x in a chroot, run the bench there with
bench/in_chroot.sh (docs/benchmarks.md shows how).

Usage: bench/recovery_bench.py [--ddprun build/launcher/ddprun] [--python /usr/bin/python3]
           [--torchrun ../shared/tools/torchrun_fixed.py | --torchrun torch.distributed.run | --no-torchrun]
           [--sizes 2,4] [--reps 5]
           [--monitor-interval S]   (torchrun's; its own default when not given: 5 s in 1.13, 0.1 s in 2.x)
           [--crash_after S] [--hogs N]
       bench/recovery_bench.py --node-loss [--reps 3] [--bound 60]
"""
import argparse
import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "bench", "recovery_job.py")


class RunFailed(Exception):
    pass


def run_retried(cmd, env, n, tmp, warm, failed, crash_after=None):
    """A launcher's own failure (torchrun's store refusing a connection, seen here with 1.13; its
    gloo connectFullMesh failing after the restart with 2.6) is counted and the run taken again,
    at most four times."""
    for attempt in range(5):
        try:
            return run_once(cmd, env, n, tmp, warm, crash_after)
        except RunFailed as e:
            failed.append(str(e))
            print(f"  {e} (counted; run again)", flush=True)
    raise SystemExit("bench: five failed runs in a row")


def run_once(cmd, env, n, tmp, warm, crash_after=None, timeout=600):
    ckpt, times, go = (os.path.join(tmp, d) for d in ("ckpt", "times", "go"))
    for d in (ckpt, times):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    if os.path.exists(go):
        os.unlink(go)
    if not warm and crash_after is None:
        open(go, "w").close()
    cmd = cmd + [JOB, "--steps", "14", "--crash_step", "10", "--ckpt", ckpt, "--times", times, "--go", go,
                 "--step_sleep", "0.05"]
    p = subprocess.Popen(cmd, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ready, lines = set(), []

    def read():
        for line in p.stdout:
            lines.append(line)
            m = re.search(r"warm spare for local rank (\d+) ready", line)
            if m and crash_after is None:
                ready.add(m.group(1))
                if len(ready) == n and not os.path.exists(go):
                    open(go, "w").close()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    if crash_after is not None:
        try:
            p.wait(timeout=crash_after)
        except subprocess.TimeoutExpired:
            pass
        open(go, "w").close()
    rc = p.wait(timeout=timeout)
    t.join(10)
    firsts = glob.glob(os.path.join(times, "first.1.*"))
    if rc != 0 or len(firsts) != n or not os.path.exists(os.path.join(times, "crash")):
        sys.stderr.write("".join(lines[-30:]))
        why = [l.strip() for l in lines if re.search(r"Error\b", l) and "ChildFailedError" not in l]
        raise RunFailed(f"bench: a run failed (exit {rc}{': ' + why[-1] if why else ''}): {' '.join(cmd)}")
    crash = float(open(os.path.join(times, "crash")).read())
    said = [l.strip() for l in lines if "restarted in" in l]
    sums = {m.group(1) for m in (re.search(r"RESULT rank=0 .*checksum=(\S+)", l) for l in lines) if m}
    return max(float(open(f).read()) for f in firsts) - crash, (said[0] if said else ""), sums


def node_loss(a):
    trial = os.path.join(ROOT, "bench", "node_loss_trial.sh")
    kinds = (["torchrun"] if not a.no_torchrun else []) + ["cold", "warm"]
    got, notes = {k: [] for k in kinds}, {k: [] for k in kinds}
    for rep in range(a.reps):
        for k in kinds if rep % 2 == 0 else list(reversed(kinds)):
            out = subprocess.run([trial, k, os.path.abspath(a.ddprun), a.torchrun, a.python, str(a.bound)],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
            m = re.search(r"^seconds (\S+)", out, re.M)
            got[k].append(float(m.group(1)) if m else None)
            notes[k] += [l for l in out.splitlines() if "restarted in" in l or "none within" in l]
            print(f"  node loss, {k}: " + (f"{got[k][-1]:.3f} s" if m else out.strip().splitlines()[0]), flush=True)
    print(f"\nnode loss (2 active + 1 waiting host, 2 workers each), from the kill to every rank's first step "
          f"(median of {a.reps}; bound {a.bound} s):")
    med = {}
    for k, v in got.items():
        ok = [x for x in v if x is not None]
        med[k] = statistics.median(ok) if len(ok) == len(v) else None
        print(f"  {k:9s} " + (f"{med[k]:7.3f} s   ({min(ok):.3f}-{max(ok):.3f})" if med[k] is not None
                             else f"{len(v) - len(ok)} of {len(v)} runs did not recover within {a.bound} s"))
    if med.get("torchrun"):
        for k in ("cold", "warm"):
            if med[k] is not None:
                print(f"  ddprun {k} / torchrun: {med[k] / med['torchrun']:.3f}x")
    for line in notes["warm"][:4]:
        print("    " + line)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", default=os.path.join(ROOT, "build", "launcher", "ddprun"))
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--torchrun", default=os.path.join(os.path.dirname(ROOT), "shared", "tools", "torchrun_fixed.py"))
    ap.add_argument("--no-torchrun", action="store_true")
    ap.add_argument("--monitor-interval", type=float)
    ap.add_argument("--sizes", default="2,4")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--node-loss", action="store_true")
    ap.add_argument("--bound", type=int, default=60)
    ap.add_argument("--crash_after", type=float)
    ap.add_argument("--hogs", type=int, default=0)
    a = ap.parse_args()
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.hogs)]
    try:
        return measure(a)
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def measure(a):
    if a.node_loss:
        return node_loss(a)
    env = dict(os.environ, PYTHON_EXEC=a.python)
    env.pop("PYTHONPATH", None)
    ddprun = os.path.abspath(a.ddprun)
    tmp = tempfile.mkdtemp(prefix="recovery-bench-")
    try:
        for n in [int(x) for x in a.sizes.split(",")]:
            common = ["--nproc_per_node", str(n), "--max_restarts", "1"]
            kinds = {}
            if not a.no_torchrun:
                mi = ["--monitor_interval", str(a.monitor_interval)] if a.monitor_interval is not None else []
                tr = [a.torchrun] if "/" in a.torchrun else ["-m", a.torchrun]
                kinds["torchrun"] = ([a.python] + tr + ["--standalone"] + mi + common, False)
            kinds["ddprun cold"] = ([ddprun, "--standalone", "--warm_spares", "0"] + common, False)
            kinds["ddprun warm"] = ([ddprun, "--standalone", "--warm_spares", "1"] + common, True)
            got = {k: [] for k in kinds}
            failed = {k: [] for k in kinds}
            checksums = {k: set() for k in kinds}
            said = []
            for rep in range(a.reps):
                order = list(kinds) if rep % 2 == 0 else list(reversed(kinds))
                for k in order:
                    secs, line, sums = run_retried(kinds[k][0], env, n, tmp, kinds[k][1], failed[k], a.crash_after)
                    got[k].append(secs)
                    checksums[k] |= sums
                    if k == "ddprun warm":
                        said.append(line)
                    print(f"  {n} workers, {k}: {secs:.3f} s", flush=True)
            when = f"{a.crash_after:g} s after the launch (at step 10 at the earliest)" if a.crash_after is not None \
                else "at step 10"
            print(f"\n{n} workers, crash of rank 1 {when}, to every rank's first step of the next attempt "
                  f"(median of {a.reps}{f'; {a.hogs} CPU hogs beside the job' if a.hogs else ''}):")
            for k, v in got.items():
                print(f"  {k:12s} {statistics.median(v):7.3f} s   ({min(v):.3f}-{max(v):.3f})" +
                      (f"   {len(failed[k])} failed run(s) taken again" if failed[k] else ""))
            if "torchrun" in got:
                t = statistics.median(got["torchrun"])
                for k in ("ddprun cold", "ddprun warm"):
                    print(f"  {k} / torchrun: {statistics.median(got[k]) / t:.3f}x")
            warm_s, cold_s = statistics.median(got['ddprun warm']), statistics.median(got['ddprun cold'])
            print(f"  ddprun warm / ddprun cold: {warm_s / cold_s:.3f}x (bound: 1.1 x cold + 0.2 s = "
                  f"{1.1 * cold_s + 0.2:.3f} s: {'within' if warm_s <= 1.1 * cold_s + 0.2 else 'OVER'})")
            every = set().union(*checksums.values())
            print("  parameters after the resumed run: " +
                  (f"the same in every run of every launcher (checksum {every.pop()})" if len(every) == 1
                   else f"DIFFER (or missing): {checksums}"))
            print("  ddprun's own account of its warm restarts:")
            for line in said:
                print("    " + line)
            print(flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
