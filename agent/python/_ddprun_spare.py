"""A warm spare for a Python worker (docs: "Warm spares").

ddprun starts this file as `python [FLAGS] _ddprun_spare.py PATH0 PRELOAD RECORD ROOM` with the
environment of the worker it stands in for, once that worker's group is up. PATH0 is the
script's folder (sys.path[0] of the worker), PRELOAD a comma-separated list of modules to import
(torch, --preload's), RECORD "" or, with --preload=auto, the file where the last attempt's
worker listed the modules it had imported at its first step and their files; ROOM (spaces), and
DDPRUN_SPARE_ROOM in the environment, make room in /proc for the worker's argv and environment.

On a thread at the lowest CPU priority the spare imports PRELOAD, then the recorded modules that
it finds in the same files as the worker did, and tells ddprun on descriptor 4, a line each:
"warn NAME: ERROR" for a module that failed, "file MTIME_NS SIZE PATH" for every module file it
read (ddprun checks them for edits before a hand-over), "differs REASON" if it holds a module
from another file than the last worker had it from, then "ready". ddprun raises the priority of
every thread of the spare to the worker's before the hand-over (or starts the rank cold).

Meanwhile, from its start, the main thread waits on descriptor 3 for the attempt it is to run
(ddprun takes an order read as the spare's: one never read means the spare died): bytes, NUL
separated, as spares.cpp writes it. Once the imports have ended, it runs the script as `python
FLAGS SCRIPT ARGS` / `python FLAGS -m MODULE ARGS` would: the environment (with what interpreter
start-up code changed in it), a fresh __main__, sys.argv, __file__, sys.path[0] (none under -P
or PYTHONSAFEPATH), sys.orig_argv, /proc's cmdline and environ, the signal dispositions and mask
it started with, and the same exit codes and tracebacks. If its imports turn out to differ from
the last worker's after it was handed the attempt, it executes the worker's command instead: a
fresh interpreter in the same process. It touches no CUDA, no socket and no store before that.
"""
import os
import signal
import sys

_SELF = os.path.abspath(__file__)
_STARTED_SIGNALS = {s: signal.getsignal(s) for s in signal.valid_signals() if signal.getsignal(s) is not None}
_STARTED_MASK = signal.pthread_sigmask(signal.SIG_BLOCK, [])
_SAFE_PATH = bool(getattr(sys.flags, "safe_path", False))  # -P or PYTHONSAFEPATH: no sys.path[0] added
_ROOM = b"DDPRUN_SPARE_ROOM"


# ddprun's progress hook derives this from TORCH_NCCL_ASYNC_ERROR_HANDLING when torch is imported
# (PyTorch 1.x), and again from the worker's environment (sitecustomize._ddprun_new_environment).
_DERIVED = {b"NCCL_ASYNC_ERROR_HANDLING"}


def _read_started_environment():
    try:
        with open("/proc/self/environ", "rb") as f:
            block = f.read()
    except OSError:
        return None
    return dict(kv.split(b"=", 1) for kv in block.split(b"\0") if b"=" in kv)


_STARTED_ENV = _read_started_environment()  # as this process was started (before start-up code)
os.environb.pop(_ROOM, None)


def _environment_changes():
    """What interpreter start-up (site, .pth files, sitecustomize, usercustomize) and the
    preloaded modules' imports changed in the environment this process was started with, as
    bytes: ({set or changed}, (removed, ...)). A fresh worker's start-up, and its imports of the
    same modules, make the same changes to its environment; the spare's are made again on the
    worker's."""
    if _STARTED_ENV is None:
        return {}, ()
    now = os.environb
    changed = {k: v for k, v in now.items() if _STARTED_ENV.get(k) != v and k not in _DERIVED}
    return changed, tuple(k for k in _STARTED_ENV if k not in now and k != _ROOM and k not in _DERIVED)


def _write(data):
    try:
        while data:
            data = data[os.write(4, data):]
    except OSError:
        pass  # ddprun has stopped listening: it handed this spare over, or threw it away


