#!/usr/bin/python3
"""What each part of a launch costs, side by side in one run: ddprun as built, and ddprun with one
mechanism taken out or done another way, each against the floor of bench/launcher_bench.py
(`spawn_floor launch N /bin/true`), timed the same way (the C timer, `spawn_floor time`: whole
processes, as a shell sees them) over interleaved rounds.

The variants come from one build of this checkout (HEAD and its uncommitted changes to tracked
files) with bench/launch_price.patch applied, in a temporary git worktree: the patch adds switches
that only this bench sets, so none is in ddprun. Each variant's "saves" is against the build it
comes from: the patched ones against "patched, all on", the others against "as built".

  as built             build/launcher/ddprun (--ddprun)
  patched, all on      the patched build, no switch set: must time as "as built" does
  no guardian          DDPRUN_PRICE_NO_GUARDIAN: nothing cleans up after a kill -9 of ddprun, and
                       no node fences itself (architecture.md, the guardian)
  forked guardian      DDPRUN_PRICE_FORKED_GUARDIAN: fork() without exec; the guardian would show
                       ddprun's command line and share its memory
  small guardian       DDPRUN_PRICE_GUARDIAN_PROGRAM=bench/launch_price_guard.c, built here: the
                       start of a guardian written as a small program of its own (a stand-in that
                       kills nothing)
  no cgroup            DDPRUN_PRICE_NO_CGROUP: the fallback where the hierarchy is not delegated
                       (a subreaper, and the job's processes found by their token)
  no state area        --no_state: no in-memory state (docs/state.md)
  no hang watch        --worker_timeout=0: no heartbeat files, no hang found
  not PIE              the patched build linked again with -no-pie (its objects as they are): no
                       address randomisation of ddprun's own code
  the three out        not PIE, no guardian and no state area together

Usage: bench/launch_price.py [--ddprun build/launcher/ddprun] [--floor build/bench/spawn_floor]
                             [--sizes 1,8,64] [--rounds 15] [--runs 9] [--build-dir DIR] [--jobs 2]
  about 4 minutes of building (the ddprun target only), then about 5 minutes of timing; with
  --build-dir the build is kept, and used again while HEAD, the changes and the patch are the same
"""
import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

VARIANTS = [  # (name, binary key, extra environment, extra flags, the row its saving is against)
    ("as built", "built", {}, [], "as built"),
    ("patched, all on", "patched", {}, [], "as built"),
    ("no guardian", "patched", {"DDPRUN_PRICE_NO_GUARDIAN": "1"}, [], "patched, all on"),
    ("forked guardian", "patched", {"DDPRUN_PRICE_FORKED_GUARDIAN": "1"}, [], "patched, all on"),
    ("small guardian", "patched", {"DDPRUN_PRICE_GUARDIAN_PROGRAM": "{guard}"}, [], "patched, all on"),
    ("no cgroup", "patched", {"DDPRUN_PRICE_NO_CGROUP": "1"}, [], "patched, all on"),
    ("no state area", "built", {}, ["--no_state"], "as built"),
    ("no hang watch", "built", {}, ["--worker_timeout=0"], "as built"),
    ("not PIE", "nopie", {}, [], "patched, all on"),
    ("the three out", "nopie", {"DDPRUN_PRICE_NO_GUARDIAN": "1"}, ["--no_state"], "patched, all on"),
]


def run(cmd, **kw):
    print("+ " + " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, **kw)


def git(*args):
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, check=True).stdout


def build_patched(build_dir, jobs):
    """The patched ddprun and its -no-pie link, from a worktree of HEAD with this checkout's changes
    and the patch: (patched, nopie) paths. A worktree made from other sources is made again."""
    src = os.path.join(build_dir, "src")
    changes = git("diff", "HEAD", "--binary")
    with open(os.path.join(ROOT, "bench", "launch_price.patch"), "rb") as f:
        patch = f.read()
    stamp = hashlib.sha256(git("rev-parse", "HEAD") + changes + patch).hexdigest()
    stamp_file = os.path.join(build_dir, "sources")
    if not os.path.isfile(stamp_file) or open(stamp_file).read() != stamp:
        if os.path.exists(stamp_file):
            os.remove(stamp_file)
        if os.path.isdir(src):
            run(["git", "-C", ROOT, "worktree", "remove", "--force", src])
        run(["git", "-C", ROOT, "worktree", "add", "--detach", src, "HEAD"], stdout=subprocess.DEVNULL)
        for name, diff in (("changes", changes), ("launch_price.patch", patch)):
            if diff:
                path = os.path.join(build_dir, name + ".diff")
                with open(path, "wb") as f:
                    f.write(diff)
                run(["git", "-C", src, "apply", path])
        with open(stamp_file, "w") as f:
            f.write(stamp)
    out = os.path.join(build_dir, "build")
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    run(["cmake", "-S", src, "-B", out, *gen, "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
         "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"], stdout=subprocess.DEVNULL)
    run(["cmake", "--build", out, "-j", str(jobs), "--target", "ddprun"], stdout=subprocess.DEVNULL)
    patched = os.path.join(out, "launcher", "ddprun")
    nopie = os.path.join(build_dir, "ddprun-nopie")
    if gen:  # the same link again, with -no-pie (ninja says the command)
        link = subprocess.run(["ninja", "-C", out, "-t", "commands", "launcher/ddprun"], capture_output=True,
                              text=True, check=True).stdout.strip().splitlines()[-1]
        link = link.replace("-o launcher/ddprun", "-o " + nopie + " -no-pie")
        run(["sh", "-c", f"cd {out} && {link}"])
    else:
        nopie = None
    return patched, nopie


