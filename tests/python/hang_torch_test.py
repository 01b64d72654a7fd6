#!/usr/bin/python3
"""Hangs found by default and explained in one report (README: Hangs), on real PyTorch gloo DDP
jobs (tests/python/hang_worker.py):

  kinds        a rank stuck in Python outside any collective (2 and 4 workers; and with every
               rank's thread logging 1.5 MB/s to a file, which is no save), stopped by
               SIGSTOP, spinning with the GIL held, and calling a broadcast while the others are
               in DDP's all-reduce: one report, which blames that rank by rank, host and frame
               with its kind, without changing any worker (the stopped one stays stopped), and
               the job ends 124 --hang_stop after it;
  false_alarms a first step of 6 s, a 6 s evaluation loop (forward passes, no optimizer step) on
               every rank and an 8 s one on rank 0 alone while the other waits in a barrier, a
               checkpoint save of 8 s (torch.save, and plain file writes) on rank 0 while the others wait
               in a barrier (a save longer than the floor, as a long one is longer than 30 s), and the whole job
               beside two CPU hogs: each ends 0 with no report, event or metric;
  straggler    a rank busy 0.3 s in Python before each step: named a straggler (warning, event,
               metric), no hang
  default      the default flags (--worker_timeout=auto, --hang_floor=30) with a stuck rank: the
               report within 60 s of the hang (--hang_stop=5 keeps the test short).

The kinds and false alarms run with --hang_floor=3 (the floor scaled down 10x with the cases:
phases and a save longer than it; 5 for the four false alarms that run at once). The parts named run at once, the kinds two jobs at a time,
and the long first step beside the evaluation loop: jobs that mostly wait, wait side by side.
Exits 77 (skipped) without torch.
Usage: hang_torch_test.py --ddprun PATH [kinds|false_alarms|straggler|default ...]
"""
import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testlib import need_torch, require  # noqa: E402

need_torch()

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hang_worker.py")
HOST = os.uname().nodename


