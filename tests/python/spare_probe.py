"""Run by tests/python/warm_spare_torch_test.py under ddprun: attempt 0 waits for the test's go
file (the warm spares are ready by then) and fails; attempt 1 prints what a script can see of
the interpreter it runs in ("FP <json>"), then ends as argv[1] says (rank 0, once every rank has
printed; the others wait to be stopped)."""
import atexit
import faulthandler
import json
import multiprocessing
import os
import resource
import signal
import sys
import time

MARK = "version 1"
# Attempt 0 only makes the restart whose workers are compared: it imports nothing more (a
# cold worker's PyTorch import is most of this test's CPU).
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    go = os.environ["PROBE_GO"]
    while not os.path.exists(go):
        time.sleep(0.01)
    sys.exit(1)

import torch  # noqa: E402  (as a training script does; a spare has imported it already)

try:
    import probe_threads  # noqa: F401,E402  (a module that starts a thread at import: --preload's, warm)
except ImportError:
    pass

# What a spare preloads on purpose, beyond torch: PyTorch 2.x's torch._dynamo (warm only).
preloaded = "torch._dynamo" in sys.modules
try:
    import torch._dynamo  # noqa: F401  (as PyTorch 2.x's first optimizer does; absent in 1.x)
except ImportError:
    pass
# torch.distributed.nn (imported by torch._dynamo) appends a new temporary directory to sys.path.
template_dir = getattr(sys.modules.get("torch.distributed.nn.jit.instantiator"), "INSTANTIATED_TEMPLATE_DIR_PATH", None)

main = sys.modules["__main__"]
loader = getattr(main, "__loader__", None)
spec = getattr(main, "__spec__", None)
per_attempt = {"DDPRUN_HEARTBEAT_FILE", "TORCHELASTIC_ERROR_FILE", "MASTER_PORT"}
per_attempt_b = {os.fsencode(k) for k in per_attempt} | {b"TORCHELASTIC_RUN_ID", b"DDPRUN_JOB_TOKEN"}


def proc(name):
    with open(f"/proc/self/{name}", "rb") as f:
        return f.read()


def umask():
    old = os.umask(0o22)
    os.umask(old)
    return old


environ_block = proc("environ")
fp = {
    "mark": MARK,
    "argv": sys.argv,
    "orig_argv": sys.orig_argv,
    "file": main.__dict__.get("__file__"),
    "name": __name__,
    "spec": None if spec is None else [spec.name, spec.origin],
    "package": main.__dict__.get("__package__"),
    "cached": main.__dict__.get("__cached__"),
    "doc": main.__doc__ is not None,
    "main_keys": sorted(k for k in vars(main) if k.startswith("__")),
    "loader": None if loader is None else [type(loader).__name__, getattr(loader, "name", None), getattr(loader, "path", None)],
    "path": ["<torch template dir>" if p == template_dir else p for p in sys.path],
    "cwd": os.getcwd(),
    "signals": {str(int(s)): repr(signal.getsignal(s)) for s in signal.valid_signals() if signal.getsignal(s) is not None},
    "sigmask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "fds": sorted(os.listdir("/proc/self/fd")),
    "priority": os.getpriority(os.PRIO_PROCESS, 0),
    "thread_priorities": sorted(os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")),
    "pgid_is_pid": os.getpgid(0) == os.getpid(),
    "flags": list(sys.flags),
    "unbuffered": [sys.stdout.write_through, sys.stderr.write_through],
    "env": {k: v for k, v in os.environ.items() if k not in per_attempt},
    "heartbeat_file_set": bool(os.environ.get("DDPRUN_HEARTBEAT_FILE")),
    # What an operator's tools read: /proc's cmdline and environ, as bytes (shown escaped). A warm
    # worker's may end in a run of NULs (docs: without CAP_SYS_RESOURCE): not compared.
    "proc_cmdline": repr(proc("cmdline").rstrip(b"\0")),
    "proc_environ": sorted(repr(kv) for kv in environ_block.split(b"\0") if kv and kv.split(b"=", 1)[0] not in per_attempt_b),
    "umask": umask(),
    "rlimits": {n: resource.getrlimit(getattr(resource, n)) for n in dir(resource) if n.startswith("RLIMIT_")},
    "affinity": sorted(os.sched_getaffinity(0)),
    "torch_threads": [torch.get_num_threads(), torch.get_num_interop_threads()],
    "faulthandler": faulthandler.is_enabled(),
    "mp_start_method": multiprocessing.get_start_method(allow_none=True),
    "atexit_callbacks": atexit._ncallbacks(),
    "threads": len(os.listdir("/proc/self/task")),
}
sys.stdout.write("FP " + json.dumps(fp, sort_keys=True) + "\n")
sys.stdout.write(f"PRELOADED torch._dynamo={preloaded}\n")
sys.stdout.flush()
# Rank 0 ends only once every rank has printed its FP (ddprun stops the others when it ends).
open("%s.fp%s" % (os.environ["PROBE_GO"], os.environ["RANK"]), "w").close()
if os.environ["RANK"] == "0":
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(
            os.path.exists("%s.fp%d" % (os.environ["PROBE_GO"], r)) for r in range(int(os.environ["WORLD_SIZE"]))):
        time.sleep(0.01)
how = sys.argv[1] if len(sys.argv) > 1 else "exit0"
if how != "exit0" and os.environ["LOCAL_RANK"] != "0":
    time.sleep(120)  # stopped by ddprun when rank 0 ends: only rank 0's end is compared
if how == "exit7":
    sys.exit(7)
if how == "raise":
    def deeper():
        raise ValueError("probe failure")
    deeper()
if how == "interrupt":
    raise KeyboardInterrupt