def time_runs(timer, cmd, env, runs):
    """Median wall time (ms) of `runs` launches, timed one after the other by the C timer."""
    out = subprocess.run([timer, "time", str(runs)] + cmd, env=env, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True)
    if out.returncode != 0:  # (the timer puts the command's output on /dev/null: run it once more to say why)
        again = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        sys.exit(f"launch_price.py: {' '.join(cmd)} failed (exit {again.returncode}): {again.stderr.strip()[-2000:]}")
    return statistics.median(int(line.split()[0]) for line in out.stdout.splitlines() if line.strip()) / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ddprun", default=os.path.join(ROOT, "build", "launcher", "ddprun"))
    ap.add_argument("--floor", default=os.path.join(ROOT, "build", "bench", "spawn_floor"))
    ap.add_argument("--sizes", default="1,8,64")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--runs", type=int, default=9, help="launches per variant and round (their median counts)")
    ap.add_argument("--build-dir", help="where to build the patched ddprun (kept; default: a temporary folder)")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    for path in (a.ddprun, a.floor):
        if not os.access(path, os.X_OK):
            sys.exit(f"launch_price.py: {path} is not built (scripts/setup.sh builds it)")
    with tempfile.TemporaryDirectory(prefix="launch-price-") as tmp:
        build_dir = a.build_dir or os.path.join(tmp, "b")
        os.makedirs(build_dir, exist_ok=True)
        try:
            patched, nopie = build_patched(build_dir, a.jobs)
            # Each program copied, as bench/launcher_bench.py does (a file just linked takes more
            # page faults to start than one installed or copied).
            bins = {}
            for key, path in (("built", a.ddprun), ("patched", patched), ("nopie", nopie),
                              ("floor", a.floor)):
                if path:
                    bins[key] = os.path.join(tmp, key)
                    shutil.copy2(path, bins[key])
            guard = os.path.join(tmp, "guard")
            run(["cc", "-O2", "-o", guard, os.path.join(ROOT, "bench", "launch_price_guard.c")])
            report(a, bins, guard)
        finally:
            if not a.build_dir:
                subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", os.path.join(build_dir, "src")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def report(a, bins, guard):
    variants = [v for v in VARIANTS if v[1] in bins and v[4] in [w[0] for w in VARIANTS if w[1] in bins]]
    sizes = [int(n) for n in a.sizes.split(",")]
    print(f"Launch + teardown of N /bin/true workers: median of {a.runs} runs per round, {a.rounds} rounds, "
          "variants interleaved (order reversed every other round); ratio: the median of each round's "
          "time over the floor's in that round")
    print(f"{'':18s}" + "".join(f" | {'N=' + str(n) + ' ms':>9s} {'/ floor':>8s} {'saves':>8s}" for n in sizes))
    table = {}
    for n in sizes:
        floor_cmd = [bins["floor"], "launch", str(n), "/bin/true"]
        times = {name: [] for name, *_ in variants}
        times["floor"] = []
        for r in range(a.rounds):
            order = [("floor", None, {}, [], None)] + variants
            for name, key, extra, flags, _ in (order if r % 2 == 0 else order[::-1]):
                env = dict(os.environ, **{k: v.format(guard=guard) for k, v in extra.items()})
                cmd = floor_cmd if name == "floor" else [bins[key], "--standalone", f"--nproc_per_node={n}",
                                                         *flags, "--no_python", "/bin/true"]
                times[name].append(time_runs(bins["floor"], cmd, env, a.runs))
        floor = times["floor"]
        for name, _, _, _, against in variants:
            ms = statistics.median(times[name])
            ratio = statistics.median(t / f for t, f in zip(times[name], floor))
            table.setdefault(name, []).append((ms, ratio, statistics.median(times[against]) - ms))
        table.setdefault("floor", []).append((statistics.median(floor), 1.0, None))
    for name in ["floor"] + [v[0] for v in variants]:
        cells = "".join(f" | {ms:9.3f} {ratio:7.2f}x {'' if s is None else f'{s:+8.3f}':>8s}"
                        for ms, ratio, s in table[name])
        print(f"{name:18s}{cells}")
    print("saves: the median of the row it is against (as built; patched, all on for the patched builds) minus "
          "the variant's (ms); a negative figure costs more")


if __name__ == "__main__":
    main()
