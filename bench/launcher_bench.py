#!/usr/bin/python3
"""ddprun, torchrun (Debian's PyTorch 1.13, ../shared/tools/torchrun_fixed.py) and the floor, side
by side in one run, as ratios to the floor:

  launch+teardown   `LAUNCHER --standalone --nproc_per_node=N --no_python /bin/true`, N = 1, 8, 64;
                    the floor is `spawn_floor launch N /bin/true` (bench/spawn_floor.c: posix_spawn
                    N copies and wait, nothing else), timed the same way (its own exec included).
                    Each run is timed as a shell sees a command: by a small C timer (`spawn_floor
                    time`) that posix_spawns it, output on /dev/null, and waits, not by this script
  restart latency   8 workers; rank 1 crashes in attempts 0 and 1; from each crash to the last worker
                    of the next attempt started, from timestamps the workers print (bash's EPOCHREALTIME: no
                    fork to read the clock). The floor is `spawn_floor restart 8`: the first exit,
                    SIGKILL the other 7 and reap them, spawn 8 (torchrun: --monitor_interval=0.1)
  peak memory       maximum RSS of the launcher (wait4, by the same timer)

Each program timed (ddprun, the --also builds, spawn_floor) is first copied into a temporary
folder, as `install` copies it (with ddprun-full and share/ddprun/python where they are beside it):
a file the linker has just written is mapped from smaller page-cache pages, and each exec of it
takes more page faults (ddprun: about 10% more time at N=1 here) than the same file installed,
copied or read from disk after a reboot. --as-linked times the files where they are.

Runs are interleaved (floor, ddprun, torchrun, floor, torchrun, ddprun, ...: the launchers' order
reversed every other time, as the second of two runs of the same code is 1.5-3% faster here) so
that a drift of the machine's speed touches all alike; each figure is a median, and each ratio
the median of the ratios of runs taken side by side (a launcher's run over the floor's run of the
same round).

Usage: bench/launcher_bench.py [--ddprun build/launcher/ddprun] [--floor build/bench/spawn_floor]
                               [--torchrun PATH [--python PYTHON] | --no-torchrun] [--reps 21]
                               [--restart-reps 9] [--sizes 1,8,64] [--also NAME=OTHER_DDPRUN ...]
  On a machine with PyTorch 2.x: --torchrun "$(command -v torchrun)" --python "$(command -v python3)"
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCHRUN_CANDIDATES = [os.path.join(os.path.dirname(ROOT), "shared", "tools", "torchrun_fixed.py"),
                       os.path.join(os.path.dirname(os.path.dirname(ROOT)), "shared", "tools", "torchrun_fixed.py")]

RESTARTS = 2  # rank 1 crashes in attempts 0 and 1: a first restart, and a second
RESTART_WORKER = (
    'echo "start $TORCHELASTIC_RESTART_COUNT $RANK $EPOCHREALTIME"; '
    ': > "$BENCH_DIR/started.$TORCHELASTIC_RESTART_COUNT.$RANK"; '
    f'if [ "$TORCHELASTIC_RESTART_COUNT" -lt {RESTARTS} ]; then '
    # (rank 1 first waits, at most 10 s, until the 8 have started: a crash before one printed its
    # start would leave that attempt without it)
    '  if [ "$RANK" = 1 ]; then '
    '    for i in $(seq 1000); do s=("$BENCH_DIR/started.$TORCHELASTIC_RESTART_COUNT".*); '
    '      [ ${#s[@]} -ge 8 ] && break; sleep 0.01; done; '
    '    echo "crash $TORCHELASTIC_RESTART_COUNT $EPOCHREALTIME"; exit 1; '
    '  fi; '
    '  exec sleep 100; '
    'fi'
)
RESTART_CMD = ["/bin/bash", "-c", RESTART_WORKER]


def timed(cmd, out_path=None, env=None):
    """Runs cmd (stdin empty, output to out_path or /dev/null); returns (wall s, max RSS MiB, rc)."""
    out = os.open(out_path or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        t0 = time.monotonic()
        pid = os.posix_spawn(cmd[0], cmd, env or os.environ, file_actions=[
            (os.POSIX_SPAWN_DUP2, null, 0), (os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, out, 2)])
        _, status, ru = os.wait4(pid, 0)
        wall = time.monotonic() - t0
    finally:
        os.close(out)
        os.close(null)
    return wall, ru.ru_maxrss / 1024.0, os.waitstatus_to_exitcode(status)


def timed_as_shell(timer, cmd):
    """Runs cmd once under the C timer (`spawn_floor time 1 CMD`); returns (wall s, max RSS MiB, rc)."""
    r = subprocess.run([timer, "time", "1"] + cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    words = r.stdout.split()
    if len(words) != 2:
        raise SystemExit(f"the timer failed on {' '.join(cmd)}: {r.stderr.strip()}")
    return int(words[0]) / 1e9, int(words[1]) / 1024.0, r.returncode


class Runner:
    """One launcher (or the floor): how to start N workers, and its samples."""
    timer = None  # spawn_floor, the timer of the launches

    def __init__(self, name, launch, restart):
        self.name, self.launch, self.restart = name, launch, restart
        self.walls, self.rss, self.latencies = {}, {}, []

    def run_launch(self, n):
        wall, rss, rc = timed_as_shell(Runner.timer, self.launch(n))
        if rc != 0:
            raise SystemExit(f"{self.name} failed with {rc}: {' '.join(self.launch(n))}")
        self.walls.setdefault(n, []).append(wall)
        self.rss[n] = max(self.rss.get(n, 0), rss)
        return wall

    def run_restart(self, tmp):
        path = os.path.join(tmp, "restart.out")
        env = dict(os.environ, BENCH_DIR=tempfile.mkdtemp(dir=tmp))
        _, _, rc = timed(self.restart(), path, env)
        with open(path) as f:
            out = f.read()
        if rc != 0:
            raise SystemExit(f"{self.name}: restart run failed ({rc}):\n{out}")
        latencies = []
        for attempt in range(RESTARTS):
            crash = re.search(rf"crash {attempt} (\d+\.\d+)", out)
            if not crash:
                raise SystemExit(f"{self.name}: no crash in attempt {attempt}:\n{out}")
            crash = float(crash.group(1))
            starts = [float(t) for t in re.findall(rf"start {attempt + 1} \d+ (\d+\.\d+)", out)]
            if len(starts) != 8:
                raise SystemExit(f"{self.name}: expected 8 workers in attempt {attempt + 1}, saw {len(starts)}:\n{out}")
            latencies.append(max(starts) - crash)
        self.latencies.append(latencies)
        return latencies


def launcher_runner(name, prefix, restart_extra):
    def launch(n):
        return prefix + ["--standalone", f"--nproc_per_node={n}", "--no_python", "/bin/true"]

    def restart():
        return prefix + ["--standalone", "--nproc_per_node=8", f"--max_restarts={RESTARTS}"] + restart_extra + \
            ["--no_python"] + RESTART_CMD
    return Runner(name, launch, restart)


def as_installed(program, into):
    """Copies program (and ddprun-full, ../share/ddprun/python beside it) into the folder `into`,
    as `install` does; returns the copy's path."""
    here = os.path.dirname(os.path.abspath(program))
    os.makedirs(os.path.join(into, "bin"))
    for name in [os.path.basename(program), "ddprun-full"]:
        if os.path.exists(os.path.join(here, name)):
            shutil.copy2(os.path.join(here, name), os.path.join(into, "bin", name))
    data = os.path.join(os.path.dirname(here), "share", "ddprun")
    if os.path.isdir(data):
        shutil.copytree(data, os.path.join(into, "share", "ddprun"))
    return os.path.join(into, "bin", os.path.basename(program))