def _say(line):
    _write(os.fsencode(line).replace(b"\n", b" ") + b"\n")


# Imported with a module when it is there, without a word when it is not: PyTorch 2.x imports
# torch._dynamo (with sympy, about 900 modules: 1.0 s here, as long as the rest of the restart)
# when the script makes its first optimizer; PyTorch 1.x has none.
_WITH = {"torch": ("torch._dynamo",)}


def _read_record(path):
    """{module: file} of what the last attempt's worker had imported at its first step, or None."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
    except OSError:
        return None
    record = {}
    for line in lines:
        name, tab, where = line.partition(b"\t")
        if tab and name and where:
            record[os.fsdecode(name)] = os.fsdecode(where)
    return record


def _same_file(a, b):
    return a == b or os.path.realpath(a) == os.path.realpath(b)


def _recorded_to_import(record, path0, recorder):
    """The recorded top-level modules to preload: not the standard library, not private, not the
    script's own (under its folder), and only where the spare's import finds the very file the
    worker had (a script that puts its project's folder on sys.path itself finds its own
    `datasets` package there; the spare would find the installed one)."""
    import importlib.util

    skip = set(getattr(sys, "stdlib_module_names", ())) | set(sys.builtin_module_names)
    skip |= {"sitecustomize", "usercustomize", "torch"}
    own = os.path.realpath(path0) + os.sep
    for name, where in sorted(record.items()):
        if "." in name or name.startswith("_") or name in skip or os.path.realpath(where).startswith(own):
            continue
        recorder.probing = True  # a look, not an import: nothing to note
        try:
            spec = importlib.util.find_spec(name)
        except Exception:  # noqa: BLE001  (a broken package: the script imports it itself)
            continue
        finally:
            recorder.probing = False
        if spec is not None and spec.origin and _same_file(spec.origin, where):
            yield name


def _import(name):
    try:
        __import__(name)
    except BaseException as e:  # a module that fails to import: the spare goes on without it
        _say(f"warn {name}: {type(e).__name__}: {e}")
        return
    for extra in _WITH.get(name, ()):
        try:
            __import__(extra)
        except Exception:  # absent (PyTorch 1.x) or broken: the script imports it if it needs it
            pass


def _differs(record):
    """Why the spare cannot stand in for the worker: a module it holds that the last worker had
    from another file. "" if none."""
    for name, module in list(sys.modules.items()):
        where = None if name in ("__main__", "__mp_main__") else record.get(name)
        have = getattr(module, "__file__", None)
        if where and isinstance(have, str) and not _same_file(have, where):
            return f"the module {name} would be {have} in its warm spare, but the last attempt's worker had {where}"
    return ""


class _Recorder:
    """First on sys.meta_path while the spare imports: finds each module through the finders
    after it, as the import system would, and notes its file's (mtime, size) as it is found, before
    the module runs (a file edited later is told from the one imported); with a record, the first
    module found in another file than the last worker had it from."""

    def __init__(self, record):
        self.files = {}
        self.record = record or {}
        self.differs = ""
        self.probing = False

    def find_spec(self, name, path, target=None):
        if self.probing:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is None:
                continue
            where = spec.origin if getattr(spec, "has_location", False) else None
            if where and where not in self.files:
                try:
                    st = os.stat(where)
                    self.files[where] = (st.st_mtime_ns, st.st_size)
                except OSError:
                    pass
            want = self.record.get(name)
            if where and want and not self.differs and not _same_file(where, want):
                self.differs = (f"the module {name} would be {where} in its warm spare, but the last attempt's "
                                f"worker had {want}")
            return spec
        return None

    def edited(self):
        """The first file noted that changed since, or ""."""
        for where, seen in list(self.files.items()):
            try:
                st = os.stat(where)
            except OSError:
                return where
            if (st.st_mtime_ns, st.st_size) != seen:
                return where
        return ""


class _Preload:
    """The imports, on a thread of their own, which ddprun puts at nice 19 once it says
    "importing TID" (ddprun alone changes its priority: down now, back up at the hand-over);
    `recorder.differs` says why they cannot serve."""

    def __init__(self, names, record, path0):
        import threading

        self.recorder = _Recorder(record)
        self._thread = threading.Thread(target=self._work, args=(names, record, path0), name="ddprun-preload",
                                        daemon=True)
        self._thread.start()

    def _work(self, names, record, path0):
        import threading

        _say(f"importing {threading.get_native_id()}")
        sys.meta_path.insert(0, self.recorder)
        try:
            for name in names:
                if not self.recorder.differs:
                    _import(name)
            if record is not None:
                for name in _recorded_to_import(record, path0, self.recorder):
                    if self.recorder.differs:
                        break
                    if name not in sys.modules:
                        _import(name)
                if not self.recorder.differs:
                    self.recorder.differs = _differs(record)
        finally:
            sys.meta_path.remove(self.recorder)
        _write(b"".join(b"file %d %d " % (mtime, size) + os.fsencode(where) + b"\n"
                        for where, (mtime, size) in list(self.recorder.files.items()) if "\n" not in where))
        if self.recorder.differs:
            _say("differs " + self.recorder.differs)
        _say("ready")

    def join(self):
        self._thread.join()


class _Order:
    """The attempt to run, as spares.cpp writes it: bytes, NUL-separated."""

    def __init__(self, data):
        fields = iter(data.split(b"\0"))
        if next(fields) != b"ddprun-order-1":
            raise SystemExit("ddprun: this warm spare's driver does not match its ddprun (order format)")

        def strings():
            return [next(fields) for _ in range(int(next(fields)))]

        self.run, self.cwd = next(fields), next(fields)
        self.args, self.argv, self.env = strings(), strings(), strings()


def _read_order():
    chunks = []
    while True:
        b = os.read(3, 1 << 20)
        if not b:
            break
        chunks.append(b)
    os.close(3)
    return _Order(b"".join(chunks)) if chunks else None


def _take_environment(order):
    env = dict(kv.split(b"=", 1) for kv in order.env if b"=" in kv and not kv.startswith(b"="))
    changed, removed = _environment_changes()
    for k in removed:
        env.pop(k, None)
    env.update(changed)
    # Every variable set anew, in the worker's order: none of the C environment's strings is
    # left in the block the spare started with (_show_as writes over it).
    for k in list(os.environb):
        del os.environb[k]
    for k, v in env.items():
        os.environb[k] = v
    os.chdir(order.cwd)
    hook = sys.modules.get("sitecustomize")
    again = getattr(hook, "_ddprun_new_environment", None)
    if again is not None:
        again()


def _show_as(order):
    """/proc/self/cmdline and environ: the worker's argv and the environment it was started
    with, written over the spare's own in place (ddprun made room for them; no C string of the
    environment is left there, _take_environment set each anew). With CAP_SYS_RESOURCE the areas
    end where the worker's end; without it, the rest of each is NULs."""
    import ctypes

    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read().rsplit(b")", 1)[1].split()
        arg_start, arg_end, env_start, env_end = (int(stat[i - 3]) for i in (48, 49, 50, 51))
    except (OSError, ValueError, IndexError):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_mm, pr_set_mm_arg_end, pr_set_mm_env_end = 35, 9, 11  # <linux/prctl.h>
    for start, end, strings, set_end in ((arg_start, arg_end, order.argv, pr_set_mm_arg_end),
                                         (env_start, env_end, order.env, pr_set_mm_env_end)):
        block = b"".join(s + b"\0" for s in strings)
        if not block or len(block) > end - start:
            continue  # no room: left as the spare's
        ctypes.memmove(start, block + b"\0" * (end - start - len(block)), end - start)
        libc.prctl(pr_set_mm, set_end, ctypes.c_ulong(start + len(block)), ctypes.c_ulong(0), ctypes.c_ulong(0))


