#!/usr/bin/python3
"""Warm spares (docs: Warm spares), with the system's PyTorch: a script run by a warm spare sees
what it sees in a fresh interpreter (argv, __main__, __file__, sys.path, -m, signals, exit codes,
tracebacks, KeyboardInterrupt), a crash-and-resume job ends with the parameters of an
uninterrupted run, and the cases that must start cold do: an edited script, a spare killed while
it waits; a --preload that fails to import is a warning.

Usage: warm_spare_torch_test.py --ddprun PATH"""
import argparse
import glob
import json
import os
import re
import shutil
import signal
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testlib import FAILURES, PASSED, check, need_torch, run, show  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
# Per job, not per interpreter: may differ between the warm and the cold run.
PER_JOB = {"TORCHELASTIC_RUN_ID", "DDPRUN_JOB_TOKEN"}


def launch(ddprun, args, cwd, go, warm, nproc=2, on_ready=None, timeout=240, env_extra=None, prefix=()):
    """ddprun ARGS in `cwd` (after `prefix`: setpriv, for another user); `go` is created once every
    warm spare is ready (at once when cold)."""
    env = dict(env_extra or {}, PYTHON_EXEC=sys.executable, PROBE_GO=go)
    cmd = list(prefix) + [ddprun, "--standalone", "--nproc_per_node", str(nproc), "--max_restarts", "1", "--warm_spares", "1" if warm else "0"] + args
    for old in glob.glob(glob.escape(go) + ".fp*"):  # spare_probe.py's: which ranks have printed
        os.unlink(old)
    ready = set()
    if not warm:
        open(go, "w").close()

    def on_line(line):
        m = re.search(r"warm spare for local rank (\d+) ready", line)
        if m and warm:
            ready.add(int(m.group(1)))
            if len(ready) == nproc and not os.path.exists(go):
                if on_ready:
                    on_ready()
                open(go, "w").close()

    rc, lines = run(cmd, env, timeout=timeout, on_line=on_line, cwd=cwd)
    if os.path.exists(go):
        os.unlink(go)
    return rc, lines


def fingerprints(lines):
    out = {}
    for line in lines:
        m = re.match(r"\[default(\d+)\]:FP (.*)$", line)
        if m:
            fp = json.loads(m.group(2))
            fp["env"] = {k: v for k, v in fp["env"].items() if k not in PER_JOB}
            out[int(m.group(1))] = fp
    return out


def traceback_of(lines, rank):
    prefix = f"[default{rank}]:"
    return [l[len(prefix):] for l in lines if l.startswith(prefix) and not l[len(prefix):].startswith(("FP ", "PRELOADED "))]


def dynamo_preloaded(warm, cold):
    """PyTorch 2.x makes a script's first optimizer import torch._dynamo (1 s): a spare has it
    already, a fresh worker not. PyTorch 1.x has none: its spares say nothing about it."""
    import importlib.util

    seen = {w: sorted(re.findall(r"^\[default\d\]:PRELOADED torch._dynamo=(\w+)$", "\n".join(lines), re.M))
            for w, lines in (("warm", warm), ("cold", cold))}
    if importlib.util.find_spec("torch._dynamo") is not None:
        check(seen == {"warm": ["True", "True"], "cold": ["False", "False"]},
              f"PyTorch 2.x: torch._dynamo preloaded by the warm spares only: {seen}")
    else:
        check(seen["warm"] == ["False", "False"] and not any("could not import torch._dynamo" in l for l in warm),
              f"PyTorch 1.x: no torch._dynamo, and no warning about it: {seen}")