def paired_ratio(a, b):
    return statistics.median(x / y for x, y in zip(a, b))


def bench_launch(floor, others, sizes, reps, torch_every):
    for n in sizes:
        for rep in range(reps):
            f = floor.run_launch(n)
            # The launchers in turn, the order reversed every other run: here the second of two
            # runs of the same code is 1.5-3% faster (it just ran), which a fixed order gives to
            # the same column every time.
            for r in (others if rep % 2 == 0 else others[::-1]):
                if r.name == "torchrun" and rep % torch_every:
                    continue
                r.run_launch(n)
                r.walls.setdefault(("pair", n), []).append(r.walls[n][-1] / f)
        print(f"  N={n}: done", file=sys.stderr, flush=True)


def print_launch(floor, others, sizes, reps):
    names = [r.name for r in others]
    print(f"Launch + teardown of N /bin/true workers (median wall time of {reps} runs; torchrun fewer)")
    head = f"{'N':>4} | {'floor ms':>9} | " + " | ".join(f"{n + ' ms':>12} | {n + ' / floor':>16}" for n in names)
    print(head + " | " + " | ".join(f"{n + ' MiB':>12}" for n in names))
    for n in sizes:
        row = f"{n:>4} | {statistics.median(floor.walls[n]) * 1000:>9.2f} | "
        row += " | ".join(f"{statistics.median(r.walls[n]) * 1000:>12.2f} | {statistics.median(r.walls[('pair', n)]):>15.2f}x"
                          for r in others)
        row += " | " + " | ".join(f"{r.rss[n]:>12.1f}" for r in others)
        print(row, flush=True)


