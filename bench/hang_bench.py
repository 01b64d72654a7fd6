#!/usr/bin/python3
"""The hang detector, measured (README: Hangs): a matrix of hang kinds, positions and world sizes
on PyTorch gloo DDP jobs (tests/python/hang_worker.py, a rank hangs at step 5), and the false-alarm
cases, side by side with torchrun in the same hang.

For each case it prints the time from the hang (the worker's own time stamp, printed just before
it hangs) to ddprun's report (the hang_reported event), the rank the verdict blames and whether it
is the stuck one, the kind, and the time to the job's end (exit 124 at --hang_stop after the report).
The false alarms (a first step of 3x the floor, an evaluation loop of 3x the floor without
optimizer steps, a checkpoint save of 2/3 of the floor on rank 0 while the others wait in a
barrier, two CPU hogs beside the job) must end 0 without a report. torchrun (1.13, patched to run
here) runs the stuck case for --torchrun_wait seconds: it has no hang detection, so it reports
nothing; gloo's own time-out (30 min) or NCCL's watchdog (10 min) would end it.

--hang_floor scales the cases (default 3 s, the floor the tests use: the default floor is 30 s;
--hang_floor=30 runs the same matrix at the default flags, ten times longer).
Usage: hang_bench.py [--ddprun PATH] [--hang_floor S] [--worlds 2,4] [--torchrun PATH|--no-torchrun]
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "python", "hang_worker.py")
PY = "/usr/bin/python3"


def ts(event):
    return datetime.strptime(event["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


def run(cmd, events, timeout):
    t0 = time.time()
    p = subprocess.run(cmd, env=dict(os.environ, PYTHON_EXEC=PY), capture_output=True, text=True, timeout=timeout)
    ev = []
    if events and os.path.exists(events):
        with open(events) as f:
            ev = [json.loads(l) for l in f]
        os.unlink(events)
    return p, ev, time.time() - t0


def hang_time(out):
    m = re.search(r"HANG \w+ ([0-9.]+)", out)
    return float(m.group(1)) if m else None


def ddprun_case(a, kind, world, rank):
    events = f"/tmp/hang_bench.{os.getpid()}.jsonl"
    cmd = [a.ddprun, "--standalone", f"--nproc_per_node={world}", f"--hang_floor={a.hang_floor}",
           f"--hang_stop={a.hang_stop}", f"--events_file={events}", WORKER, "--hang", kind, "--rank", str(rank),
           "--at", "5", "--steps", "100000"]
    p, ev, _ = run(cmd, events, 600)
    end = time.time()
    hung = hang_time(p.stdout)
    rep = [e for e in ev if e["event"] == "hang_reported"]
    fin = [e for e in ev if e["event"] == "job_finished"]
    if not rep or hung is None:
        return {"kind": kind, "world": world, "rank": rank, "report_s": None, "blamed": None, "right": False,
                "verdict_kind": "-", "end_s": None, "rc": p.returncode}
    r = rep[0]
    return {"kind": kind, "world": world, "rank": rank, "report_s": ts(r) - hung, "blamed": r["blamed"],
            "right": r["blamed"] == [rank], "verdict_kind": r["kind"],
            "end_s": (ts(fin[0]) if fin else end) - hung, "rc": p.returncode, "verdict": r["verdict"]}


def false_alarm(a, name, extra, hogs=0):
    events = f"/tmp/hang_bench.{os.getpid()}.jsonl"
    procs = [subprocess.Popen([PY, "-c", "while True: pass"]) for _ in range(hogs)]
    try:
        p, ev, took = run([a.ddprun, "--standalone", "--nproc_per_node=2", f"--hang_floor={a.hang_floor}",
                           f"--events_file={events}", WORKER, "--steps", "40", *extra], events, 900)  # (a later --steps wins)
    finally:
        for h in procs:
            h.kill()
            h.wait()
    reports = sum(1 for e in ev if e["event"] == "hang_reported")
    return {"case": name, "rc": p.returncode, "reports": reports, "took_s": took}


def torchrun_case(a, world):
    """torchrun in the stuck case: how long it stays silent (bounded by --torchrun_wait)."""
    cmd = [PY, a.torchrun, "--standalone", f"--nproc_per_node={world}", WORKER, "--hang", "stuck", "--rank", "1",
           "--at", "5", "--steps", "100000"]
    t0 = time.time()
    log = f"/tmp/hang_bench.torchrun.{os.getpid()}.log"
    with open(log, "w") as f:  # a file, not a pipe: the workers outlive a killed torchrun
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        p.wait(timeout=a.torchrun_wait)
        result = {"ended": True, "rc": p.returncode, "after_s": time.time() - t0}
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # torchrun and its workers
        p.wait()
        with open(log) as f:
            hung = hang_time(f.read())
        result = {"ended": False, "silent_s": time.time() - (hung or t0)}
    os.unlink(log)
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", default=os.path.join(ROOT, "build", "launcher", "ddprun"))
    ap.add_argument("--hang_floor", type=float, default=3)
    ap.add_argument("--hang_stop", type=float, default=3)
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--torchrun", default=os.path.join(os.path.dirname(ROOT), "shared", "tools", "torchrun_fixed.py"))
    ap.add_argument("--no-torchrun", dest="torchrun", action="store_const", const="")
    ap.add_argument("--torchrun_wait", type=float, default=60)
    a = ap.parse_args()
    rows = []
    print(f"hang matrix: gloo DDP, a rank hangs at step 5; --hang_floor={a.hang_floor:g} --hang_stop={a.hang_stop:g}")
    print(f"{'kind':<9} {'world':>5} {'rank':>4} {'hang->report':>12} {'blamed':>7} {'right':>5} {'verdict kind':>12} {'hang->end':>9} {'exit':>4}")
    for world in [int(w) for w in a.worlds.split(",")]:
        for kind in ("stuck", "spin", "sigstop", "mismatch"):
            # The first and the last rank; a mismatch's broadcast has rank 0 as its source, so the
            # odd one out is another rank.
            positions = sorted({1 if kind == "mismatch" else 0, world - 1})
            for rank in positions:
                r = ddprun_case(a, kind, world, rank)
                rows.append(r)
                rep = f"{r['report_s']:.1f} s" if r["report_s"] is not None else "none"
                end = f"{r['end_s']:.1f} s" if r["end_s"] is not None else "-"
                print(f"{kind:<9} {world:>5} {rank:>4} {rep:>12} {str(r['blamed']):>7} {'yes' if r['right'] else 'NO':>5} "
                      f"{r['verdict_kind']:>12} {end:>9} {r['rc']:>4}", flush=True)
    right = sum(r["right"] for r in rows)
    print(f"blamed the stuck rank in {right} of {len(rows)} cases")
    f = a.hang_floor
    print("\nfalse alarms (must end 0 with no report):")
    for name, extra, hogs in [(f"first step {3 * f:g} s", ["--first_step", str(3 * f)], 0),
                              (f"evaluation loop {3 * f:g} s", ["--eval_at", "5", "--eval_s", str(3 * f)], 0),
                              (f"checkpoint save {2 * f / 3:g} s", ["--save_at", "5", "--save_s", str(2 * f / 3)], 0),
                              ("two CPU hogs beside the job, 200 steps", ["--steps", "200"], 2)]:
        r = false_alarm(a, name, extra, hogs)
        print(f"  {name:<30} exit {r['rc']}, reports {r['reports']}, {r['took_s']:.1f} s", flush=True)
    if a.torchrun:
        for world in [int(w) for w in a.worlds.split(",")][:1]:
            t = torchrun_case(a, world)
            if t["ended"]:
                print(f"\ntorchrun, stuck rank 1 of {world}: ended by itself after {t['after_s']:.1f} s (rc {t['rc']})")
            else:
                print(f"\ntorchrun, stuck rank 1 of {world}: silent {t['silent_s']:.0f} s after the hang, no report "
                      f"(stopped by the bench at {a.torchrun_wait:g} s; gloo's time-out is 1800 s)")
    sys.exit(0 if right == len(rows) else 1)


if __name__ == "__main__":
    main()
