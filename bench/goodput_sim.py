#!/usr/bin/python3
"""What recovery costs a long job at scale, on paper: a discrete-event simulation of 30 days of
training at 1,024, 16,384 and 131,072 GPUs, printing the share of the time spent training
(goodput) for torchrun with disk checkpoints, and ddprun with disk checkpoints, with in-memory
state (ddprun.state, copies on the node: today), with its disk checkpoints written in the
background (ddprun.state.persist: today), and with in-memory state copied to a buddy node
(today).

  bench/goodput_sim.py [--days 30] [--seeds 20] [--validate]

The model. Failures arrive as a Poisson process at the job's published rate; each is a node's loss
(hardware) with probability P_NODE, else a worker's crash (software). Training progress accrues
while the job trains; a disk checkpoint every INTERVAL of progress stalls it SAVE_STALL; in-memory
state saves every step and costs a share STATE_TAX of every step's time. At a failure the job
loses the progress since its last checkpoint (in memory: since the last step, uniform over one
step), then is down for detection + restart + restore (a failure while down starts the recovery
again). Goodput = progress / wall time.

Every input is in INPUTS below with its source: published (the paper or report), measured here
(docs/benchmarks.md), or assumed (said so). --validate runs DLRover's published case (about 1k
GPUs, a checkpoint every ~1.5 h, 8 minutes to load it: goodput about 90% with disk checkpoints)
through the same model. Every set-up keeps checkpointing to disk at INTERVAL, with its stall, but
the persist set-up, whose disk checkpoints stall nothing and come no more often than one takes to
write (PERSIST_WRITE).
"""
import argparse
import random
import statistics

# Mean time to a job-interrupting failure, hours, by GPUs.
MTTF_H = {
    1024: (7.9, "published: Meta, 'Revisiting Reliability in Large-Scale ML Research Clusters' (Kokolis et al., HPCA 2025), its failure model's projection: 7.9 h at 1,024 GPUs"),
    16384: (1.8, "published: the same paper, 1.8 h at 16,384 GPUs (Llama 3: 419 interruptions in 54 days on 16,384 GPUs, 3.1 h)"),
    131072: (1.8 * 16384 / 131072, "assumed: the 16,384-GPU rate per GPU, x8 GPUs (13.5 min)"),
}
P_NODE = (0.78, "published: Llama 3 (Meta, 2024): 78% of unexpected interruptions were hardware (GPU, HBM, host)")

STEP_S = (10.0, "assumed: a 10 s step (large models; the stall and the lost step scale with it)")
INTERVAL_S = (5400.0, "published: DLRover, ~1.5 h between disk checkpoints on ~1k-GPU jobs")
LOAD_DISK_S = (480.0, "published: DLRover, 8 minutes to load a checkpoint on ~1k-GPU jobs")
SAVE_STALL_S = (60.0, "assumed: 60 s of training stalled per disk checkpoint (measured here at 1 GB a rank: 0.8-1.1 s; at scale the shared filesystem dominates)")
STATE_TAX = (0.006, "measured here: ddprun.state.save every step stalls 0.1-0.6% of a step (docs/benchmarks.md, in-memory state)")
LOAD_MEMORY_S = (0.84, "measured here: 0.84 s to load 1 GB a rank from ddprun.state (docs/benchmarks.md; 2.17 s in a loaded run)")
PERSIST_STALL_S = (0.0, "measured here: ddprun.state.persist every 5 steps adds no stall a step (4.1 ms with it, 4.2 ms without, at 1 GB a rank: docs/benchmarks.md)")
PERSIST_WRITE_S = (60.0, "assumed: a background persist takes as long as a stalled disk save did (SAVE_STALL); none more often than that")
LOAD_BUDDY_S = (12.0, "assumed: a lost node's state from its buddy, 100 GB a node at 10 GB/s (measured here: 1 GB a node, two ranks' two newest saves, in place in 2.7 s over a namespaced link: docs/benchmarks.md)")

# Per failure kind: detection + restart, seconds, by launcher. (crash: a worker dies; node: a host is lost.)
RECOVERY = {
    "torchrun": {"crash": (2.5 + 4.46, "measured here: torchrun's monitor_interval 5 s (2.5 s on average) + 4.46 s restart (docs/benchmarks.md)"),
                 "node": (30 + 21.0, "assumed 30 s to notice a lost host (its rendezvous keep-alive) + measured here 21.0 s for a waiting host to take its place (docs/benchmarks.md)")},
    "ddprun": {"crash": (0.89, "measured here: a crash on one of 256 nodes -> every node's new worker started, 0.89 s (docs/benchmarks.md, fleet)"),
               "node": (15 + 0.83, "default keep-alive: 3 x 5 s to notice a lost host + measured here 0.83 s for a waiting host to take its place")},
}

SETUPS = [
    # name, launcher, state kept in memory for (crash, node), disk checkpoints in the background
    ("torchrun + disk checkpoints", "torchrun", (False, False), False),
    ("ddprun + disk checkpoints", "ddprun", (False, False), False),
    ("ddprun + ddprun.state (copies on the node: today)", "ddprun", (True, False), False),
    ("ddprun + ddprun.state + persist (today)", "ddprun", (True, False), True),
    ("ddprun + ddprun.state + buddy copies (today)", "ddprun", (True, True), False),
]