def bench_restart(floor, others, reps):
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(reps):
            f = floor.run_restart(tmp)
            for r in (others if rep % 2 == 0 else others[::-1]):
                if r.name == "torchrun" and rep >= 3:
                    continue
                for k, latency in enumerate(r.run_restart(tmp)):
                    r.walls.setdefault(("restart_pair", k), []).append(latency / f[k])
    print("\nRestart latency, 8 workers: rank 1 crashes -> every worker of the next attempt started "
          f"(median of {reps} runs; torchrun 3). A job restarts twice: the first restart (where a GPU's "
          "driver runs, NVML starts then), and the second")
    for k, name in enumerate(["first", "second"][:RESTARTS]):
        row = f"{name:>6}: floor (SIGKILL 7 + spawn 8) {statistics.median(l[k] for l in floor.latencies) * 1000:.2f} ms"
        for r in others:
            row += f" | {r.name} {statistics.median(l[k] for l in r.latencies) * 1000:.2f} ms = " \
                   f"{statistics.median(r.walls[('restart_pair', k)]):.2f}x floor"
        print(row, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ddprun", default=os.path.join(ROOT, "build", "launcher", "ddprun"))
    ap.add_argument("--floor", default=os.path.join(ROOT, "build", "bench", "spawn_floor"))
    ap.add_argument("--torchrun", help="torchrun_fixed.py (default: ../shared/tools/torchrun_fixed.py)")
    ap.add_argument("--no-torchrun", action="store_true", help="ddprun and the floor only")
    ap.add_argument("--python", help="the Python that runs --torchrun (default: /usr/bin/python3, Debian's "
                    "PyTorch, where it exists; else this one)")
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--restart-reps", type=int, default=9)
    ap.add_argument("--sizes", default="1,8,64")
    ap.add_argument("--as-linked", action="store_true",
                    help="time the programs where they are, not copies as installed")
    ap.add_argument("--also", action="append", default=[], metavar="NAME=DDPRUN",
                    help="another ddprun build in the same run, e.g. before=/tmp/ddprun-main")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="launcher-bench-") as tmp:
        if not args.as_linked:
            args.floor = as_installed(args.floor, os.path.join(tmp, "floor"))
            args.ddprun = as_installed(args.ddprun, os.path.join(tmp, "ddprun"))
            args.also = [f"{name}={as_installed(path, os.path.join(tmp, 'also-' + name))}"
                         for name, _, path in (a.partition("=") for a in args.also)]
        run(args)


def run(args):
    sizes = [int(s) for s in args.sizes.split(",")]
    Runner.timer = args.floor
    floor = Runner("floor", lambda n: [args.floor, "launch", str(n), "/bin/true"],
                   lambda: [args.floor, "restart", "8"] + RESTART_CMD)
    others = [launcher_runner("ddprun", [args.ddprun], [])]
    for also in args.also:
        name, _, path = also.partition("=")
        others.append(launcher_runner(name, [path], []))
    if not args.no_torchrun:
        torchrun = args.torchrun or next((p for p in TORCHRUN_CANDIDATES if os.path.exists(p)), None)
        if not torchrun or not os.path.exists(torchrun):
            raise SystemExit("torchrun_fixed.py not found: give --torchrun PATH, or --no-torchrun")
        python = args.python or ("/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable)
        others.append(launcher_runner("torchrun", [python, torchrun], ["--monitor_interval=0.1"]))
    for r in [floor] + others:  # warm-up: page cache, first-run costs
        r.run_launch(1)
        r.walls.clear()
    bench_launch(floor, others, sizes, args.reps, max(1, args.reps // 5))
    print_launch(floor, others, sizes, args.reps)
    bench_restart(floor, others, args.restart_reps)


if __name__ == "__main__":
    main()