def _restore_signals():
    for s, handler in _STARTED_SIGNALS.items():
        try:
            if signal.getsignal(s) is not handler:
                signal.signal(s, handler)
        except (OSError, ValueError, TypeError):
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, _STARTED_MASK)


def _become_cold(order, why):
    """The worker's command executed in this process: a fresh interpreter after all."""
    _say("cold " + why)
    for s in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):  # as the interpreter found them
        signal.signal(s, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, _STARTED_MASK)
    env = dict(kv.split(b"=", 1) for kv in order.env if b"=" in kv and not kv.startswith(b"="))
    # Its rank's state area (DDPRUN_STATE_FD) stays: ddprun gave it to this process for the worker.
    keep = env.get(b"DDPRUN_STATE_FD", b"")
    keep = int(keep) if keep.isdigit() else -1
    if keep >= 3:
        os.set_inheritable(keep, True)
        os.closerange(3, keep)
        os.closerange(keep + 1, 1 << 16)
    else:
        os.closerange(3, 1 << 16)
    os.chdir(order.cwd)
    os.execve(order.argv[0], order.argv, env)


def _fresh_main():
    import builtins

    main = type(sys)("__main__")
    main.__builtins__ = builtins
    main.__annotations__ = {}
    sys.modules["__main__"] = main
    return main