class Job:
    """ddprun running a hang_worker job; its output read on threads, each line handed to `on_line`."""

    def __init__(self, ddprun, tmp, name, flags, worker_args, on_line=None):
        self.events = os.path.join(tmp, name + ".jsonl")
        self.lines = []
        self.on_line = on_line
        env = dict(os.environ, PYTHON_EXEC="/usr/bin/python3")
        self.t0 = time.time()
        self.p = subprocess.Popen([ddprun, "--standalone", f"--events_file={self.events}",
                                   f"--log_dir={os.path.join(tmp, name)}", *flags, WORKER, *worker_args],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.readers = [threading.Thread(target=self._read, args=(s,)) for s in (self.p.stdout, self.p.stderr)]
        for r in self.readers:
            r.start()

    def _read(self, stream):
        for line in stream:
            self.lines.append((time.time(), line))
            if self.on_line:
                self.on_line(line)

    def wait(self, timeout):
        try:
            self.p.wait(timeout=timeout)
        finally:
            if self.p.poll() is None:
                self.p.kill()
                self.p.wait()
        for r in self.readers:
            r.join()
        self.ended = time.time()
        self.text = "".join(l for _, l in self.lines)
        return self.p.returncode

    def event(self, name):
        with open(self.events) as f:
            return [json.loads(l) for l in f if f'"event":"{name}"' in l]

    def hang_time(self):
        for _, l in self.lines:
            m = re.search(r"HANG \w+ ([0-9.]+)", l)
            if m:
                return float(m.group(1))
        raise AssertionError(f"the worker never said it hung:\n{self.text[-2000:]}")


def proc_state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


FAST = ["--hang_floor=3", "--hang_stop=5"]


def hang_kind(ddprun, tmp, kind, nproc, rank, expect, at=5, extra=(), suffix=""):
    """`rank` hangs as `kind` at step `at`; the report must blame it with `expect` (a regexp)."""
    seen = {}

    def on_line(line):  # the report is out: the stuck worker is untouched, the metric counts it
        m = re.search(r"metrics on port (\d+)", line)
        if m:
            seen["port"] = m.group(1)
        if "ddprun: hang on" not in line:
            return
        if "state" not in seen:  # first: the workers are stopped --hang_stop after the report
            started = job.event("workers_started")[0]
            pid = started["pids"][started["ranks"].index(rank)]
            try:
                seen["state"] = proc_state(pid)
            except OSError:
                seen["state"] = "gone"
        if "port" in seen and "metrics" not in seen:
            deadline = time.monotonic() + 2.5  # the metrics are refreshed once a second
            while time.monotonic() < deadline and seen.get("metrics") != ["ddprun_hangs_reported_total 1"]:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{seen['port']}/metrics", timeout=5) as r:
                        seen["metrics"] = [l for l in r.read().decode().splitlines()
                                           if l.startswith("ddprun_hangs_reported")]
                except OSError as e:
                    seen["metrics"] = [f"unreadable: {e}"]
                    break
                time.sleep(0.2)

    name = f"{kind}{nproc}{suffix}"
    job = Job(ddprun, tmp, name, [f"--nproc_per_node={nproc}", "--metrics_port=0", *FAST],
              ["--hang", kind, "--rank", str(rank), "--at", str(at), "--steps", "100000", *extra], on_line)
    rc = job.wait(180)
    what = f"{kind}, {nproc} workers, rank {rank}"
    require(rc == 124, f"{what}: the job ends 124" + ("" if rc == 124 else f" (got {rc}; {job.text[-1500:]})"))
    reports = job.event("hang_reported")
    require(len(reports) == 1 and job.text.count("ddprun: hang on") == 1, f"{what}: one report ({len(reports)} events)")
    r = reports[0]
    require(r["blamed"] == [rank], f"{what}: it blames rank {rank} (blamed {r['blamed']}: {r['verdict']})")
    require(re.search(expect, r["verdict"]) is not None, f"{what}: the verdict says '{expect}': {r['verdict']}")
    require(f"host {HOST}, pid " in r["verdict"], f"{what}: the verdict names the host and pid")
    took = r_time(r) - job.hang_time()
    require(took < 3 + 6, f"{what}: reported {took:.1f} s after the hang (--hang_floor=3)")
    require("Fatal Python error" not in job.text, f"{what}: no crash banner in the output")
    expected_state = "T" if kind == "sigstop" else ("R" if kind == "spin" else None)
    if expected_state:
        require(seen.get("state") == expected_state,
              f"{what}: after the report rank {rank} is still '{expected_state}' ({seen.get('state')}): unchanged")
    else:
        require(seen.get("state") not in (None, "gone", "Z"), f"{what}: after the report rank {rank} still runs")
    # --hang_stop=5 counts from when the silence was found (--hang_floor=3 after the hang), not from
    # the report, which a loaded machine takes longer to read the stacks for.
    stop, since_hang = job.ended - r_time(r), job.ended - job.hang_time()
    require(since_hang > 3 + 5 - 0.5 and stop < 5 + 10,
            f"{what}: the job stopped {since_hang:.1f} s after the hang, {stop:.1f} s after the report "
            "(--hang_floor=3, then --hang_stop=5 from when the silence was found)")
    require(r["kind"] in expected_kinds(kind), f"{what}: kind {r['kind']}")
    require(seen.get("metrics") == ["ddprun_hangs_reported_total 1"],
          f"{what}: ddprun_hangs_reported_total is 1 while the workers still run ({seen.get('metrics')})")


def expected_kinds(kind):
    return {"stuck": ["stuck"], "spin": ["spinning"], "sigstop": ["stopped"], "mismatch": ["mismatch"]}[kind]


def r_time(event):
    """The event's time stamp as seconds since the epoch."""
    from datetime import datetime, timezone
    return datetime.strptime(event["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


def wrapped(ddprun, tmp):
    """The trainer below a Python wrapper (subprocess.call, as `poetry run` or a launcher script):
    read where it trains (the hook's HEARTBEAT.pid), not at the wrapper waiting for its child."""
    wrapper = os.path.join(tmp, "wrap.py")
    with open(wrapper, "w") as f:
        f.write("import subprocess, sys\nsys.exit(subprocess.call([sys.executable, '-u', *sys.argv[1:]]))\n")
    job = Job(ddprun, tmp, "wrapped", ["--nproc_per_node=2", *FAST, "--no_python", "/usr/bin/python3", wrapper],
              ["--hang", "stuck", "--rank", "1", "--at", "5", "--steps", "100000"])
    rc = job.wait(180)
    require(rc == 124, "wrapped: the job ends 124" + ("" if rc == 124 else f" ({rc}; {job.text[-1500:]})"))
    r = job.event("hang_reported")
    require(len(r) == 1 and r[0]["blamed"] == [1] and "load_batch" in r[0]["verdict"],
          f"wrapped: the trainer below the wrapper is read and blamed ({r[0]['verdict'] if r else r})")


def kinds(ddprun, tmp):
    """Two jobs at a time: each mostly waits for its floor and its --hang_stop."""
    stuck = r"rank 1 \(host .*\) is stuck outside any collective in load_batch \(hang_worker\.py:\d+\); rank 0 waits for it in DDP's all-reduce"

    def first():
        # Beside it every rank's thread logs 1.5 MB/s to a file (from its start: the hang comes once
        # a window of steps has shown ddprun that pace): writes at the pace it had while stepping
        # are no save, and hide no hang.
        hang_kind(ddprun, tmp, "stuck", 2, 1, stuck, at=60, extra=["--log_mb_s", "1.5", "--write_dir", tmp])
        hang_kind(ddprun, tmp, "sigstop", 2, 1, r"rank 1 \(.*\) is stopped \(SIGSTOP")
        hang_kind(ddprun, tmp, "mismatch", 2, 1, r"ranks wait in different collectives: rank 0 \(.*\) in DDP's all-reduce .*rank 1 \(.*\) in torch\.distributed\.broadcast")

    def second():
        hang_kind(ddprun, tmp, "stuck", 4, 2, r"rank 2 \(.*\) is stuck outside any collective in load_batch .*ranks 0-1, 3 wait for it in DDP's all-reduce")
        wrapped(ddprun, tmp)
        hang_kind(ddprun, tmp, "spin", 2, 1, r"rank 1 \(.*\) is spinning \(busy \d+% of the time\) outside any collective in load_batch")

    together(first, second)


def no_alarm(ddprun, tmp, name, worker_args, flags=(), metrics=False, said=None, floor=3):
    port = {}

    def on_line(line):
        m = re.search(r"metrics on port (\d+)", line)
        if m and "port" not in port:
            port["port"] = m.group(1)
        if metrics and "step 38" in line and "port" in port:
            with urllib.request.urlopen(f"http://127.0.0.1:{port['port']}/metrics", timeout=5) as r:
                port["metrics"] = r.read().decode()

    job = Job(ddprun, tmp, name, ["--nproc_per_node=2", f"--hang_floor={floor}", "--hang_stop=5", *flags,
                                  *(["--metrics_port=0"] if metrics else [])],
              ["--steps", "40", *worker_args], on_line)
    rc = job.wait(300)
    require(rc == 0, f"{name}: the job ends 0" + ("" if rc == 0 else f" ({rc}; {job.text[-1500:]})"))
    reports = job.event("hang_reported")
    require("ddprun: hang on" not in job.text and not reports,
          f"{name}: no hang report, no event" + (f" ({[(r['reason'], r['verdict']) for r in reports]})" if reports else ""))
    require("straggler" not in job.text and not job.event("straggler"), f"{name}: no straggler named")
    if said:
        require(said in job.text, f"{name}: ddprun says '{said}'")
    if metrics:
        line = [l for l in port.get("metrics", "").splitlines() if l.startswith("ddprun_hangs_reported_total")]
        require(line == ["ddprun_hangs_reported_total 0"], f"{name}: ddprun_hangs_reported_total is 0 near the end ({line})")


def together(*calls):
    """Runs the calls at once, each on a thread, and raises the first failure: the jobs that
    mostly wait (a long first step, an evaluation loop, a 30 s floor) wait side by side. Each job's own
    workers and agent are apart from the others'; beside them it is only slower, which makes a
    false alarm likelier, not less likely."""
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        for f in [pool.submit(c) for c in calls]:
            f.result()


def false_alarms(ddprun, tmp):
    # Beside them, a save without torch.save (plain writes, as numpy or safetensors do): seen by
    # its writes to storage. Four jobs at once: a 5 s floor, still shorter than each pause, as
    # PyTorch's own exit after the last step took over 3 s in fresh-clone runs (a rank's silence
    # at the end is judged as any).
    together(lambda: no_alarm(ddprun, tmp, "first_step", ["--first_step", "6"], floor=5),
             lambda: no_alarm(ddprun, tmp, "evaluation", ["--eval_at", "5", "--eval_s", "6"], metrics=True, floor=5),
             lambda: no_alarm(ddprun, tmp, "evaluation_rank0", ["--eval_at", "5", "--eval_s", "8", "--eval_rank", "0"],
                              floor=5),
             lambda: no_alarm(ddprun, tmp, "write", ["--write_at", "5", "--write_s", "8", "--write_dir", tmp],
                              said="rank 0 is writing to storage", floor=5))
    # Longer than the floor: the others wait. Alone: the save's beat every 2 s leaves 1 s to the
    # floor scaled down to 3 s (30 s by default), which a loaded machine once took.
    no_alarm(ddprun, tmp, "save", ["--save_at", "5", "--save_s", "8"])
    hogs = [subprocess.Popen(["/usr/bin/python3", "-c", "while True: pass"]) for _ in range(2)]
    try:
        no_alarm(ddprun, tmp, "under_load", [])
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def straggler(ddprun, tmp):
    """Rank 1 busy 0.3 s in Python before each step: named a straggler, in a warning, an event
    and the metric; the job still ends 0."""
    seen = {}

    def on_line(line):
        m = re.search(r"metrics on port (\d+)", line)
        if m:
            seen["port"] = m.group(1)
        if "is a straggler" in line and "port" in seen and "metrics" not in seen:
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and "ddprun_stragglers 1" not in seen.get("metrics", []):
                with urllib.request.urlopen(f"http://127.0.0.1:{seen['port']}/metrics", timeout=5) as r:
                    seen["metrics"] = [l for l in r.read().decode().splitlines() if "straggler" in l or "busy" in l]
                time.sleep(0.2)

    job = Job(ddprun, tmp, "straggler", ["--nproc_per_node=2", "--metrics_port=0", *FAST],
              ["--steps", "70", "--slow_rank", "1", "--slow_s", "0.3"], on_line)
    rc = job.wait(300)
    require(rc == 0, "straggler: the job ends 0" + ("" if rc == 0 else f" ({rc}; {job.text[-1500:]})"))
    ev = job.event("straggler")
    require(len(ev) == 1 and ev[0]["rank"] == 1, f"straggler: rank 1 named once ({ev}; "
          f"{[l for _, l in job.lines if 'straggler' in l]})")
    require(ev[0]["busy"] > 0.6 and ev[0]["others_busy"] < 0.4, f"straggler: busy {ev[0]['busy']:.2f} vs "
          f"{ev[0]['others_busy']:.2f}")
    require("ddprun_stragglers 1" in seen.get("metrics", []), f"straggler: the metric says so ({seen.get('metrics')})")
    require(not job.event("hang_reported"), "straggler: slow is no hang")


def default(ddprun, tmp):
    job = Job(ddprun, tmp, "default", ["--nproc_per_node=2", "--hang_stop=5"],
              ["--hang", "stuck", "--rank", "1", "--at", "5", "--steps", "100000"])
    rc = job.wait(240)
    require(rc == 124, f"default flags: the job ends 124" + ("" if rc == 124 else f" ({rc}; {job.text[-1500:]})"))
    r = job.event("hang_reported")
    require(len(r) == 1 and r[0]["blamed"] == [1], f"default flags: one report blaming rank 1 ({r})")
    took = r_time(r[0]) - job.hang_time()
    require(took < 60, f"default flags: the report came {took:.1f} s after the hang (within 60 s)")
    require("--hang_floor=30" in r[0]["reason"], f"default flags: the floor was 30 s ({r[0]['reason']})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("parts", nargs="*", default=["kinds", "false_alarms", "default"])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        together(*[lambda part=part: globals()[part](args.ddprun, tmp) for part in args.parts])
    print("all hang checks passed")


if __name__ == "__main__":
    main()
