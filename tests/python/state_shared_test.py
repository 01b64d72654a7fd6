#!/usr/bin/python3
"""ddprun.state.save(..., replicated=) without ddprun: two processes in a gloo group, each with a
memfd made here as the agent makes it for its rank. The replicated part (a model's and an Adam
optimizer's state_dict; then tensors of every kind) is cut into two equal ranges of bytes, each
rank copying its own; load() gathers them (a broadcast from each) and gives back every tensor as
saved, the per-rank part too. The bad days: replicated= naming a key the state lacks (refused at
save), ranks that declared different parts replicated, of different sizes or of one size laid
out differently (each says so, load() returns None on both), and a load() without
torch.distributed (it says to call init_process_group first). And a step saved in two courses
(rounds) is not agreed on: the ranks resume at the step before.

Usage: state_shared_test.py PACKAGE_DIR (where the `ddprun` package is: build/share/ddprun/python)"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testlib import FAILURES, check, need_torch, state_area  # noqa: E402

SIZE = 64 << 20


def same(a, b):
    import torch

    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def rank_main(rank, package, init):
    """Runs in each of the two processes; exits with the count of its failures."""
    fd = state_area(SIZE)
    os.environ.update(DDPRUN_STATE_FD=str(fd), DDPRUN_STATE_BYTES=str(SIZE))
    sys.path.insert(0, package)
    import io
    from contextlib import redirect_stderr

    import ddprun.state as st
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    torch.manual_seed(0)  # alike on both ranks, as DDP keeps them
    model = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.Linear(300, 7), torch.nn.BatchNorm1d(7))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(5, 64)).sum().backward()
    optimizer.step()
    mine = {"rng": torch.get_rng_state(), "rank": torch.full((3,), float(rank)), "half": torch.ones(9).half()}
    # Every kind of tensor a replicated part may hold, each cut across the two ranges somewhere.
    g = torch.Generator().manual_seed(5)
    kinds = {"bool": torch.rand(77, generator=g) > 0.5, "bf16": torch.randn(33, generator=g).bfloat16(),
             "f16": torch.randn(5, 3, generator=g).half(), "c64": torch.randn(9, 2, generator=g).contiguous().view(
                 torch.complex64).squeeze(-1), "conj": torch.randn(4, 2, generator=g).view(torch.complex64).conj(),
             "scalar": torch.tensor(3.5, dtype=torch.float64), "empty": torch.zeros(0, 4),
             "strided": torch.arange(40, dtype=torch.int32).view(5, 8).t(), "i8": torch.arange(-7, 7, dtype=torch.int8)}
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "kinds": kinds, "mine": mine, "step": 7}
    replicated = sum(t.numel() * t.element_size() for t in model.state_dict().values()) + sum(
        v.numel() * v.element_size() for d in optimizer.state_dict()["state"].values() for v in d.values()
        if torch.is_tensor(v))

    st.save(7, state, blocking=True)
    whole = st.stats()["last_bytes"]
    st.save(8, state, blocking=True, replicated=("model", "optimizer"))
    half = st.stats()["last_bytes"]
    check(abs(whole - half - replicated / 2) < 4096,
          f"rank {rank}: a save with the model and optimizer replicated holds half their {replicated} bytes "
          f"({half} bytes, {whole} without)")
    step, back = st.load() or (None, None)
    check(step == 8 and same(back, state), f"rank {rank}: load() gathers the replicated part: every tensor as saved")
    st.save(9, state, blocking=True, replicated="kinds")  # one key, as a string
    step, back = st.load() or (None, None)
    check(step == 9 and same(back, state),
          f"rank {rank}: bool, bfloat16, float16, complex (conjugated too), 0-dim, empty and strided tensors replicated: "
          f"each back as saved")

    try:
        st.save(99, state, replicated=("model", "optimiser"))
        check(False, f"rank {rank}: replicated= naming a key the state lacks raised nothing")
    except st.StateError as e:
        check("'optimiser'" in str(e) and "top-level keys" in str(e), f"rank {rank}: a key the state lacks: {e}")

    # The ranks disagree on what is replicated: neither can gather, both say so and start without
    # it; so too where the parts are of one size but laid out differently.
    twins = {"a": torch.ones(64), "b": torch.ones(16, 4)}
    for step, keys in ((10, ("model", "optimizer") if rank == 0 else ("model",)), (11, ("a",) if rank == 0 else ("b",))):
        st.save(step, dict(state, **twins), blocking=True, replicated=keys)
        err = io.StringIO()
        with redirect_stderr(err):
            found = st.load()
        check(found is None and "not shared out alike" in err.getvalue(),
              f"rank {rank}: ranks that declared {'different' if step == 10 else 'same-sized but different'} parts "
              f"replicated: None, said ({err.getvalue().strip()!r})")

    # A state a later round abandoned (its step done again; a buddy node may still hold it) is not
    # taken for that step saved since: the agent starts each round's generations at round << 40,
    # and the ranks agree on a step and its course. Here rank 1's save of step 21 is of round 1's
    # course, rank 0's of round 0's: they agree on step 20.
    import struct

    st.save(20, state, blocking=True)
    if rank == 1:
        (latest,) = struct.unpack_from("<Q", st._area.map, 24)
        struct.pack_into("<Q", st._area.map, 24, max(latest >> 1, 1 << 40) << 1 | (latest & 1))
    st.save(21, state, blocking=True)
    err = io.StringIO()
    with redirect_stderr(err):
        found = st.load()
    check(found is not None and found[0] == 20,
          f"rank {rank}: step 21 saved in two courses: the ranks agree on step 20 ({found and found[0]}; {err.getvalue()!r})")
    st.save(22, state, blocking=True, replicated=("model", "optimizer"))
    dist.destroy_process_group()
    err = io.StringIO()
    with redirect_stderr(err):
        found = st.load()
    check(found is None and "init_process_group before load()" in err.getvalue(),
          f"rank {rank}: a shared-out state without torch.distributed: None, said ({err.getvalue().strip()!r})")
    sys.exit(len(FAILURES))


def main():
    need_torch()
    import torch.multiprocessing as mp

    package = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory(prefix="ddprun-shared-") as tmp:
        ctx = mp.start_processes(rank_main, args=(package, "file://" + os.path.join(tmp, "init")), nprocs=2,
                                 join=False, start_method="spawn")
        while not ctx.join(timeout=120):
            pass
    print("0 failed")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001  (a rank's failures: its exit code)
        print(f"FAILED: {e}")
        sys.exit(1)
