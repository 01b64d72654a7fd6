"""What the Python tests share: skip() as tests/lib.sh's (exit 77, which ctest shows as skipped;
under CI=true a failure, since CI installs every tool a test needs; a test skips whole or not
at all); check() that records a failure and goes on, require() that raises; run() of a command, its output read as it
comes."""
import os
import subprocess
import sys
import threading

FAILURES = []  # what check() found false
PASSED = [0]


def skip(why):
    if os.environ.get("CI") in ("true", "1"):
        print(f"FAILED: CI=true and this test cannot run: {why}")
        sys.exit(1)
    print(f"SKIP: {why}")
    sys.exit(77)


def need_torch():
    """Skips (as skip()) unless this interpreter can import torch."""
    try:
        import torch  # noqa: F401
    except ImportError as e:
        skip(f"torch is not importable with {sys.executable}: {e}")


def check(cond, what):
    """Prints "ok: WHAT" or "FAILED: WHAT"; a failure is recorded in FAILURES, and the test goes on."""
    print(("ok: " if cond else "FAILED: ") + what, flush=True)
    if cond:
        PASSED[0] += 1
    else:
        FAILURES.append(what)


def require(cond, what):
    """Prints "ok: WHAT", or raises AssertionError(WHAT): for a test whose later steps need it."""
    if not cond:
        raise AssertionError(what)
    print(f"ok: {what}", flush=True)


def show(lines):
    print("\n".join("    " + l for l in lines[-40:]), flush=True)


def run(cmd, env_extra=None, timeout=120, on_line=None, cwd=None):
    """Runs `cmd` with this environment less PYTHONPATH, plus `env_extra` (a value of None unsets);
    each line of its output (stdout and stderr) is handed to `on_line` as it comes. Killed after
    `timeout` s. Returns (exit code, lines)."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.update(env_extra or {})
    env = {k: v for k, v in env.items() if v is not None}
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd)
    lines = []

    def read():
        for line in p.stdout:
            lines.append(line.rstrip("\n"))
            if on_line:
                on_line(line)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    try:
        rc = p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
        lines.append(f"TEST: killed after {timeout} s")
    t.join(10)
    return rc, lines


def state_area(size):
    """A memfd as ddprun's agent makes a rank's state area ("ddprun-state-...", sealed against
    growing and shrinking), of `size` bytes: tests of ddprun.state without ddprun."""
    import fcntl

    fd = os.memfd_create("ddprun-state-0", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    fcntl.fcntl(fd, 1033, 0x0001 | 0x0002 | 0x0004)  # F_ADD_SEALS: SEAL, SHRINK, GROW
    return fd