def _run(order):
    run, args = os.fsdecode(order.run), [os.fsdecode(a) for a in order.args]
    sys.orig_argv = [os.fsdecode(a) for a in order.argv]
    if run.startswith("-m "):
        import runpy

        _fresh_main()
        sys.argv = ["-m"] + args
        if not _SAFE_PATH:
            sys.path[0] = os.getcwd()
        runpy._run_module_as_main(run[3:], alter_argv=True)
        return
    from importlib.machinery import SourceFileLoader

    path = os.path.join(os.getcwd(), run)
    main = _fresh_main()
    main.__file__ = path
    main.__cached__ = None
    main.__loader__ = SourceFileLoader("__main__", path)
    sys.argv = [run] + args
    if not _SAFE_PATH:
        sys.path[0] = os.path.dirname(os.path.realpath(path))
    with open(path, "rb") as f:
        source = f.read()
    code = compile(source, path, "exec", dont_inherit=True)
    del source
    exec(code, main.__dict__)


def _handle_uncaught(e):
    """What the interpreter does with an exception that reaches the top: the traceback (without
    this file's frames), then exit 1, or for KeyboardInterrupt death by SIGINT."""
    tb = e.__traceback__
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) == _SELF:
        tb = tb.tb_next
    e.__traceback__ = tb
    sys.last_type, sys.last_value, sys.last_traceback = type(e), e, tb
    sys.excepthook(type(e), e, tb)
    if isinstance(e, KeyboardInterrupt):
        import atexit
        import threading

        threading._shutdown()
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        os._exit(130)
    sys.exit(1)


def _spare():
    path0, preload, record = sys.argv[1], [m for m in sys.argv[2].split(",") if m], _read_record(sys.argv[3])
    del sys.argv[1:]
    if not _SAFE_PATH:
        sys.path[0] = path0  # this file's folder becomes the script's, as for the worker
    importing = _Preload(preload, record, path0)
    # Read at once, while the imports run (in the kernel, without the GIL): a read order is how
    # ddprun knows this spare is alive and took its attempt.
    order = _read_order()
    if order is None:
        os._exit(0)  # not needed: thrown away
    # Handed over before its imports ended (ddprun checked what it had reported): a module file
    # edited since the spare imported it, or a module from another file than the last worker's,
    # found now or once the imports end, makes this process the fresh interpreter after all.
    edited = importing.recorder.edited()
    if edited:
        _become_cold(order, f"the module file {edited} changed after its warm spare imported it")
    importing.join()
    if importing.recorder.differs:
        _become_cold(order, importing.recorder.differs)
    os.close(4)
    _take_environment(order)
    _show_as(order)
    _restore_signals()
    return order


_order = _spare()
del _spare
try:
    _run(_order)
except SystemExit:
    raise
except BaseException as _e:
    _handle_uncaught(_e)