def simulate(days, mttf_h, launcher, in_memory, seed, p=None):
    """One run: the share of wall time that was training progress."""
    p = p or {}
    rng = random.Random(seed)
    step, interval = p.get("step", STEP_S[0]), p.get("interval", INTERVAL_S[0])
    stall, tax = p.get("stall", SAVE_STALL_S[0]), STATE_TAX[0]  # every set-up still checkpoints to disk
    horizon = days * 86400.0
    t = progress = disk = 0.0  # wall time, training done, training in the last disk checkpoint
    next_failure = rng.expovariate(1.0 / (mttf_h * 3600))
    speed = 1.0 / (1.0 + tax) if any(in_memory) else 1.0  # progress per second while training
    while t < horizon:
        # Train until the next disk checkpoint (and its stall) or the failure, whichever is first.
        to_checkpoint = (disk + interval - progress) / speed
        if t + to_checkpoint + stall <= next_failure:
            t += to_checkpoint + stall
            progress = disk = disk + interval
            continue
        progress += max(0.0, min(next_failure - t, to_checkpoint)) * speed
        t = next_failure
        kind = "node" if rng.random() < p.get("p_node", P_NODE[0]) else "crash"
        if in_memory[0] if kind == "crash" else in_memory[1]:  # back to the last committed step
            # (a lost node: to the last replicated one, one save more at most: the buddy's lag)
            progress = max(disk, progress - rng.uniform(0, step) - (step if kind == "node" else 0))
            restore = LOAD_MEMORY_S[0] if kind == "crash" else LOAD_BUDDY_S[0]
        else:  # back to the last disk checkpoint
            progress = disk
            restore = p.get("load", LOAD_DISK_S[0])
        down = RECOVERY[launcher][kind][0] + restore
        next_failure = t + rng.expovariate(1.0 / (mttf_h * 3600))
        while next_failure < t + down:  # failed again while recovering: start over
            t = next_failure
            next_failure = t + rng.expovariate(1.0 / (mttf_h * 3600))
        t += down
    return progress / t


def goodput(days, seeds, mttf_h, launcher, in_memory, p=None):
    runs = [simulate(days, mttf_h, launcher, in_memory, s, p) for s in range(seeds)]
    return statistics.mean(runs), statistics.pstdev(runs)


def young_daly(mttf_h, in_memory, persist=False):
    """sqrt(2 x stall x the mean time between failures that fall back to disk); with none left to
    disk, DLRover's interval (the checkpoint still guards against losing every node at once).
    Persisted in the background (no stall): as often as one can be written."""
    to_disk = (1 - P_NODE[0]) * (not in_memory[0]) + P_NODE[0] * (not in_memory[1])
    if to_disk == 0:
        return INTERVAL_S[0]
    if persist:
        return PERSIST_WRITE_S[0]
    return (2 * SAVE_STALL_S[0] * mttf_h * 3600 / to_disk) ** 0.5


def params(persist, interval):
    return {"interval": interval, **({"stall": PERSIST_STALL_S[0]} if persist else {})}


def validate(days, seeds):
    """DLRover's case: ~1k GPUs (Meta's 7.9 h), a checkpoint every 1.5 h, 8 min to load it."""
    print("Validation against DLRover's published goodput (~1k GPUs, disk checkpoints every ~1.5 h, 8 min to load one):")
    name, launcher, mem, _persist = SETUPS[0]
    g, sd = goodput(days, seeds, MTTF_H[1024][0], launcher, mem)
    print(f"  {name:52} {100 * g:5.1f}% (+- {100 * sd:.1f}); published: about 90%")
    print("  (DLRover's in-memory figure is not comparable: how often it persists in the background is not published)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--days", type=float, default=30)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--validate", action="store_true")
    a = ap.parse_args()
    if a.validate:
        validate(a.days, a.seeds)
        print()
    print(f"Goodput over {a.days:g} days ({a.seeds} seeds; mean, +- their spread): the share of wall time spent training")
    for title, interval in [(f"disk checkpoints every {INTERVAL_S[0] / 3600:g} h (DLRover's)", lambda m, mem, persist: INTERVAL_S[0]),
                            ("disk checkpoints at the Young-Daly interval (persisted: as often as one is written)",
                             young_daly)]:
        header = f"{title:84} | " + " | ".join(f"{g:>7,} GPUs" for g in MTTF_H)
        print(header)
        print("-" * len(header))
        for name, launcher, mem, persist in SETUPS:
            cells = []
            for gpus, (mttf, _) in MTTF_H.items():
                g, sd = goodput(a.days, a.seeds, mttf, launcher, mem, params(persist, interval(mttf, mem, persist)))
                cells.append(f"{100 * g:5.1f}% +-{100 * sd:3.1f}")
            print(f"{name:84} | " + " | ".join(f"{c:>12}" for c in cells))
        print()
    print("Inputs:")
    for label, (value, source) in [("MTTF 1,024 GPUs, h", MTTF_H[1024]), ("MTTF 16,384 GPUs, h", MTTF_H[16384]),
                                   ("MTTF 131,072 GPUs, h", MTTF_H[131072]), ("share of failures losing a node", P_NODE),
                                   ("step, s", STEP_S), ("disk checkpoint interval, s", INTERVAL_S),
                                   ("disk checkpoint load, s", LOAD_DISK_S), ("disk checkpoint stall, s", SAVE_STALL_S),
                                   ("ddprun.state tax, share of a step", STATE_TAX), ("ddprun.state load, s", LOAD_MEMORY_S),
                                   ("persist stall, s", PERSIST_STALL_S), ("persist write, s", PERSIST_WRITE_S),
                                   ("buddy copy load, s", LOAD_BUDDY_S)]:
        print(f"  {label:36} {value:>9.4g}  {source}")
    for launcher, kinds in RECOVERY.items():
        for kind, (value, source) in kinds.items():
            print(f"  {launcher + ' ' + kind + ': detect + restart, s':36} {value:>9.4g}  {source}")


if __name__ == "__main__":
    main()
