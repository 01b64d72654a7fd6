#!/usr/bin/python3
"""--preload=auto (docs: Warm spares), with the system's PyTorch: the modules the first attempt's
worker had imported at its first step are what the spare for attempt 2 imports. The script
imports two modules of an installed package directory (not its own folder, not torch):
`autoload`, which records the restart count and pid it was imported with, and `sparebad`, which
refuses to import inside a spare. Attempt 2, run by the spare, finds `autoload` imported before
the script ran (in the spare, under attempt 1's environment); `sparebad` was a warning, and the
spare went on without it (attempt 2 is still warm and imports it itself).

Then the two ways a spare could hand a script another module than a fresh interpreter would:
a project that puts its root on sys.path itself (`tools/train.py`) and imports its own
`datasets` package, with an installed `datasets` on PYTHONPATH: the spare must not preload the
installed one; and a package of the user's on PYTHONPATH edited between the attempts: the rank
starts cold, saying which file changed, and runs the new code.

Usage: preload_auto_torch_test.py --ddprun PATH"""
import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testlib import need_torch  # noqa: E402
import warm_spare_torch_test as ws  # noqa: E402

SCRIPT = r'''
import os, sys, time
import autoload, sparebad
import torch
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.ones(1, 2)).sum().backward()
opt.step()  # the first step: the progress hook reports the modules, then beats
print("AUTO restart=%s imported_at_restart=%s same_pid=%s" % (restart, autoload.RESTART, autoload.PID == os.getpid()), flush=True)
if restart == "0":
    go = os.environ["PROBE_GO"]
    with open(go + ".pid.tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(go + ".pid.tmp", go + ".pid")
    while not os.path.exists(go):
        time.sleep(0.02)
    sys.exit(3)
'''


PROJECT_SCRIPT = r'''
import os, sys, time
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, ROOT)
import datasets, mypkg
import torch
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.ones(1, 2)).sum().backward()
opt.step()
print("PROJECT restart=%s datasets=%s mypkg=%s" % (restart, datasets.WHO, mypkg.VALUE), flush=True)
if restart == "0":
    go = os.environ["PROBE_GO"]
    with open(go + ".pid.tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(go + ".pid.tmp", go + ".pid")
    while not os.path.exists(go):
        time.sleep(0.02)
    sys.exit(3)
'''


def project_layout(ddprun, tmp):
    lib, proj = os.path.join(tmp, "lib2"), os.path.join(tmp, "proj")
    for d in (os.path.join(lib, "datasets"), os.path.join(lib, "mypkg"), os.path.join(proj, "datasets"),
              os.path.join(proj, "tools")):
        os.makedirs(d)
    with open(os.path.join(lib, "datasets", "__init__.py"), "w") as f:
        f.write("WHO = 'installed'\n")
    with open(os.path.join(proj, "datasets", "__init__.py"), "w") as f:
        f.write("WHO = 'project'\n")
    init = os.path.join(lib, "mypkg", "__init__.py")
    with open(init, "w") as f:
        f.write("VALUE = 1\n")
    with open(os.path.join(proj, "tools", "train.py"), "w") as f:
        f.write(PROJECT_SCRIPT)

    def edit():
        with open(init, "w") as f:
            f.write("VALUE = 'edited'\n")

    for edited in (False, True):
        rc, lines = ws.launch(ddprun, ["--preload=auto", sys.executable, "-u", "tools/train.py"], proj,
                              os.path.join(proj, "go"), True, nproc=1, timeout=120, on_ready=edit if edited else None,
                              env_extra={"PYTHONPATH": lib})
        text = "\n".join(lines)
        ws.check(rc == 0, f"project layout: the job recovers and ends 0 (exit {rc})")
        if not edited:
            ws.check("PROJECT restart=0 datasets=project mypkg=1" in text, "project layout: attempt 1 has its own datasets")
            ws.check("PROJECT restart=1 datasets=project mypkg=1" in text and "(1 warm)" in text,
                     "project layout: attempt 2 is warm and has the project's datasets, not the installed one")
        else:
            ws.check("PROJECT restart=1 datasets=project mypkg=edited" in text,
                     "an edited package of the user's on PYTHONPATH: attempt 2 runs the new code")
            ws.check(f"starts cold: the module file {init} changed" in text,
                     "an edited package: the rank starts cold, naming the file")
        if ws.FAILURES:
            ws.show(lines)


EDIT_SCRIPT = r'''
import os, sys, time
import mypkg, slowmod
import torch
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
print("EDIT restart=%s mypkg=%s set_at_import=%s" % (restart, mypkg.VALUE, os.environ.get("SET_AT_IMPORT")), flush=True)
if restart == "0":
    go = os.environ["PROBE_GO"]
    with open(go + ".pid.tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(go + ".pid.tmp", go + ".pid")
    while not os.path.exists(go):
        time.sleep(0.02)
    sys.exit(3)
'''


