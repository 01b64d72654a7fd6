"""ddprun's start-up module for Python workers (README: "Hangs").

ddprun puts this directory first on each worker's PYTHONPATH, so Python imports this file at
start-up as `sitecustomize`. It imports nothing heavy: a hook on the import system waits for
PyTorch, and then

1. beats for ddprun's hang watch (README: "Hangs"), on unmodified scripts, in
   DDPRUN_HEARTBEAT_FILE: after every optimizer step it writes the number of steps done ("12\n")
   into the file, through torch.optim.optimizer.register_optimizer_step_post_hook (PyTorch 2.0
   and later); PyTorch 1.13 has no such hook, but every optimizer's step() calls
   Optimizer._optimizer_step_code() when it is done (the profiler's entry point), which is
   wrapped instead. After the first step, each batch a DataLoader hands out and (PyTorch 1.x: a
   global forward pre-hook; 2.x would warn under torch.compile) each forward pass of any module
   touches the file, at most once a second, so an evaluation loop without optimizer steps is
   progress; while torch.save runs, the file says "12 save" and is touched every 2 s, so the
   other ranks, waiting for this one in a collective, are not taken for hung. One process beats
   in a file, the one named in HEARTBEAT.pid (_owns), not a Python child that inherits the variable;
2. registers faulthandler on DDPRUN_STACK_SIGNAL (a real-time signal), writing every thread's
   traceback to HEARTBEAT.stack: ddprun reads a hung worker's Python stack without ending it,
   even while a thread spins holding the GIL (faulthandler writes from its signal handler);
3. under PyTorch 1.x, sets NCCL_ASYNC_ERROR_HANDLING (the only name 1.x reads) from
   TORCH_NCCL_ASYNC_ERROR_HANDLING: ddprun sets only the 2.x name, since 2.x warns on every rank
   about the 1.x one.

Then it runs the sitecustomize it hides (the next one on sys.path), if there is one.
`ddprun --no_progress_hook` leaves it out.

One per process: a second copy of this file on sys.path (a ddprun of another install run inside
a worker, or this directory reached through a symbolic link) is recognised by _MARKER and by
its real path, and skipped; the user's own sitecustomize runs exactly once.
"""
import os
import sys
import time

_MARKER = "ddprun-progress-hook-1"  # found in the first 4 KiB of every copy of this file
_STATE = "_ddprun_progress_hook"  # on sys: the real paths of the hook directories seen so far


def _report_modules(heartbeat):
    """--preload=auto: the modules this worker has imported at its first step and their files
    (HEARTBEAT.modules, "NAME<tab>FILE" a line, written before the first beat), for the next
    attempt's spares: they import the top-level ones that they find in the same files
    (_ddprun_spare.py), and check the others against what they hold."""
    lines = []
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__file__", None)
        if isinstance(where, str) and "\n" not in where and "\t" not in name:
            lines.append(os.fsencode(name) + b"\t" + os.fsencode(where) + b"\n")
    try:
        with open(heartbeat + ".modules.tmp", "wb") as f:
            f.write(b"".join(lines))
        os.replace(heartbeat + ".modules.tmp", heartbeat + ".modules")
    except OSError:
        pass


class _Beat:
    """This process's heartbeat file (DDPRUN_HEARTBEAT_FILE, read at each beat: a warm spare
    imports torch before it knows its file), the steps done in this attempt, the last beat."""

    path = None
    fd = -1
    pid = -1  # the process that opened fd
    file_id = None  # (st_dev, st_ino) of the file fd was opened on
    steps = 0
    last = 0.0
    stack_fd = -1  # faulthandler's file (DDPRUN_STACK_SIGNAL)
    stack_id = None
    forked = False  # a fork of the process that beats (a DataLoader's or a Pool's worker): never beats
    owner = False  # this process is the one that beats (_owns), as of HEARTBEAT.pid's `owner_key`
    owner_key = None


