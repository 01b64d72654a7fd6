#!/usr/bin/python3
"""In-memory state (docs/usage.md: In-memory state), with the system's PyTorch and gloo: a job
that saves with ddprun.state.save every step and loses rank 1 resumes at the step it failed,
warm and cold, and ends with the parameters of an uninterrupted run; a job lost whole resumes
from the files ddprun.state.persist() had the agent write; and the bad days: a budget too small,
no state (as under torchrun), a worker killed mid-copy, a 64 MB /dev/shm, another user at the
state's descriptors, a full disk under persist().

Usage: state_torch_test.py --ddprun PATH (resume | persist | bad_days | root_days)
root_days needs root, unshare and setpriv: it skips without them (fails under CI=true)."""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testlib import FAILURES, check, need_torch, run, show, skip  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "state_worker.py")


def ddprun(path, nproc, env_extra, flags=(), prefix=(), **kw):
    cmd = list(prefix) + [path, "--standalone", "--nproc_per_node", str(nproc), "--max_restarts", "1", *flags,
                          sys.executable, WORKER]
    return run(cmd, env_extra, **kw)


def found(lines, pattern):
    return [m for m in (re.search(pattern, l) for l in lines) if m]


def finals(lines):
    return {m.group(1): m.group(2) for m in found(lines, r"\[default(\d)\]:FINAL (\w+)")}


def resume(path):
    rc, plain = ddprun(path, 2, {"STATE_MODE": "none"})
    check(rc == 0 and len(finals(plain)) == 2, f"the uninterrupted run ends (rc {rc})")
    want = set(finals(plain).values())
    check(len(want) == 1, "its ranks end with the same parameters")
    tmp = tempfile.mkdtemp(prefix="state_test_")
    go = os.path.join(tmp, "go")
    ready = set()

    def on_line(line):
        m = re.search(r"warm spare for local rank (\d+) ready", line)
        if m:
            ready.add(m.group(1))
            if len(ready) == 2:
                open(go, "w").close()

    plain_bytes = {m.group(1): int(m.group(2)) for m in found(plain, r"\[default(\d)\]:STALL .* bytes=(\d+)")}
    for warm, replicated in (("1", ""), ("0", ""), ("0", "1")):
        env = {"STATE_MODE": "crash", "STATE_CRASH_STEP": "4", "STATE_GO": go if warm == "1" else None,
               "STATE_REPLICATED": replicated or None}
        try:
            rc, lines = ddprun(path, 2, env, ["--warm_spares", warm], on_line=on_line)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        what = ("warm" if warm == "1" else "cold") + (", the model and optimizer saved as replicated" if replicated else "")
        if replicated:
            # Each rank copies half of the model's and the optimizer's bytes (to within 64-byte bounds).
            sizes = {m.group(1): (int(m.group(2)), int(m.group(3)))
                     for m in found(lines, r"\[default(\d)\]:STALL .* bytes=(\d+) model_and_optimizer=(\d+)")}
            check(len(sizes) == 2 and all(abs(plain_bytes.get(r, 0) - b - shared / 2) < 4096
                                          for r, (b, shared) in sizes.items()),
                  f"{what}: each rank's save holds half of the replicated bytes: {sizes} vs {plain_bytes} unshared")
        ok = rc == 0
        check(ok, f"{what}: the job with rank 1 lost after step 4 ends (rc {rc})")
        resumed = found(lines, r"\[default(\d)\]:RESUMED (\d+) steps=\[(.*)\] extra=([\d.]+)")
        check(sorted((m.group(1), m.group(2), m.group(4)) for m in resumed) == [("0", "4", "4.0"), ("1", "4", "4.0")],
              f"{what}: both ranks resume at step 4, the last step committed: {[m.group(0) for m in resumed]}")
        check(set(finals(lines).values()) == want and len(finals(lines)) == 2,
              f"{what}: parameters bit-identical to the uninterrupted run's ({finals(lines)} vs {want})")
        if warm == "1":
            check(any(re.search(r"restarted .*\(2 warm\)", l) for l in lines), "warm: attempt 1 ran in warm spares")
        if FAILURES:
            show(lines)
            return


