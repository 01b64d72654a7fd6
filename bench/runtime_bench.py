#!/usr/bin/python3
"""ddprun's runtime vs PyTorch 1.13 (gloo), side by side, both launched by ddprun:

  all_reduce bus bandwidth (nccl-tests' busBw = algBw * 2(n-1)/n), 4 KiB .. 256 MiB, 2 and 4 ranks
  reduce_scatter: the ring vs all_reduce + slice (PyTorch 1.13's gloo has none)
  ResNet-50 gradient sync: one flat all_reduce vs the bucketed Reducer vs PyTorch DDP's backward
  overhead; and the share of communication the Reducer hides behind a synthetic backward

Usage: bench/runtime_bench.py [--build build] [--ranks 2,4]
"""
import argparse
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(build, n, cmd):
    env = dict(os.environ, PYTHON_EXEC="/usr/bin/python3")
    p = subprocess.run([os.path.join(build, "launcher", "ddprun"), "--standalone", f"--nproc_per_node={n}",
                        "--log_level", "warn"] + cmd, capture_output=True, text=True, env=env, timeout=1200)
    if p.returncode != 0:
        raise SystemExit(f"{cmd} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    rows = []
    for line in p.stdout.splitlines():
        _, _, body = line.partition("]:")
        if body.startswith("{"):
            rows.append(json.loads(body))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--rounds", type=int, default=2, help="alternating runs of each; the best per size counts")
    args = ap.parse_args()
    ours_bin = os.path.join(args.build, "bench", "runtime_bench")
    torch_py = os.path.join(ROOT, "bench", "torch_runtime_bench.py")
    for n in [int(x) for x in args.ranks.split(",")]:
        ours_runs, theirs_runs = [], []
        for _ in range(args.rounds):  # alternate, so that both see the same machine noise
            ours_runs.append(run(args.build, n, [ours_bin, "busbw"]))
            theirs_runs.append(run(args.build, n, [torch_py, "busbw"]))
        best = lambda runs: [max(rows, key=lambda x: x["busbw_gbps"]) for rows in zip(*runs)]  # noqa: E731
        ours, theirs = best(ours_runs), best(theirs_runs)
        print(f"\nall_reduce float32 sum, {n} ranks (busBw GB/s, best of {args.rounds} runs each; loopback, 2 cores)")
        print(f"{'bytes':>10} | {'ddprun':>8} | {'torch':>8} | {'ratio':>6}")
        for a, b in zip(ours, theirs):
            size = a["bytes"]
            label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
            print(f"{label:>10} | {a['busbw_gbps']:>8.3f} | {b['busbw_gbps']:>8.3f} | {a['busbw_gbps'] / b['busbw_gbps']:>5.2f}x",
                  flush=True)
        rs = run(args.build, n, [ours_bin, "reduce_scatter"])
        print(f"\nreduce_scatter float32 sum, {n} ranks (busBw GB/s = algBw x (n-1)/n; PyTorch 1.13's gloo has no "
              f"reduce_scatter: 'ProcessGroupGloo does not support reduce_scatter')")
        print(f"{'bytes':>10} | {'ring':>8} | {'all_reduce+slice':>16} | {'ratio':>6}")
        for x in rs:
            size = x["bytes"]
            label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
            print(f"{label:>10} | {x['ring_busbw_gbps']:>8.3f} | {x['slice_busbw_gbps']:>16.3f} | "
                  f"{x['ring_busbw_gbps'] / x['slice_busbw_gbps']:>5.2f}x", flush=True)
    n = 2
    # The Reducer target: <= 1.1x one flat all_reduce of the same bytes issued the same way
    # (asynchronously), median of 5 runs side by side.
    ratios = []
    for _ in range(5):
        x = run(args.build, n, [ours_bin, "resnet50"])[0]
        ratios.append((x["reducer_s"] / x["flat_async_s"], x["reducer_s"] / x["flat_s"], x))
    ratios.sort(key=lambda t: t[0])
    print(f"\nReducer vs one flat all_reduce, ResNet-50 on {n} ranks, 25 MiB buckets: 5 runs, each the median of 9")
    print("  vs asynchronous flat (issued the same way): " + ", ".join(f"{r[0]:.3f}x" for r in ratios) +
          f"  -> median {ratios[2][0]:.3f}x")
    print("  vs synchronous flat:                        " + ", ".join(f"{r[1]:.3f}x" for r in ratios))
    flat_probe = run(args.build, n, [ours_bin, "resnet50"])[0]
    compute_ms = round(flat_probe["flat_s"] * 1000)  # a backward as long as the communication
    r = run(args.build, n, [ours_bin, "resnet50", "--compute_ms", str(compute_ms)])[0]
    r_dev = run(args.build, n, [ours_bin, "resnet50", "--compute_ms", str(compute_ms), "--compute", "sleep"])[0]
    d = run(args.build, n, [torch_py, "ddp"])[0]
    print(f"\nResNet-50 gradient sync, {n} ranks: {r['tensors']} tensors, {r['params'] / 1e6:.1f} M float32, "
          f"{r['buckets']} buckets")
    print(f"  one flat all_reduce         : {r['flat_s'] * 1000:8.1f} ms  (asynchronous, as buckets are issued: "
          f"{r['flat_async_s'] * 1000:.1f} ms)")
    print(f"  the buckets' collectives alone: {r['split_async_s'] * 1000:8.1f} ms  (the same collectives issued directly: "
          f"what the Reducer adds is the difference)")
    print(f"  ddprun Reducer (bucketed)   : {r['reducer_s'] * 1000:8.1f} ms  ({r['reducer_s'] / r['flat_s']:.2f}x flat)")
    print(f"  PyTorch DDP backward overhead: {d['ddp_overhead_s'] * 1000:7.1f} ms  "
          f"(backward {d['backward_ddp_s'] * 1000:.1f} ms with DDP, {d['backward_local_s'] * 1000:.1f} ms without)")
    print(f"  ddprun / DDP                : {r['reducer_s'] / d['ddp_overhead_s']:.2f}x")
    for label, x in (("CPU-bound", r), ("device-like", r_dev)):
        print(f"  {label:>11} synthetic backward {x['compute_s'] * 1000:.0f} ms + sync: {x['overlapped_s'] * 1000:.1f} ms "
              f"overlapped (vs {(x['compute_s'] + x['reducer_s']) * 1000:.1f} ms in sequence): "
              f"{x['hidden'] * 100:.0f}% of the communication hidden")


if __name__ == "__main__":
    main()