def same_as_fresh(ddprun, tmp, args, what, env_extra=None, nproc=2):
    """The job run warm and cold: what the script sees, its output and the exit code are the same.
    Two workers where a rank other than 0 matters (its end: stopped by ddprun), else one (each
    worker and its spare import PyTorch: most of this test's time)."""
    go = os.path.join(tmp, "go")
    warm_rc, warm = launch(ddprun, args, tmp, go, warm=True, env_extra=env_extra, nproc=nproc)
    cold_rc, cold = launch(ddprun, args, tmp, go, warm=False, env_extra=env_extra, nproc=nproc)
    used = any(re.search(rf"restarted .*\({nproc} warm\)", l) for l in warm)
    check(used, f"{what}: every worker of attempt 1 was a warm spare")
    if not used:
        show(warm)
    fw, fc = fingerprints(warm), fingerprints(cold)
    ranks = list(range(nproc))
    check(sorted(fw) == ranks and sorted(fc) == ranks, f"{what}: both runs printed what the script sees")
    for rank in sorted(set(fw) & set(fc)):
        diff = sorted(k for k in fc[rank] if fw[rank].get(k) != fc[rank][k])
        envs = (fw[rank].get("env", {}), fc[rank]["env"])
        env_diff = sorted(k for k in set(envs[0]) | set(envs[1]) if envs[0].get(k) != envs[1].get(k))
        check(not diff, f"{what}: rank {rank} sees the same interpreter, warm and cold" +
              (": " + "; ".join(f"{k}: warm {fw[rank].get(k)!r} cold {fc[rank][k]!r}" for k in diff if k != "env") +
               f" env: {[(k, envs[0].get(k), envs[1].get(k)) for k in env_diff]}" if diff else ""))
    check(warm_rc == cold_rc, f"{what}: ddprun's exit code is the same ({warm_rc} warm, {cold_rc} cold)")
    for rank in ranks:
        tw, tc = traceback_of(warm, rank), traceback_of(cold, rank)
        check(tw == tc, f"{what}: rank {rank}'s stderr/stdout is the same" + ("" if tw == tc else f": warm {tw} cold {tc}"))
    return warm, cold


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", required=True)
    a = ap.parse_args()
    need_torch()
    tmp = tempfile.mkdtemp(prefix="ddprun-spare-test-")
    try:
        shutil.copy(os.path.join(HERE, "spare_probe.py"), tmp)
        # A script, its traceback and exit code 1; -m, exit code 7; KeyboardInterrupt (SIGINT).
        dynamo_preloaded(*same_as_fresh(a.ddprun, tmp, ["spare_probe.py", "raise"], "script, uncaught exception"))
        same_as_fresh(a.ddprun, tmp, ["-m", "spare_probe", "exit7"], "-m module, sys.exit(7)", nproc=1)
        warm, _ = same_as_fresh(a.ddprun, tmp, ["spare_probe.py", "interrupt"], "KeyboardInterrupt", nproc=1)
        check(any("SIGINT" in l for l in warm), "KeyboardInterrupt: the warm worker died of SIGINT, as a fresh one does")
        unusual_interpreters(a.ddprun, tmp)
        unprivileged(a.ddprun)
        cold_cases(a.ddprun, tmp)
        resume_checksum(a.ddprun, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{PASSED[0]} passed, {len(FAILURES)} failed")
    sys.exit(1 if FAILURES else 0)


def unusual_interpreters(ddprun, tmp):
    """What a spare must carry over exactly, each seen differing before: an argument and a
    variable that are not UTF-8 (bytes, legal on Linux); variables that interpreter start-up code
    (a sitecustomize) sets and removes; a thread that a preloaded module starts at import (at the
    worker's priority, not the import thread's nice 19); /proc's cmdline and environ; with
    PYTHONSAFEPATH (no script folder on sys.path, ddprun's hook folder kept). The other cases
    compare sys.path with the script's folder on it."""
    site = os.path.join(tmp, "site")
    os.makedirs(site, exist_ok=True)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write("import os\nos.environ['PROBE_FROM_STARTUP'] = 'set by start-up code'\n"
                "os.environ.pop('PROBE_REMOVED_AT_STARTUP', None)\n")
    with open(os.path.join(site, "probe_threads.py"), "w") as f:
        f.write("import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n")
    env = {"PYTHONPATH": site, "PROBE_LATIN1": "caf\udce9", "PROBE_REMOVED_AT_STARTUP": "1", "PYTHONSAFEPATH": "1"}
    args = ["--preload", "probe_threads", "spare_probe.py", "exit0", "caf\udce9"]
    same_as_fresh(ddprun, tmp, args, "bytes in argv and environment, start-up code, a thread started at import, "
                  "PYTHONSAFEPATH=1", env, nproc=1)


def unprivileged(ddprun):
    """As another user, without CAP_SYS_NICE, a nice value only goes up: a spare whose imports
    started a thread (at the import thread's nice 19) cannot be made equal to a fresh worker, so
    its rank starts cold, saying why; a spare that imported torch alone is still used."""
    if os.getuid() != 0 or not shutil.which("setpriv"):
        check(os.environ.get("CI") not in ("true", "1"), "as another user: needs root and setpriv (CI has both)")
        return
    tmp = tempfile.mkdtemp(prefix="ddprun-spare-nobody-")
    try:
        os.chmod(tmp, 0o777)
        shutil.copy(os.path.join(HERE, "spare_probe.py"), tmp)
        with open(os.path.join(tmp, "probe_threads.py"), "w") as f:
            f.write("import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n")
        go = os.path.join(tmp, "go")
        nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
        env = {"PYTHONPATH": tmp, "HOME": tmp}
        rc, lines = launch(ddprun, ["--preload", "probe_threads", "spare_probe.py", "exit0"], tmp, go, warm=True,
                           env_extra=env, prefix=nobody)
        check(rc == 0 and sum("starts cold: its warm spare is ready but a thread of it runs at nice 19" in l
                              for l in lines) == 2, "as nobody, a spare holding a thread at nice 19: its rank starts cold")
        if rc != 0 or not any("starts cold" in l for l in lines):
            show(lines)
        rc, lines = launch(ddprun, ["spare_probe.py", "exit0"], tmp, go, warm=True, env_extra=env, prefix=nobody)
        check(rc == 0 and any(re.search(r"restarted .*\(2 warm\)", l) for l in lines),
              "as nobody, spares that imported torch alone are used")
        if rc != 0:
            show(lines)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def spare_pid(local_rank, go):
    """The warm spare of `local_rank` of this test's job (its environment names our go file)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"_ddprun_spare.py" not in f.read():
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if f"PROBE_GO={go}".encode() in env and f"LOCAL_RANK={local_rank}".encode() in env:
            return int(pid)
    return None


def cold_cases(ddprun, tmp):
    go = os.path.join(tmp, "go")
    script = os.path.join(tmp, "spare_probe.py")

    def edit():
        with open(script) as f:
            text = f.read()
        with open(script, "w") as f:
            f.write(text.replace('MARK = "version 1"', 'MARK = "version 2"'))

    rc, lines = launch(ddprun, ["spare_probe.py"], tmp, go, warm=True, on_ready=edit)
    fp = fingerprints(lines)
    check(rc == 0 and sum("starts cold: the script spare_probe.py was edited" in l for l in lines) == 2,
          "a script edited between attempts: both ranks start cold")
    check([fp.get(r, {}).get("mark") for r in (0, 1)] == ["version 2", "version 2"],
          "a script edited between attempts: attempt 1 runs the new text")
    if rc != 0:
        show(lines)
    edit_back = open(script).read().replace('MARK = "version 2"', 'MARK = "version 1"')
    with open(script, "w") as f:
        f.write(edit_back)

    def kill_spare_1():
        # Killed just before attempt 0 ends: at the hand-over it may still be dying (no longer
        # running, its descriptors still open), which ddprun must tell from a live spare too.
        pid = spare_pid(1, go)
        check(pid is not None, "the warm spare of local rank 1 is found")
        if pid:
            os.kill(pid, signal.SIGKILL)

    rc, lines = launch(ddprun, ["--preload", "ddprun_no_such_module", "spare_probe.py"], tmp, go, warm=True,
                       on_ready=kill_spare_1)
    check(rc == 0, "a spare killed while it waits, a --preload that fails: the job still succeeds")
    check(sum("could not import ddprun_no_such_module" in l for l in lines) == 2,
          "--preload of a module that fails to import: one warning a spare")
    check(any("local rank 1 starts cold: its warm spare died while it waited" in l for l in lines),
          "a spare killed while it waits: its rank starts cold")
    check(any(re.search(r"restarted .*\(1 warm, 1 cold\)", l) for l in lines),
          "a spare killed while it waits: the other rank's spare (without the failed module) is used")
    if rc != 0:
        show(lines)


def resume_checksum(ddprun, tmp):
    go = os.path.join(tmp, "go")
    job = os.path.join(REPO, "bench", "recovery_job.py")
    results = {}
    for name, crash, warm in (("uninterrupted", 1000, False), ("crash and resume, warm", 10, True)):
        ckpt = os.path.join(tmp, "ckpt-" + name.split()[0])
        os.makedirs(ckpt)
        rc, lines = launch(ddprun, [job, "--steps", "20", "--crash_step", str(crash), "--ckpt", ckpt, "--go", go],
                           tmp, go, warm=warm)
        results[name] = {int(m.group(1)): m.group(2) for l in lines
                         for m in [re.search(r"RESULT rank=(\d+) world=2 attempt=\d+ checksum=(\S+)", l)] if m}
        check(rc == 0 and len(results[name]) == 2, f"{name}: both ranks finished")
        if rc != 0:
            show(lines)
        if warm:
            check(any(re.search(r"restarted .*\(2 warm\)", l) for l in lines), f"{name}: attempt 1 ran on warm spares")
    check(results["uninterrupted"] == results["crash and resume, warm"] and len(results["uninterrupted"]) == 2,
          f"crash and resume with warm spares ends with the parameters of an uninterrupted run: {results}")


if __name__ == "__main__":
    main()
