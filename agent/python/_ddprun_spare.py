"""A warm spare for a Python worker (docs: "Warm spares").

ddprun starts this file as `python [FLAGS] _ddprun_spare.py PATH0 PRELOAD` with the environment of
the worker it stands in for, once that worker's group is up. It imports PRELOAD (a
comma-separated list of modules: torch, --preload's) on a thread at the lowest CPU priority,
which says "ready" on descriptor 4 once they are in. Meanwhile, from its start, the main thread
waits on descriptor 3 for the attempt it is to run: a JSON object with the worker's argv,
environment and working directory; ddprun takes an order read as the spare's (one never read
means the spare died: its rank starts cold). Once the imports have ended, it runs the script as
`python FLAGS SCRIPT ARGS` / `python FLAGS -m MODULE ARGS` would: a fresh __main__, sys.argv,
__file__, sys.path[0], sys.orig_argv, the signal dispositions and mask it started with, and the
same exit codes and tracebacks. It touches no CUDA, no socket and no store before that.
"""
import os
import signal
import sys

_SELF = os.path.abspath(__file__)
_STARTED_SIGNALS = {s: signal.getsignal(s) for s in signal.valid_signals() if signal.getsignal(s) is not None}
_STARTED_MASK = signal.pthread_sigmask(signal.SIG_BLOCK, [])


def _say(line):
    try:
        os.write(4, (line.replace("\n", " ") + "\n").encode())
    except OSError:
        pass


# Imported with a module when it is there, without a word when it is not: PyTorch 2.x imports
# torch._dynamo (with sympy, about 900 modules: 1.0 s here, as long as the rest of the restart)
# when the script makes its first optimizer; PyTorch 1.x has none.
_WITH = {"torch": ("torch._dynamo",)}


def _preload(names):
    import threading

    def work():
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # this thread only
        except OSError:
            pass
        for name in names:
            try:
                __import__(name)
            except BaseException as e:  # a module that fails to import: the spare goes on without it
                _say(f"warn {name}: {type(e).__name__}: {e}")
                continue
            for extra in _WITH.get(name, ()):
                try:
                    __import__(extra)
                except Exception:  # absent (PyTorch 1.x) or broken: the script imports it if it needs it
                    pass

        _say("ready")

    t = threading.Thread(target=work, name="ddprun-preload", daemon=True)
    t.start()
    return t


def _read_order():
    import json

    chunks = []
    while True:
        b = os.read(3, 1 << 16)
        if not b:
            break
        chunks.append(b)
    os.close(3)
    return json.loads(b"".join(chunks)) if chunks else None


def _take_environment(order):
    env = dict(kv.split("=", 1) for kv in order["env"] if "=" in kv)
    for k in list(os.environ):
        if k not in env:
            del os.environ[k]
    for k, v in env.items():
        if os.environ.get(k) != v:
            os.environ[k] = v
    os.chdir(order["cwd"])
    hook = sys.modules.get("sitecustomize")
    again = getattr(hook, "_ddprun_new_environment", None)
    if again is not None:
        again()


def _restore_signals():
    for s, handler in _STARTED_SIGNALS.items():
        try:
            if signal.getsignal(s) is not handler:
                signal.signal(s, handler)
        except (OSError, ValueError, TypeError):
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, _STARTED_MASK)


def _fresh_main():
    import builtins

    main = type(sys)("__main__")
    main.__builtins__ = builtins
    main.__annotations__ = {}
    sys.modules["__main__"] = main
    return main


def _run(order):
    run, args = order["run"], order["args"]
    sys.orig_argv = list(order["argv"])
    if run.startswith("-m "):
        import runpy

        _fresh_main()
        sys.argv = ["-m"] + args
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
    path0, preload = sys.argv[1], [m for m in sys.argv[2].split(",") if m]
    sys.path[0] = path0  # where the script's own modules are found, as for the worker
    importing = _preload(preload)
    # Read at once, while the imports run (in the kernel, without the GIL): a read order is how
    # ddprun knows this spare is alive and took its attempt.
    order = _read_order()
    if order is None:
        os._exit(0)  # not needed: thrown away
    importing.join()
    os.close(4)
    del sys.argv[1:]
    _take_environment(order)
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
