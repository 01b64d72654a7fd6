#!/usr/bin/python3
"""What a crash costs a job's state, side by side in one run (docs/benchmarks.md): a PyTorch DDP
job over gloo, 2 workers, --sizes MB of state per rank, rank 1 dying halfway through the step
after --crash_step (bench/state_job.py), in three set-ups:

  torchrun + torch.save    torchrun (--torchrun) with a torch.save every --every steps
  ddprun + torch.save      the same job under ddprun
  ddprun + ddprun.state    ddprun.state.save after every step
  ... + persist            and ddprun.state.persist every --every steps (the agent writes the file)
  ..., replicated          ddprun.state.save(..., replicated=): the state is alike on both ranks
                           (DDP's), each copies half of it

For each: the steps lost (done before the crash and done again), the time from the crash to every
rank's first step after it (restart, imports, init_process_group and the state's load included),
the stall a save adds per step before the crash (torch.save's time over the steps, or the time
ddprun.state.save blocked plus the time the next optimizer step waited for its copy) and its
share of a step (without the stall), and the memory the state
takes (the checkpoint files; ddprun's areas, as written pages) with the workers' peak RSS.

With --crash_node (as root), only this, side by side with --vs OLD_DDPRUN: a worker's crash on a
node of a 2-node job (tests/multihost/state_node_test.sh crash), the time from it to every rank's
next step, and how many ranks took their state from another node (a rank that moved).

With --lost_node (as root): the same for a lost node, across three namespaced hosts
(tests/multihost/state_node_test.sh fast): h1 and h2 train (2 workers each, world 4) with
ddprun.state.save after every step and copies on each node's buddy; h2 is lost (every process
killed) after its ranks saved step 8, and h3, waiting, takes its place. Its row: the steps lost
(the buddy's lag), the loss to every rank's next step, the stall per save, and the memory h1's
agent holds (its copies of h2's state). --sizes' first size, --step_s' first step.

Usage: bench/state_bench.py [--ddprun build/launcher/ddprun] [--torchrun ../shared/tools/torchrun_fixed.py]
           [--sizes 256,1024] [--step_s 1,4] [--crash_step 8] [--every 5] [--lost_node]
       bench/state_bench.py --crash_node [--vs OLD_DDPRUN] [--rounds 2] [--sizes 256] [--step_s 1]
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "bench", "state_job.py")


def run(cmd, tmp, timeout=600):
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return p.returncode, p.stdout, records(p.stdout, "RESULT")


def records(out, tag):
    """Each "TAG k=v k=v ..." the ranks printed, as a dict. Under torchrun, which does not prefix
    its workers' lines, two ranks' lines can run together ("...=1.01TAG rank=1 ..."): split on
    the tag, not on lines."""
    return [dict(kv.split("=", 1) for kv in part.split("\n", 1)[0].split() if "=" in kv)
            for part in out.split(tag + " ")[1:]]


def one(a, setup, mb, step_s):
    tmp = tempfile.mkdtemp(prefix="state_bench_", dir=a.tmp)
    try:
        mode = {"ddprun + ddprun.state": "memory", "ddprun + ddprun.state + persist": "persist",
                "ddprun + ddprun.state, replicated": "replicated"}.get(setup, "disk")
        job = [a.python, JOB, "--mode", mode, "--state_mb", str(mb), "--step_s", str(step_s),
               "--crash_step", str(a.crash_step), "--every", str(a.every), "--dir", tmp, "--steps", str(a.crash_step + 4)]
        if setup.startswith("torchrun"):
            cmd = [a.python, a.torchrun, "--standalone", "--nproc_per_node", "2", "--max_restarts", "1"] + job[1:]
        else:
            cmd = [a.ddprun, "--standalone", "--nproc_per_node", "2", "--max_restarts", "1"] + job
        rc, out, results = run(cmd, tmp)
        after = [r for r in results if r["attempt"] == "1"]
        if rc != 0 or len(after) != 2:
            print(out[-3000:])
            return {"setup": setup, "mb": mb, "failed": f"rc {rc}"}
        with open(os.path.join(tmp, "crash")) as f:
            crash = float(f.read())
        first = max(float(open(p).read()) for p in glob.glob(os.path.join(tmp, "first.*")))
        disk = sum(os.path.getsize(p) for p in glob.glob(os.path.join(tmp, "ckpt.*.pt")) + glob.glob(os.path.join(tmp, "persist.*.state")))
        # The stall before the crash, in the steady state (from the third step: the first saves
        # also fault the area's pages in): what a save adds to each step, the worse rank's.
        steady = records(out, "STEP")
        steady = [s for s in steady if s["attempt"] == "0" and int(s["step"]) >= 2]
        per_rank = {}
        for s in steady:
            per_rank.setdefault(s["rank"], []).append((float(s["save"]) + float(s["fence"]),
                                                       float(s["time"]) - float(s["fence"])))
        stall = max(sum(x for x, _ in v) / len(v) for v in per_rank.values())
        step = max(sorted(t for _, t in v)[len(v) // 2] for v in per_rank.values())
        return {"setup": setup, "mb": mb, "lost": a.crash_step + 1 - int(after[0]["resumed"]),
                "recover": first - crash, "stall": stall, "share": stall / step if step else 0, "step": step,
                "memory": disk + sum(int(r["area"]) for r in after),
                "rss": max(int(r["rss"]) for r in after), "where": {"disk": "disk", "memory": "memfd", "replicated": "memfd"}.get(mode, "memfd + disk"),
                "copy": max(float(r["copy"]) for r in after), "load": max(float(r["load"]) for r in after)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def node_test(ddprun, mode, mb, step_s, key):
    """tests/multihost/state_node_test.sh MODE, its MEASURED line as a row (None: no `key` in it);
    `passed`: whether its checks passed."""
    env = dict(os.environ, STATE_MB=str(mb), STEP_S=str(step_s))
    env.pop("PYTHONPATH", None)
    p = subprocess.run(["bash", os.path.join(ROOT, "tests", "multihost", "state_node_test.sh"), ddprun, mode],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    line = next((l for l in p.stdout.splitlines() if "MEASURED" in l), "")
    m = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
    if p.returncode != 0 or not m.get(key):
        print(p.stdout[-3000:])
    if not m.get(key):
        return None
    m["passed"] = p.returncode == 0
    return m


def crash_node(a, mb, step_s):
    """--crash_node: state_node_test.sh crash with --ddprun, and --vs alternately, --rounds each."""
    print(f"\nA worker's crash on a node of a 2-node job: 2 namespaced hosts, 2 workers each (world 4), c10d, "
          f"a step of {step_s:g} s, rank 2 (on group rank 1) exits after its save of step 4\n")
    print("| state per rank | ddprun | crash -> every rank's next step | ranks that took their state from another node | checks |")
    print("|---|---|---|---|---|")
    for _ in range(a.rounds):
        for name, binary in [("this", a.ddprun)] + ([("--vs", a.vs)] if a.vs else []):
            m = node_test(binary, "crash", mb, step_s, "crash_to_step_s")
            if m is None:
                print(f"| {mb} MB | {name} ({binary}) | failed | | |")
                continue
            print(f"| {mb} MB | {name} ({binary}) | {float(m['crash_to_step_s']):.2f} s | {m['taken']} of 4 | "
                  f"{'passed' if m['passed'] else 'failed'} |", flush=True)


def copy_text(seconds):
    return f"{seconds:.2f} s" if seconds else ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", default=os.path.join(ROOT, "build", "launcher", "ddprun"))
    ap.add_argument("--torchrun", default=next(
        (p for p in (os.path.join(up, "shared", "tools", "torchrun_fixed.py")
                     for up in (os.path.dirname(ROOT), os.path.dirname(os.path.dirname(ROOT)))) if os.path.exists(p)), ""))
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--sizes", default="256,1024")
    ap.add_argument("--step_s", default="1,4", help="a step's seconds for each size (the last for the rest)")
    ap.add_argument("--crash_step", type=int, default=8)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--tmp", default="/tmp", help="where torch.save writes (a disk, not tmpfs)")
    ap.add_argument("--lost_node", action="store_true", help="also a lost node across 3 namespaced hosts (root)")
    ap.add_argument("--crash_node", action="store_true",
                    help="only a worker's crash on a node of a 2-node job (root), side by side with --vs")
    ap.add_argument("--vs", default="", help="--crash_node: another ddprun to run alternately (an older build)")
    ap.add_argument("--rounds", type=int, default=2, help="--crash_node: runs of each")
    a = ap.parse_args()
    setups = ["torchrun + torch.save", "ddprun + torch.save", "ddprun + ddprun.state", "ddprun + ddprun.state + persist",
              "ddprun + ddprun.state, replicated"]
    if not a.torchrun or not os.path.exists(a.torchrun):
        setups = setups[1:]
    sizes = [int(mb) for mb in a.sizes.split(",")]
    step_s = [float(x) for x in a.step_s.split(",")]
    step_s += [step_s[-1]] * (len(sizes) - len(step_s))
    if a.crash_node:
        return crash_node(a, sizes[0], step_s[0])
    rows = [one(a, s, mb, t) for mb, t in zip(sizes, step_s) for s in setups]
    print(f"\n2 workers, gloo, a step of {', '.join(f'{t:g} s' for t in step_s[:len(sizes)])} (a sleep for the "
          f"accelerator's part), rank 1 lost halfway through step {a.crash_step + 1}; torch.save and persist every {a.every} steps\n")
    print("| state per rank | set-up | steps lost | crash -> every rank's next step (of it: the state's load) | "
          "stall per step (share) | state's memory | workers' peak RSS | save thread per save |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "failed" in r:
            print(f"| {r['mb']} MB | {r['setup']} | failed: {r['failed']} | | | | | |")
            continue
        print(f"| {r['mb']} MB | {r['setup']} | {r['lost']} | {r['recover']:.2f} s ({r['load']:.2f} s) | {r['stall'] * 1000:.1f} ms "
              f"({r['share'] * 100:.1f}% of {r['step']:.2f} s) | {r['memory'] / 2**20:.0f} MB ({r['where']}) | "
              f"{r['rss'] / 2**20:.0f} MB | {copy_text(r['copy'])} |")
    if a.lost_node:
        m = node_test(a.ddprun, "fast", sizes[0], step_s[0], "lost_to_step_s")
        if m is not None and not m["passed"]:
            m = None  # its checks failed: no row to show (the test's output is printed above)
        print(f"\nA lost node: 3 namespaced hosts, 2 workers each (world 4), c10d with a 2 s TTL, a step of "
              f"{step_s[0]:g} s, h2 lost after its ranks saved step 8, h3 waiting takes its place\n")
        print("| state per rank | set-up | steps lost (the buddy's lag) | loss -> every rank's next step | "
              "stall per save | the buddy's copies (h1 agent's RSS) | parameters |")
        print("|---|---|---|---|---|---|---|")
        if m is None:
            print(f"| {sizes[0]} MB | ddprun + ddprun.state, copies on a buddy node | failed | | | | |")
        else:
            print(f"| {sizes[0]} MB | ddprun + ddprun.state, copies on a buddy node | {m['lag_steps']} (resumed at "
                  f"{m['resumed_at']}) | {float(m['lost_to_step_s']):.2f} s | {float(m['stall_per_save_s']) * 1000:.0f} ms "
                  f"({float(m['stall_per_save_s']) / step_s[0] * 100:.1f}% of {step_s[0]:g} s) | {m['agent_rss_mb']} MB | "
                  f"as a run resumed at {m['resumed_at']}, bit for bit (the test checks it) |")


if __name__ == "__main__":
    sys.exit(main())