def edited_before_ready(ddprun, tmp):
    """A package edited after the spare imported it but before the spare is ready (it still
    imports another module at the restart): ddprun had no list of its files yet; the spare finds
    the edit itself and becomes a fresh interpreter. And a variable a preloaded module sets at
    import is in the warm worker's environment, as in a fresh one that imports it."""
    import threading

    lib, job = os.path.join(tmp, "lib3"), os.path.join(tmp, "job3")
    os.makedirs(os.path.join(lib, "mypkg"))
    os.makedirs(job)
    init = os.path.join(lib, "mypkg", "__init__.py")
    with open(init, "w") as f:
        f.write("import os\nos.environ['SET_AT_IMPORT'] = 'yes'\nVALUE = 1\n")
    started, release = os.path.join(tmp, "slowmod-started"), os.path.join(tmp, "slowmod-release")
    with open(os.path.join(lib, "slowmod.py"), "w") as f:
        f.write("import os, sys, time\nif sys.argv[0].endswith('_ddprun_spare.py'):\n"
                f"    open({started!r}, 'w').close()\n"
                f"    while not os.path.exists({release!r}):\n        time.sleep(0.02)\n")
    with open(os.path.join(job, "train.py"), "w") as f:
        f.write(EDIT_SCRIPT)
    go = os.path.join(job, "go")

    def edit_then_crash():
        deadline = time.monotonic() + 200
        while not (os.path.exists(started) and os.path.exists(go + ".pid")) and time.monotonic() < deadline:
            time.sleep(0.02)
        with open(init, "w") as f:
            f.write("import os\nos.environ['SET_AT_IMPORT'] = 'yes'\nVALUE = 'edited'\n")
        with open(go + ".pid") as f:
            pid = f.read()
        open(go, "w").close()
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.02)  # the worker exits 3, and is reaped: the restart hands the spare the attempt
        time.sleep(0.3)  # (within milliseconds) before its imports end
        open(release, "w").close()

    t = threading.Thread(target=edit_then_crash, daemon=True)
    t.start()
    rc, lines = ws.launch(ddprun, ["--preload=mypkg,slowmod", sys.executable, "-u", "train.py"], job, go, True,
                          nproc=1, timeout=240, env_extra={"PYTHONPATH": lib})
    text = "\n".join(lines)
    ws.check(rc == 0, f"edited before the spare is ready: the job recovers and ends 0 (exit {rc})")
    ws.check("EDIT restart=0 mypkg=1 set_at_import=yes" in text, "attempt 1 had the package as it was")
    ws.check("EDIT restart=1 mypkg=edited set_at_import=yes" in text,
             "a package edited after its spare imported it, before the spare was ready: attempt 2 runs the new "
             "code, and has the variable its import sets")
    ws.check(f"local rank 0 starts cold: the module file {init} changed after its warm spare imported it (found by "
             "its warm spare once handed the attempt" in text, "ddprun says why that rank started cold after all")
    if ws.FAILURES:
        ws.show(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", required=True)
    a = ap.parse_args()
    need_torch()
    tmp = tempfile.mkdtemp(prefix="ddprun-preload-auto-")
    try:
        lib, job = os.path.join(tmp, "lib"), os.path.join(tmp, "job")
        os.makedirs(lib)
        os.makedirs(job)
        with open(os.path.join(lib, "autoload.py"), "w") as f:
            f.write("import os\nRESTART = os.environ.get('TORCHELASTIC_RESTART_COUNT')\nPID = os.getpid()\n")
        with open(os.path.join(lib, "sparebad.py"), "w") as f:
            f.write("import sys\nif sys.argv[0].endswith('_ddprun_spare.py'):\n"
                    "    raise RuntimeError('sparebad refuses to be preloaded')\n")
        with open(os.path.join(job, "train.py"), "w") as f:
            f.write(SCRIPT)
        rc, lines = ws.launch(a.ddprun, ["--preload=auto", sys.executable, "-u", "train.py"], job,
                              os.path.join(job, "go"), True, nproc=1, timeout=120, env_extra={"PYTHONPATH": lib})
        text = "\n".join(lines)
        ws.check(rc == 0, f"the job recovers from attempt 1's exit 3 and ends 0 (exit {rc})")
        ws.check("AUTO restart=1 imported_at_restart=0 same_pid=True" in text,
                 "attempt 2's `autoload` was imported by its spare under attempt 1's environment (--preload=auto)")
        ws.check("could not import sparebad" in text, "a reported module that fails to import in the spare: a warning")
        ws.check("(1 warm)" in text, "the spare went on without it: attempt 2 started warm, and imported it itself")
        if ws.FAILURES:
            ws.show(lines)
        project_layout(a.ddprun, tmp)
        edited_before_ready(a.ddprun, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"preload_auto_torch_test: {ws.PASSED[0]} passed, {len(ws.FAILURES)} failed")
    sys.exit(1 if ws.FAILURES or not ws.PASSED[0] else 0)


if __name__ == "__main__":
    main()
