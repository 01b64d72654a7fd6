#!/usr/bin/python3
"""ddprun's progress hook (agent/python/sitecustomize.py) on unmodified PyTorch scripts:

1. examples/ddp_train.py (DDP over gloo, nothing about heartbeats in it) under --worker_timeout=3
   runs to completion: the hook touches each rank's DDPRUN_HEARTBEAT_FILE after every optimizer
   step (PyTorch 1.13 here: through Optimizer._optimizer_step_code);
2. the same job with rank 1 stopped by SIGSTOP mid-training is caught as hung (exit 124), the
   report blaming rank 1 as stopped;
3. --no_progress_hook leaves the heartbeat file untouched;
4. NCCL_ASYNC_ERROR_HANDLING: PyTorch 1.13 gets it once torch is imported (ddprun itself sets only
   TORCH_NCCL_ASYNC_ERROR_HANDLING); a PyTorch 2.x (tests/python/fake_torch2, a stand-in with
   2.x's version, hooks and deprecation warning: only 1.13 is installed here) prints no
   deprecation line and gets its heartbeats through register_optimizer_step_post_hook; with
   --no_progress_hook it does print the line (the stand-in can tell);
5. scripts that close every inherited descriptor, fork a child that saves, start a Python child
   that steps and saves, start a helper that steps once before the trainer and idles, or save
   where no thread can start: nothing of theirs written by the hook, the stuck rank blamed at its
   bound; a trainer that execs itself beside its DataLoader's worker beats on, and one beside a
   helper that stepped and ended beats once the helper has ended.

Exits 77 (skipped) when torch cannot be imported.
"""
import argparse
import json
import re
import os
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testlib import need_torch, require  # noqa: E402
import tempfile
import time

need_torch()

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DDP_SCRIPT = os.path.join(ROOT, "examples", "ddp_train.py")
FAKE_TORCH2 = os.path.join(ROOT, "tests", "python", "fake_torch2")
DEPRECATED = "NCCL_ASYNC_ERROR_HANDLING is deprecated"


def heartbeats(log_dir):
    """The mtime of every heartbeat file under log_dir, by rank directory."""
    out = {}
    for root, _, files in os.walk(log_dir):
        if "heartbeat" in files:
            out[os.path.basename(root)] = os.stat(os.path.join(root, "heartbeat")).st_mtime
    return out


def unhung_run_completes(ddprun, env, tmp):
    logs = os.path.join(tmp, "unhung")
    t0 = time.time()
    # 3 s: a loaded machine has stalled a rank for over 1 s (a garbage collection between steps).
    p = subprocess.run([ddprun, "--standalone", "--nproc_per_node=2", "--worker_timeout=3", f"--log_dir={logs}",
                        DDP_SCRIPT, "--epochs", "150"], env=env, capture_output=True, text=True, timeout=300)
    took = time.time() - t0
    require(p.returncode == 0, f"an unmodified DDP script under --worker_timeout=3 exits 0 ({took:.1f} s; "
                             f"{p.stderr[-800:]})")
    require(took > 6, f"it ran longer than 2x the time-out ({took:.1f} s)")
    beats = heartbeats(logs)
    require(sorted(beats) == ["0", "1"] and all(m > t0 + 1 for m in beats.values()),
          f"both ranks' heartbeat files were touched during training: {beats} (start {t0:.1f})")


def wait_for_line(stream, text, deadline):
    seen = []
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        seen.append(line)
        if text in line:
            return True
    raise AssertionError(f"'{text}' never came: {''.join(seen[-20:])}")


