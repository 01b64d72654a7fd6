#!/usr/bin/python3
"""ddprun vs torchrun (Debian's PyTorch 1.13, ../shared/tools/torchrun_fixed.py), side by side:

  launch+teardown   `LAUNCHER --standalone --nproc_per_node=N --no_python /bin/true`, N = 1, 8, 64
                    (median wall time of several runs each)
  restart latency   8 workers; rank 1 crashes in attempt 0; time from its crash to the last worker
                    of attempt 1 starting, from timestamps the workers print (torchrun with
                    --monitor_interval=0.1)
  peak memory       maximum RSS of the launcher (wait4; workers are /bin/true and sleep)

Usage: bench/launcher_bench.py [--ddprun build/launcher/ddprun] [--reps 5]
"""
import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCHRUN = [sys.executable, os.path.join(os.path.dirname(ROOT), "shared", "tools", "torchrun_fixed.py")]


def timed(cmd, env=None):
    """Runs cmd; returns (wall seconds, max RSS in MiB, stdout)."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    return wall, ru.ru_maxrss / 1024.0, out, p.returncode


def launch(launcher, n, reps):
    walls, rss = [], []
    for _ in range(reps):
        w, m, _, rc = timed(launcher + ["--standalone", f"--nproc_per_node={n}", "--no_python", "/bin/true"])
        if rc != 0:
            raise SystemExit(f"{launcher[0]} failed with {rc}")
        walls.append(w)
        rss.append(m)
    return statistics.median(walls), max(rss)


RESTART_WORKER = (
    'now() { date +%s.%N; }; '
    'echo "start $TORCHELASTIC_RESTART_COUNT $RANK $(now)"; '
    'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then '
    '  if [ "$RANK" = 1 ]; then echo "crash $(now)"; exit 1; fi; exec sleep 100; '
    'fi'
)


def restart_latency(launcher, extra):
    cmd = launcher + ["--standalone", "--nproc_per_node=8", "--max_restarts=1"] + extra + \
        ["--no_python", "/bin/sh", "-c", RESTART_WORKER]
    _, _, out, rc = timed(cmd)
    if rc != 0:
        raise SystemExit(f"restart run failed ({rc}):\n{out}")
    crash = float(re.search(r"crash (\d+\.\d+)", out).group(1))
    starts = [float(t) for t in re.findall(r"start 1 \d+ (\d+\.\d+)", out)]
    if len(starts) != 8:
        raise SystemExit(f"expected 8 restarted workers, saw {len(starts)}:\n{out}")
    return max(starts) - crash


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", default=os.path.join(ROOT, "build", "launcher", "ddprun"))
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    ours = [args.ddprun]
    if not os.path.exists(TORCHRUN[1]):
        raise SystemExit(f"{TORCHRUN[1]} not found: the comparison needs torchrun")
    print("Launch + teardown of /bin/true workers (median of %d runs)" % args.reps)
    print(f"{'N':>4} | {'ddprun s':>9} | {'torchrun s':>10} | {'speed-up':>8} | {'ddprun MiB':>10} | {'torchrun MiB':>12}")
    for n in (1, 8, 64):
        a, ma = launch(ours, n, args.reps)
        b, mb = launch(TORCHRUN, n, max(3, args.reps // 2))
        print(f"{n:>4} | {a:>9.4f} | {b:>10.3f} | {b / a:>7.0f}x | {ma:>10.1f} | {mb:>12.1f}", flush=True)
    print("\nRestart latency, 8 workers: rank 1 crashes -> every worker of the next attempt started")
    lat_a = [restart_latency(ours, []) for _ in range(3)]
    lat_b = [restart_latency(TORCHRUN, ["--monitor_interval=0.1"]) for _ in range(3)]
    a, b = statistics.median(lat_a), statistics.median(lat_b)
    print(f"ddprun {a * 1000:.1f} ms | torchrun {b * 1000:.1f} ms | {b / a:.1f}x faster  (median of 3)")


if __name__ == "__main__":
    main()
