#!/usr/bin/python3
"""ddprun's DistributedSampler against PyTorch 1.13's, index for index, over sizes, replica
counts, ranks, epochs, shuffle and drop_last. Exits 77 when torch cannot be imported."""
import argparse
import subprocess
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testlib import skip  # noqa: E402

try:
    import torch
    from torch.utils.data.distributed import DistributedSampler
except ImportError as e:  # pragma: no cover
    skip(f"torch is not importable: {e}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True)
    args = ap.parse_args()
    cases = 0
    for n in (1, 2, 7, 100, 103, 1000, 4099):
        for world in (1, 2, 3, 4, 8):
            for shuffle in (True, False):
                for drop_last in (False, True):
                    for epoch in (0, 5):
                        for rank in range(world):
                            s = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=0,
                                                   drop_last=drop_last)
                            s.set_epoch(epoch)
                            want = list(iter(s))
                            out = subprocess.run([args.worker, "sampler", str(n), str(world), str(rank), str(int(shuffle)),
                                                  str(epoch), str(int(drop_last))], capture_output=True, text=True, check=True)
                            got = [int(x) for x in out.stdout.split()]
                            if got != want:
                                raise AssertionError(f"n={n} world={world} rank={rank} shuffle={shuffle} "
                                                     f"drop_last={drop_last} epoch={epoch}: {got[:10]} != {want[:10]}")
                            cases += 1
    print(f"{cases} sampler configurations equal PyTorch {torch.__version__}'s")


if __name__ == "__main__":
    main()