def sigstop_is_caught(ddprun, env, tmp):
    events = os.path.join(tmp, "events.jsonl")
    p = subprocess.Popen([ddprun, "--standalone", "--nproc_per_node=2", "--worker_timeout=3", "--stop_timeout=2",
                          f"--events_file={events}", DDP_SCRIPT, "--epochs", "100000"],
                         # (the dumps it keeps without --log_dir go to TMPDIR: this test's, removed with it)
                         env=dict(env, TMPDIR=tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_line(p.stdout, "epoch 2 loss", time.monotonic() + 120)
        with open(events) as f:
            started = [json.loads(l) for l in f if '"workers_started"' in l][0]
        os.kill(started["pids"][1], signal.SIGSTOP)
        t_stop = time.monotonic()
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    took = time.monotonic() - t_stop
    require(p.returncode == 124, f"rank 1 stopped by SIGSTOP is caught as hung: exit {p.returncode} "
                               f"({err[-1500:]})")
    require("no heartbeat for" in err, "the summary says no heartbeat")
    require(took < 30, f"within --worker_timeout plus the stack dump ({took:.1f} s after SIGSTOP)")
    require("ddprun: hang on" in err and re.search(r"rank 1 \(host .*, pid \d+\) is stopped \(SIGSTOP", err),
          "the hang report blames rank 1, stopped")


def hook_off_leaves_heartbeat(ddprun, env, tmp):
    logs = os.path.join(tmp, "off")
    t0 = time.time()
    p = subprocess.run([ddprun, "--standalone", "--nproc_per_node=1", "--worker_timeout=1", "--no_progress_hook",
                        "--worker_start_timeout=120", f"--log_dir={logs}", DDP_SCRIPT, "--epochs", "2"],
                       env=env, capture_output=True, text=True, timeout=300)
    require(p.returncode == 0, f"--no_progress_hook: the job runs ({p.stderr[-500:]})")
    beats = heartbeats(logs)
    # Created at spawn; importing torch alone takes longer than a second.
    require(beats["0"] < t0 + 1, f"--no_progress_hook: nothing touched the heartbeat file ({beats}, start {t0:.1f})")


ENV_SCRIPT = r"""
import os, sys
before = os.environ.get("NCCL_ASYNC_ERROR_HANDLING", "unset")
import torch
after = os.environ.get("NCCL_ASYNC_ERROR_HANDLING", "unset")
print(f"VERSION {torch.__version__.split('.')[0]} BEFORE {before} AFTER {after}", flush=True)
if hasattr(torch, "make_nccl_process_group"):
    torch.make_nccl_process_group()
    hb = os.environ["DDPRUN_HEARTBEAT_FILE"]
    t = os.stat(hb).st_mtime
    os.utime(hb, (t - 100, t - 100))
    torch.optim.Optimizer().step()
    print("STEP_TOUCHED", os.stat(hb).st_mtime > t - 50, flush=True)
"""


def nccl_variable(ddprun, env, tmp):
    script = os.path.join(tmp, "env.py")
    with open(script, "w") as f:
        f.write(ENV_SCRIPT)
    run = lambda extra, e: subprocess.run([ddprun, "--standalone", "--nproc_per_node=2", *extra, script], env=e,
                                          capture_output=True, text=True, timeout=120)
    p = run([], env)
    require(p.returncode == 0 and p.stdout.count("VERSION 1 BEFORE unset AFTER 1") == 2,
          f"PyTorch 1.13: NCCL_ASYNC_ERROR_HANDLING=1 once torch is imported, not before ({p.stdout}{p.stderr[-300:]})")
    p = run(["--no_progress_hook"], env)
    require(p.stdout.count("VERSION 1 BEFORE 1 AFTER 1") == 2, f"--no_progress_hook: ddprun sets it itself ({p.stdout})")
    env2 = dict(env, PYTHONPATH=FAKE_TORCH2)
    p = run([], env2)
    require(p.returncode == 0 and p.stdout.count("VERSION 2 BEFORE unset AFTER unset") == 2,
          f"PyTorch 2.x: NCCL_ASYNC_ERROR_HANDLING stays unset ({p.stdout}{p.stderr[-300:]})")
    require(DEPRECATED not in p.stderr, f"PyTorch 2.x: no deprecation line on any rank ({p.stderr[-500:]})")
    require(p.stdout.count("STEP_TOUCHED True") == 2, "PyTorch 2.x: register_optimizer_step_post_hook touches the heartbeat")
    p = run(["--no_progress_hook"], env2)
    require(p.stderr.count(DEPRECATED) == 2, f"without the hook the 2.x stand-in warns on every rank ({p.stderr[-500:]})")


HOSTILE = """
import os, subprocess, sys, threading, time
if os.environ.get("CASE") == "closefds":
    os.closerange(3, 1024)  # daemon hygiene: every inherited descriptor closed, then files of its own
log = open(os.path.join(os.environ["OUT"], "log.%s.txt" % os.environ["RANK"]), "w+")
log.write("HEADER\\n"); log.flush()
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
if os.environ.get("CASE") == "helper_first" and os.environ["RANK"] == "1":
    # a helper started first that takes a step before the trainer's first, then idles
    helper_done = os.path.join(os.environ["OUT"], "helper.stepped")
    subprocess.Popen([sys.executable, "-c", "import sys, time, torch; m = torch.nn.Linear(8, 1); "
                      "torch.optim.SGD(m.parameters(), lr=0.1).step(); open(sys.argv[1], 'w').close(); time.sleep(120)",
                      helper_done])
    while not os.path.exists(helper_done):
        time.sleep(0.05)
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(16, 8), torch.randn(16, 1)
CHILD = '''
import os, sys, time, torch
m = torch.nn.Linear(8, 1); o = torch.optim.SGD(m.parameters(), lr=0.01)
for i in range(300):  # 60 s of steps and saves, none of them its parent's
    o.step(); torch.save(m.state_dict(), sys.argv[1] + "/child.pt")
    if i == 0: open(sys.argv[1] + "/child.started", "w").close()
    time.sleep(0.2)
'''
started = os.path.join(os.environ["OUT"], "child.started")
for step in range(2000 if os.environ.get("CASE") == "exec_save" else 20):
    if step == 10 and os.environ.get("CASE") == "exec_save" and rank == 1:
        # an evaluation's or a checkpoint's subprocess, a fresh interpreter that inherits the variables
        subprocess.Popen([sys.executable, "-c", CHILD, os.environ["OUT"]])
    if os.environ.get("CASE") == "exec_save" and rank == 1 and os.path.exists(started):
        while True:
            time.sleep(0.1)  # stuck outside any collective, while its child steps and saves
    if step == 10 and os.environ.get("CASE") == "fork_save" and rank == 1:
        if os.fork() == 0:  # an async checkpoint's child: its torch.save is not this rank saving
            torch.save(model.state_dict(), os.path.join(os.environ["OUT"], "child.pt"))
            time.sleep(30)
            os._exit(0)
    if step == 10 and os.environ.get("CASE") == "no_thread":
        threading.Thread.start = lambda self: (_ for _ in ()).throw(RuntimeError("can't create new thread at interpreter shutdown"))
        torch.save(model.state_dict(), os.path.join(os.environ["OUT"], "saved.%d.pt" % rank))
    if step == 10 and os.environ.get("CASE") in ("closefds", "fork_save", "helper_first") and rank == 1:
        while True:
            time.sleep(0.1)  # stuck outside any collective
    opt.zero_grad(); torch.nn.functional.mse_loss(model(x), y).backward(); opt.step()
    time.sleep(0.05)
log.write("DONE\\n"); log.flush()
"""


EXEC_RESTART = """
import os, sys, time, torch
o = torch.optim.SGD(torch.nn.Linear(8, 1).parameters(), lr=0.01)
if len(sys.argv) < 2:  # 10 steps beside a DataLoader's worker (a forked child), then exec itself
    it = iter(torch.utils.data.DataLoader(torch.randn(640, 8), batch_size=8, num_workers=1, persistent_workers=True))
    for i in range(10):
        next(it); o.step(); time.sleep(0.1)
    os.execv(sys.executable, [sys.executable, sys.argv[0], "again"])
for i in range(50):
    o.step(); time.sleep(0.1)
print("DONE", flush=True)
"""


def beat_files(log_dir):
    """(the heartbeat file's text, its .pid's) of the single worker under log_dir."""
    for root, _, files in os.walk(log_dir):
        if "heartbeat" in files:
            read = lambda name: open(os.path.join(root, name)).read() if name in files else ""  # noqa: E731
            return read("heartbeat"), read("heartbeat.pid").strip()
    return "", ""


def exec_restart(ddprun, env, tmp):
    """A trainer that starts itself again with exec (its DataLoader's worker still alive) beats
    on: its new image's 50 steps are in the file (under a flock, which the DataLoader's worker
    kept, the file stayed at the 10 before the exec)."""
    script = os.path.join(tmp, "exec_restart.py")
    with open(script, "w") as f:
        f.write(EXEC_RESTART)
    p = subprocess.run([ddprun, "--standalone", "--nproc_per_node=1", f"--log_dir={tmp}/exec_restart", script],
                       env=env, capture_output=True, text=True, timeout=120)
    beat, _ = beat_files(f"{tmp}/exec_restart")
    require(p.returncode == 0 and "DONE" in p.stdout and beat == "50\n",
            f"a trainer that execs itself keeps beating ({p.returncode}; {beat!r}; {p.stderr[-600:]})")


SIBLINGS = """
import os, sys, time, torch
o = torch.optim.SGD(torch.nn.Linear(8, 1).parameters(), lr=0.01)
while sys.argv[2] == "TRAINER" and not os.path.exists(sys.argv[3]):
    time.sleep(0.02)  # the helper steps first
for i in range(int(sys.argv[1])):
    o.step(); time.sleep(0.1)
    if i == 0 and sys.argv[2] == "HELPER":
        open(sys.argv[3], "w").close()
print(sys.argv[2], os.getpid(), flush=True)
"""


def sibling_ended(ddprun, env, tmp):
    """A wrapper runs a helper that steps first (1 s) beside the trainer (5 s): once the helper has
    ended, the trainer is the one that beats (its pid in HEARTBEAT.pid, where the previous rule
    left the ended helper's for good)."""
    script = os.path.join(tmp, "siblings.py")
    with open(script, "w") as f:
        f.write(SIBLINGS)
    p = subprocess.run([ddprun, "--standalone", "--nproc_per_node=1", f"--log_dir={tmp}/siblings", "sh", "-c",
                        f"/usr/bin/python3 {script} 10 HELPER {tmp}/stepped & "
                        f"/usr/bin/python3 {script} 50 TRAINER {tmp}/stepped; wait"],
                       env=env, capture_output=True, text=True, timeout=120)
    trainer = re.search(r"TRAINER (\d+)", p.stdout)
    _, holder = beat_files(f"{tmp}/siblings")
    require(p.returncode == 0 and "HELPER" in p.stdout and trainer and holder == trainer.group(1),
            f"a trainer beside a helper that stepped and ended beats once it has ended ({p.returncode}; "
            f"HEARTBEAT.pid {holder!r}; {p.stdout[-300:]})")


def hostile_scripts(ddprun, env, tmp):
    """Scripts that close every inherited descriptor, fork a child that saves, start a Python child
    that steps and saves (it inherits DDPRUN_HEARTBEAT_FILE), or save where no thread can start: the hook writes nothing of theirs, and the hang report blames the right rank
    at its bound."""
    script = os.path.join(tmp, "hostile.py")
    with open(script, "w") as f:
        f.write(HOSTILE)
    for case in ("closefds", "fork_save", "exec_save", "helper_first", "no_thread"):
        out = os.path.join(tmp, case)
        os.makedirs(out)
        t0 = time.time()
        p = subprocess.run([ddprun, "--standalone", "--nproc_per_node=2", "--hang_floor=3", "--hang_stop=1",
                            f"--log_dir={out}/logs", script],
                           env=dict(env, CASE=case, OUT=out), capture_output=True, text=True, timeout=120)
        took = time.time() - t0
        if case == "no_thread":
            require(p.returncode == 0 and all(os.path.getsize(os.path.join(out, "saved.%d.pt" % r)) > 0 for r in (0, 1)),
                    f"{case}: torch.save where no thread can start saves, and the job ends 0 ({p.returncode}; {p.stderr[-600:]})")
            continue
        with open(os.path.join(out, "log.1.txt")) as f:
            log = f.read()
        require(log == "HEADER\n", f"{case}: the script's own file holds what it wrote, nothing of ddprun's ({log[:80]!r})")
        require(p.returncode == 124 and "is stuck outside any collective in <module> (hostile.py:" in p.stderr and
                "verdict: rank 1" in p.stderr, f"{case}: rank 1 blamed, exit 124 ({p.returncode}; {p.stderr[-900:]})")
        require("saving a checkpoint" not in p.stderr and took < 40,
                f"{case}: no save taken for the stuck rank's, the report at its bound ({took:.1f} s)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", required=True)
    args = ap.parse_args()
    env = dict(os.environ, PYTHON_EXEC="/usr/bin/python3")
    env.pop("NCCL_ASYNC_ERROR_HANDLING", None)
    env.pop("TORCH_NCCL_ASYNC_ERROR_HANDLING", None)
    with tempfile.TemporaryDirectory() as tmp:
        nccl_variable(args.ddprun, env, tmp)
        unhung_run_completes(args.ddprun, env, tmp)
        hook_off_leaves_heartbeat(args.ddprun, env, tmp)
        sigstop_is_caught(args.ddprun, env, tmp)
        hostile_scripts(args.ddprun, env, tmp)
        exec_restart(args.ddprun, env, tmp)
        sibling_ended(args.ddprun, env, tmp)
    print("all progress hook checks passed")


if __name__ == "__main__":
    main()