def _same_file(fd, file_id):
    """Whether `fd` is still open on the file `file_id` names: a script may close every descriptor
    it inherited (os.closerange), and the number then names a file of its own, never to be written."""
    try:
        st = os.fstat(fd)
        return (st.st_dev, st.st_ino) == file_id
    except OSError:
        return False


def _beat_file():
    if _Beat.forked:
        return -1
    path = os.environ.get("DDPRUN_HEARTBEAT_FILE")
    if path != _Beat.path or os.getpid() != _Beat.pid:  # a new attempt: steps from 0
        _Beat.path, _Beat.fd, _Beat.steps, _Beat.pid = path, _reopen(path, _Beat.fd), 0, os.getpid()
    elif (_Beat.fd >= 0 and not _same_file(_Beat.fd, _Beat.file_id)) or \
            (_Beat.stack_fd >= 0 and not _same_file(_Beat.stack_fd, _Beat.stack_id)):
        _Beat.fd = _reopen(path, _Beat.fd)  # closed under us: opened again, the count kept
    return _Beat.fd


def _descends_from(pid, ancestor):
    """Whether process `pid` is a descendant of `ancestor` (its parents, read in /proc)."""
    for _ in range(64):
        try:
            with open("/proc/%d/stat" % pid, "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])  # the parent's pid
        except (OSError, ValueError, IndexError):
            return False
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
    return False


def _owns():
    """Whether this process is the one that beats: the process named in HEARTBEAT.pid (also what
    ddprun reads a hung worker's stacks from). A process that steps takes the name when nobody
    holds it, when its holder has ended, or when its holder is its own descendant; otherwise it
    leaves the file alone. So a Python program the trainer starts (an evaluation's or a
    checkpoint's subprocess, a helper that stepped first: each inherits DDPRUN_HEARTBEAT_FILE)
    never beats for it nor hides its hang, and a wrapper (sh -c, a Python launcher that never
    steps) holds nothing. The owner reads the file again only when it changes (one stat a step);
    another process at each of its steps (its holder may have ended since)."""
    name = _Beat.path + ".pid"
    try:
        st = os.stat(name)
        key = (st.st_ino, st.st_mtime_ns)
    except OSError:
        key = None
    if _Beat.owner and key is not None and key == _Beat.owner_key:
        return True
    me, holder = os.getpid(), None
    if key is not None:
        try:
            with open(name, "rb") as f:
                holder = int(f.read(32).strip() or b"0")  # a pid and a newline
        except (OSError, ValueError):
            pass
    mine = not holder or holder == me or not os.path.exists("/proc/%d" % holder) or _descends_from(holder, me)
    if mine and holder != me:
        try:
            tmp = "%s.%d.tmp" % (name, me)
            with open(tmp, "w") as f:
                f.write("%d\n" % me)
            os.replace(tmp, name)
        except OSError:
            pass
        key = None  # read back at the next step: of two processes writing at once, one stays named
    _Beat.owner_key, _Beat.owner = key, mine
    return mine


def _reopen(path, old):
    """The heartbeat file opened (the descriptor `old` closed where it is still ours), and the stack
    signal's file with it; -1 where there is none."""
    if old >= 0 and _same_file(old, _Beat.file_id):
        os.close(old)
    fd, _Beat.file_id, _Beat.owner_key = -1, None, None
    if path:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            st = os.fstat(fd)
            _Beat.file_id = (st.st_dev, st.st_ino)
        except OSError:
            pass
        _register_stacks(path)
    return fd


def _forked():
    _Beat.forked = _Beat.forked or _Beat.pid >= 0  # (a wrapper that never beat may fork the trainer)


os.register_at_fork(after_in_child=_forked)


def _register_stacks(heartbeat):
    """faulthandler on DDPRUN_STACK_SIGNAL, into HEARTBEAT.stack (appended: ddprun reads what a
    signal adds). Not for a process that only inherited the variables (a DataLoader worker is
    forked: it keeps its parent's registration, and ddprun signals the parent only). A raw
    descriptor, closed only while it is still ours (never a number the script reuses)."""
    number = os.environ.get("DDPRUN_STACK_SIGNAL", "")
    if not number.isdigit() or not heartbeat:
        return
    try:
        import faulthandler

        fd = os.open(heartbeat + ".stack", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        faulthandler.register(int(number), file=fd, all_threads=True, chain=False)
        if _Beat.stack_fd >= 0 and _same_file(_Beat.stack_fd, _Beat.stack_id):
            os.close(_Beat.stack_fd)
        st = os.fstat(fd)
        _Beat.stack_fd, _Beat.stack_id = fd, (st.st_dev, st.st_ino)
    except (OSError, ValueError, RuntimeError):
        pass


def _touch(*_args):
    """An optimizer step: the count of steps written into the file (which sets its mtime)."""
    fd = _beat_file()
    if fd < 0 or not _owns():
        return
    heartbeat = _Beat.path
    if os.environ.get("DDPRUN_PRELOAD_AUTO") == "1" and getattr(sys, _STATE + "_reported", None) != heartbeat:
        setattr(sys, _STATE + "_reported", heartbeat)  # once per attempt (a spare runs a new one)
        _report_modules(heartbeat)
    _Beat.steps += 1
    _Beat.last = time.monotonic()
    try:
        os.pwrite(fd, b"%d\n" % _Beat.steps, 0)
    except OSError:
        pass  # the file went with its attempt: nothing to tell


def _forward(*_args):
    """A forward pass (any module's) or a batch from a DataLoader: progress without a step, at
    most one touch a second; none before the first step (a touch of the file while it holds no
    count is a step), nor from a forked child (a DataLoader worker runs the parent's hooks)."""
    now = time.monotonic()
    if now - _Beat.last < 1.0 or _Beat.steps == 0 or os.getpid() != _Beat.pid or not _Beat.owner:
        return
    _Beat.last = now
    fd = _beat_file()
    if fd >= 0:
        try:
            os.utime(fd)
        except OSError:
            pass


class _Saving:
    """torch.save under way in the process that trains: the file says "N save" and is touched
    every 2 s until it ends, so that ddprun takes the other ranks' silence (they wait for this
    one in a collective) for what it is. Not nested, not in a forked child."""

    active = False

    def __enter__(self):
        fd = _beat_file()
        self.on = fd >= 0 and os.getpid() == _Beat.pid and not _Saving.active and _owns()
        if not self.on:
            return self
        import threading

        _Saving.active = True
        self.fd, self.done = fd, threading.Event()
        self._write(b"%d save\n" % _Beat.steps)
        self.ticker = threading.Thread(target=self._tick, name="ddprun-save-beat", daemon=True)
        try:
            self.ticker.start()
        except RuntimeError:  # no new thread at the interpreter's end (an atexit save, 3.12): no ticks
            self.ticker = None
        return self

    def __exit__(self, *_exc):
        if self.on:
            self.done.set()
            if self.ticker is not None:
                self.ticker.join()
            self._write(b"%d\n" % _Beat.steps)
            _Saving.active = False
        return False

    def _write(self, text):
        try:
            os.pwrite(self.fd, text, 0)
            os.ftruncate(self.fd, len(text))
        except OSError:
            pass

    def _tick(self):
        while not self.done.wait(2.0):
            try:
                os.utime(self.fd)
            except OSError:
                return


def _on_serialization(module):
    """torch.save beats while it writes (a checkpoint may take minutes); torch's own
    `from .serialization import save` runs after this, so torch.save is this one too."""
    import functools

    save = getattr(module, "save", None)
    if save is None:
        return

    def save_beating(*args, **kwargs):
        with _Saving():
            return save(*args, **kwargs)

    module.save = functools.wraps(save)(save_beating)


def _on_torch_version(module):
    major = str(getattr(module, "__version__", "")).split(".", 1)[0]
    if major.isdigit() and int(major) < 2 and "NCCL_ASYNC_ERROR_HANDLING" not in os.environ:
        value = os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")
        if value is not None:
            os.environ["NCCL_ASYNC_ERROR_HANDLING"] = value


def _on_module(module):
    """PyTorch 1.x: a global forward pre-hook. Not on 2.x, where any global hook makes
    torch.compile warn and slows every module call: there a DataLoader's batches are the progress."""
    major = str(getattr(sys.modules.get("torch.version"), "__version__", "")).split(".", 1)[0]
    register = getattr(module, "register_module_forward_pre_hook", None)
    if register is not None and major.isdigit() and int(major) < 2:
        register(_forward)


def _on_dataloader(module):
    """Every batch a DataLoader hands out is progress (an evaluation loop without optimizer steps)."""
    iterator = getattr(module, "_BaseDataLoaderIter", None)
    next_batch = getattr(iterator, "__next__", None)
    if next_batch is None:
        return

    def __next__(self):
        _forward()
        return next_batch(self)

    iterator.__next__ = __next__


def _on_optimizer(module):
    register = getattr(module, "register_optimizer_step_post_hook", None)
    if register is not None:
        register(lambda optimizer, args, kwargs: _touch())
        return
    optimizer = getattr(module, "Optimizer", None)
    step_done = getattr(optimizer, "_optimizer_step_code", None)
    if step_done is None:
        return

    def _optimizer_step_code(self):
        step_done(self)  # still called: the profiler looks for its code object
        _touch()

    optimizer._optimizer_step_code = _optimizer_step_code


def _ddprun_new_environment():
    """A warm spare was handed its worker's environment (_ddprun_spare.py): what this module
    derived from the environment at start-up, derived again."""
    version = sys.modules.get("torch.version")
    if version is not None:
        _on_torch_version(version)
    _beat_file()  # its heartbeat file, and faulthandler on its stack file


_WATCHED = {
    "torch.version": _on_torch_version,
    "torch.optim.optimizer": _on_optimizer,
    "torch.nn.modules.module": _on_module,
    "torch.utils.data.dataloader": _on_dataloader,
    "torch.serialization": _on_serialization,
}


class _Loader:
    """The module's own loader, then `then(module)` once the module has run."""

    def __init__(self, loader, then):
        self._loader = loader
        self._then = then

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        try:
            self._then(module)
        except Exception:  # a hook must never break the worker's import
            pass

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _Finder:
    """First on sys.meta_path: finds nothing itself, wraps the loader of a watched module."""

    def find_spec(self, name, path, target=None):
        if name not in _WATCHED:
            return None
        then = _WATCHED.pop(name)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is None:
                continue
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _Loader(spec.loader, then)
            return spec
        return None


def _is_hook(path):
    try:
        with open(path, "rb") as f:
            return _MARKER.encode() in f.read(4096)
    except OSError:
        return False


def _hidden_sitecustomize(hook_dirs):
    """The spec of the first sitecustomize on sys.path that is no copy of this hook, or None."""
    from importlib.machinery import PathFinder

    while True:
        rest = [p for p in sys.path if os.path.realpath(p or os.curdir) not in hook_dirs]
        spec = PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None or not spec.origin:
            return None
        if not _is_hook(spec.origin):
            return spec
        hook_dirs.add(os.path.realpath(os.path.dirname(spec.origin)))


def _run_hidden_sitecustomize(hook_dirs):
    spec = _hidden_sitecustomize(hook_dirs)
    if spec is None:
        return
    # A module object made here: importlib.util would pull in contextlib and functools.
    module = type(sys)("sitecustomize")
    module.__file__, module.__spec__, module.__loader__ = spec.origin, spec, spec.loader
    spec.loader.exec_module(module)


def _install():
    here = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
    seen = getattr(sys, _STATE, None)
    if seen is not None:  # another copy is installed, and runs the user's sitecustomize
        seen.add(here)
        return
    seen = {here}
    setattr(sys, _STATE, seen)
    sys.meta_path.insert(0, _Finder())
    _beat_file()
    _run_hidden_sitecustomize(seen)


_install()
