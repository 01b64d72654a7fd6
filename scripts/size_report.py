#!/usr/bin/env python3
"""Functions over ~60 lines and files over ~400 in the project's code (not tests), each with the
one-line reason it stays whole, from REASONS below; one without a reason is a prompt to look.

  scripts/size_report.py [--strict] [--root DIR]
      --strict: exit 1 if any has no reason (tests/size_report_test.sh)
      --root:   the tree to look at (default: this script's; DIR must be a git work tree)

Functions are found with Universal Ctags (`apt-get install universal-ctags`; C++ and Python, from
the end line it gives each definition).
A size is a prompt to look, never a reason to split one idea across files (docs/architecture.md).
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ["agent", "launcher", "rendezvous", "runtime", "common", "bench", "examples"]
FUNCTION_LINES, FILE_LINES = 60, 400

# "path::name" (name as ctags gives it, its enclosing scope's last part first) -> why it is whole.
REASONS = {
    "agent/src/observe/hang_verdict.cpp::agent::decide_hang":
        "the verdict's cases one after another in priority order (stopped, D, stuck, spinning, mismatch)",
    "agent/src/control/hang_exchange.cpp::HangExchange::start":
        "the exchange on its one thread: publish, gather, decide, read the verdict, in the protocol's order",
    "agent/src/control/hang_exchange.cpp::start::<lambda>":
        "the body of HangExchange::start's thread (the entry above)",
    "agent/src/workers/state_copies.cpp::StateCopies::send":
        "one round's copy loop: how long the saves have been held, when they stop waiting, the store again after a failure",
    "agent/src/agent.cpp::Impl::run_loop":
        "the job's parts declared in the order they must end (persister after the workers, copies before the controller), then the loop",
    "examples/train_mlp.cpp::::train":
        "the example's training loop, read top to bottom by users (the README's main job)",
    "runtime/src/memory_state.cpp::::load_from":
        "a native slot read in its format's order: each chunk's CRC-32, the skeleton's entries, the replicated space",
    "runtime/src/memory_state.cpp::::gather":
        "one collective sequence every rank runs alike: the agreement check, then each rank's share broadcast in turn",
    "launcher/src/option_table.cpp::::failure_options":
        "one table of flags (a single add_options chain)",
    "bench/fleet_bench.cpp::::main":
        "the bench's phases in the order they run, each a few lines",
    "bench/fleet_bench.cpp::::run_fleet":
        "one K's phases in order, each timed the same way",
    "bench/runtime_bench.py::::main":
        "the bench's arguments and the table it prints",
}


def ctags():
    for name in ("ctags-universal", "ctags"):
        for d in os.environ.get("PATH", "").split(os.pathsep):
            if os.access(os.path.join(d, name), os.X_OK):
                return name
    sys.exit("size_report.py: needs Universal Ctags: apt-get install universal-ctags")


def functions():
    out = subprocess.run([ctags(), "--output-format=json", "--fields=+ne", "--kinds-C++=f", "-R", "-f", "-"] + FOLDERS,
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        t = json.loads(line)
        if t.get("kind") not in ("function", "member") or "end" not in t:
            continue
        lines = t["end"] - t["line"] + 1
        if lines > FUNCTION_LINES:
            scope = t.get("scope", "").split("::")[-1]
            scope = "" if scope.startswith("__anon") else scope
            name = "<lambda>" if t["name"].startswith("__anon") else t["name"]
            yield lines, t["path"], t["line"], f"{scope}::{name}"


def files():
    listed = subprocess.run(["git", "ls-files"] + FOLDERS, cwd=ROOT, capture_output=True, text=True, check=True)
    for path in listed.stdout.splitlines():
        if path.endswith((".cpp", ".hpp", ".py", ".c")):
            with open(os.path.join(ROOT, path), errors="replace") as f:
                n = sum(1 for _ in f)
            if n > FILE_LINES:
                yield n, path


def main():
    global ROOT
    args = sys.argv[1:]
    if "--root" in args:
        ROOT = os.path.abspath(args[args.index("--root") + 1])
    missing = 0
    print(f"Functions over {FUNCTION_LINES} lines:")
    for lines, path, line, name in sorted(functions(), reverse=True):
        why = REASONS.get(f"{path}::{name}")
        missing += why is None
        print(f"  {lines:4} {path}:{line} {name}: {why or 'NO REASON - look'}")
    print(f"Files over {FILE_LINES} lines:")
    for n, path in sorted(files(), reverse=True):
        print(f"  {n:4} {path}")
    if missing:
        print(f"{missing} function(s) without a reason: split by meaning, or say here why not")
    return 1 if missing and "--strict" in args else 0


if __name__ == "__main__":
    sys.exit(main())