def persist(path):
    tmp = tempfile.mkdtemp(prefix="state_test_")
    try:
        env = {"STATE_MODE": "persist", "STATE_CRASH_STEP": "7", "STATE_DIR": tmp}
        cmd = [path, "--standalone", "--nproc_per_node", "2", "--max_restarts", "0", sys.executable, WORKER]
        rc, lost = run(cmd, env)
        files = sorted(f for f in os.listdir(tmp))
        modes = {f: oct(os.stat(os.path.join(tmp, f)).st_mode & 0o777) for f in files}
        # Each rank asked after steps 2 and 5 and went on: its saves of steps 6 and 7 leave step 5 alone
        # until the agent has copied it, and the file holds the step asked for.
        check(rc != 0 and len(found(lost, r"LOST after step 7")) == 2 and files == ["rank0.state", "rank1.state"]
              and set(modes.values()) == {"0o600"},
              f"the whole job lost after step 7 leaves each rank's file, its user's only (rc {rc}): {modes}")
        # One rank's file torn (cut short): that rank holds nothing from it, and every rank
        # starts over together, none left waiting in a collective.
        good = os.path.join(tmp, "rank1.good")
        shutil.copy(os.path.join(tmp, "rank1.state"), good)
        os.truncate(os.path.join(tmp, "rank1.state"), 5000)
        rc, torn = run(cmd, {**env, "STATE_RESUMING": "1"})
        want = set(finals(torn).values())  # it starts over and loses nothing: the uninterrupted run
        check(rc == 0 and sorted(m.group(1) for m in found(torn, r"FROM_FILE (\S+)")) == ["None", "None"]
              and any("is not a state file" in l for l in torn) and len(finals(torn)) == 2 and len(want) == 1,
              f"a torn file on rank 1: both ranks start over together and end (rc {rc}), as an uninterrupted run")
        os.replace(good, os.path.join(tmp, "rank1.state"))
        rc, lines = run(cmd, {**env, "STATE_RESUMING": "1"})
        check(rc == 0 and sorted(m.group(1) for m in found(lines, r"FROM_FILE (\S+)")) == ["5", "5"]
              and len(found(lines, r"RESUMED 5 ")) == 2,
              f"started again, both ranks load step 5 from their files (rc {rc}): {found(lines, 'FROM_FILE') and [l for l in lines if 'FROM_FILE' in l or 'RESUMED' in l]}")
        check(set(finals(lines).values()) == want and len(finals(lines)) == 2,
              f"... and end with the uninterrupted run's parameters ({finals(lines)} vs {want})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if FAILURES:
        show(lost + lines)


def bad_days(path):
    # A budget too small: the save raises a clear error, caught; the job goes on.
    rc, lines = ddprun(path, 1, {"STATE_MODE": "too_large", "STATE_STEPS": "4"}, ["--state_memory", "24M"])
    caught = found(lines, r"CAUGHT StateTooLarge: (.*)")
    check(rc == 0 and caught and "--state_memory" in caught[0].group(1) and "MiB" in caught[0].group(1),
          f"a save over the budget raises StateTooLarge naming the sizes and --state_memory, and the job ends (rc {rc}): "
          f"{caught[0].group(1) if caught else None}")
    uninterrupted = set(finals(lines).values())
    if FAILURES:
        show(lines)
    # A flag value that is no size.
    rc, lines = run([path, "--standalone", "--state_memory", "lots", "/bin/true"], {})
    check(rc != 0 and any("--state_memory must be a size" in l for l in lines), f"--state_memory=lots is refused: {lines[-1:]}")
    # Killed halfway through the copy of step 3: attempt 1 resumes from step 2, whole.
    rc, lines = ddprun(path, 1, {"STATE_MODE": "mid_copy", "STATE_CRASH_STEP": "3", "STATE_STEPS": "4"},
                       ["--state_memory", "24M"])
    resumed = found(lines, r"RESUMED (\d+) steps=\[(.*)\] extra=([\d.]+)")
    check(rc == 0 and [(m.group(1), m.group(3)) for m in resumed] == [("2", "2.0")],
          f"a worker killed mid-copy of step 3: the next resumes from step 2's state (rc {rc}): "
          f"{[m.group(0) for m in resumed]}")
    check(set(finals(lines).values()) == uninterrupted and uninterrupted,
          "... and ends with the uninterrupted run's parameters")
    if FAILURES:
        show(lines)
    # No state (as under torchrun): load() is None, one warning, the script runs.
    site = os.path.join(os.path.dirname(os.path.dirname(path)), "share", "ddprun", "python")
    tmp = tempfile.mkdtemp(prefix="state_test_")
    try:
        env = {"PYTHONPATH": site, "RANK": "0", "WORLD_SIZE": "1", "STATE_MODE": "none", "STATE_STEPS": "3",
               "DDPRUN_STATE_FD": None, "DDPRUN_STATE_BYTES": None}
        rc, lines = run([sys.executable, "-c", "import torch.distributed as d, runpy, sys; "
                         f"d.init_process_group('gloo', init_method='file://{tmp}/pg', rank=0, world_size=1); "
                         "d.init_process_group = lambda *a, **k: None; "
                         f"runpy.run_path('{WORKER}', run_name='__main__')"], env)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    warned = [l for l in lines if "ddprun.state:" in l and "Warning" in l]
    check(rc == 0 and len(warned) == 1 and not found(lines, "RESUMED") and finals(lines) == {} and found(lines, "FINAL"),
          f"without ddprun: one warning, no state loaded, the script runs (rc {rc}): {warned}")
    if FAILURES:
        show(lines)


def root_days(path):
    if os.getuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv"):
        skip("needs root, unshare and setpriv")
    # /dev/shm of 64 MB (Docker's default): a 96 MB state is saved and loaded all the same.
    script = (f"mount -t tmpfs -o size=64m tmpfs /dev/shm && df -m /dev/shm | tail -1 && exec {path} --standalone "
              f"--nproc_per_node 1 --max_restarts 1 --state_memory 400M {sys.executable} {WORKER}")
    rc, lines = run(["unshare", "-m", "sh", "-c", script],
                    {"STATE_MODE": "mid_copy", "STATE_CRASH_STEP": "2", "STATE_STEPS": "3", "STATE_MB": "96"})
    resumed = found(lines, r"RESUMED (\d+) steps=\[(.*)\] extra=([\d.]+)")
    check(rc == 0 and any(re.search(r"tmpfs\s+64\s", l) for l in lines) and [(m.group(1), m.group(3)) for m in resumed] == [("1", "1.0")],
          f"/dev/shm of 64 MB: 96 MB of state saved and resumed (rc {rc}): {[m.group(0) for m in resumed]}")
    if FAILURES:
        show(lines)
    # A full disk under persist(): the second file does not fit beside the first; the error says
    # so, the first file is kept whole and loads.
    script = (f"mount -t tmpfs -o size=2m tmpfs /mnt && exec {path} --standalone --nproc_per_node 1 "
              f"--max_restarts 0 {sys.executable} {WORKER}")
    rc, lines = run(["unshare", "-m", "sh", "-c", script],
                    {"STATE_MODE": "persist_full", "STATE_STEPS": "3", "STATE_MB": "1", "STATE_DIR": "/mnt"})
    failed = found(lines, r"PERSIST_FAILED (.*)")
    check(rc == 0 and found(lines, r"PERSISTED 0$") and failed and "No space left on device" in failed[0].group(1)
          and found(lines, r"FILE_HOLDS 0 mode=0o600"),
          f"a full disk: persist raises saying so, the earlier file is kept and loads (rc {rc}): "
          f"{[l for l in lines if 'PERSIST' in l or 'FILE_HOLDS' in l]}")
    if FAILURES:
        show(lines)
    # Another user at the worker's and the agent's descriptors of the state area.
    tmp = tempfile.mkdtemp(prefix="state_test_")
    go = os.path.join(tmp, "go")
    tried = []

    def on_line(line):
        m = re.search(r"PIDS (\d+) (\d+)", line)
        if not m:
            return
        worker, agent = m.group(1), m.group(2)
        targets = [f"/proc/{worker}/fd/5"]
        for fd in os.listdir(f"/proc/{agent}/fd"):
            try:
                if os.readlink(f"/proc/{agent}/fd/{fd}").startswith("/memfd:ddprun-state-"):
                    targets.append(f"/proc/{agent}/fd/{fd}")
            except OSError:
                pass
        for t in targets:
            for how in ("r", "r+"):
                r = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable,
                                    "-c", f"open('{t}', '{how}b').read(1); print('OPENED')"],
                                   capture_output=True, text=True)
                tried.append((t, how, r.returncode, "OPENED" in r.stdout, r.stderr.strip().splitlines()[-1:]))
        open(go, "w").close()

    try:
        rc, lines = ddprun(path, 1, {"STATE_MODE": "hold", "STATE_STEPS": "2", "STATE_GO": go}, on_line=on_line)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    check(rc == 0 and len(tried) >= 4 and not any(opened for _t, _h, _rc, opened, _e in tried),
          f"another user opens neither the worker's nor the agent's descriptor of the state, to read or write: {tried}")
    if FAILURES:
        show(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("cases", nargs="+", choices=["resume", "persist", "bad_days", "root_days"])
    a = ap.parse_args()
    need_torch()
    for case in a.cases:
        {"resume": resume, "persist": persist, "bad_days": bad_days, "root_days": root_days}[case](os.path.abspath(a.ddprun))
    print(f"{len(FAILURES)} failed")
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
