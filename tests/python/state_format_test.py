#!/usr/bin/python3
"""ddprun.state's format and fence, in one process, without ddprun: a memfd made here as the
agent makes it stands in for the rank's area. Round trips of every kind of value, a save left
uncommitted, a corrupted slot (not loaded, said), a save too large, copy-on-write loads, loaded tensors kept when
their slot is written again, the optimizer fence (with an LR scheduler made after the import),
a native trainer's state (refused), a persist request's pin, the buddy copies' hold (while the
agent copies the saves to a buddy node, a save waits until the last one has been replicated), saves
from several threads at once, load(path) of a file and of what is no state file, a state too large
refused without all of it in memory, and a DDPRUN_STATE_FD that is not an area.

Usage: state_format_test.py PACKAGE_DIR (where the `ddprun` package is: build/share/ddprun/python)"""
import os
import re
import subprocess
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testlib import FAILURES, check, need_torch, state_area  # noqa: E402

SIZE = 16 << 20


def loaded(st):
    """load()'s result and what it said on stderr."""
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        got = st.load()
    return got, err.getvalue()


def same(a, b):
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def round_trips(st):
    import torch

    check(st.available() and st.load() is None and st.steps() == [], "a fresh area: available, nothing to load")
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    obj = {"f32": base, "t": base.t(), "view": base[1:3, 2:], "f64": torch.randn(3, dtype=torch.float64),
           "bf16": torch.randn(5).bfloat16(), "bool": torch.tensor([True, False]), "i64": torch.arange(5),
           "c64": torch.randn(2, dtype=torch.complex64), "empty": torch.zeros(0, 3), "scalar": torch.tensor(7.5),
           "big": torch.randn(100_000), "nested": [1, 2.5, "s", None, b"b", (3, {"x": torch.ones(2)})]}
    st.save(0, obj)
    st.wait()
    got = st.load()
    check(got is not None and got[0] == 0 and same(obj, got[1]), "every kind of value comes back as saved")
    check(got[1]["nested"][5][1]["x"].dtype == torch.float32 and got[1]["t"].is_contiguous(),
          "tensors come back typed, contiguous")

    # Copy-on-write: a loaded tensor written changes nothing in the area.
    got[1]["big"].add_(1)
    again = st.load()
    check(torch.equal(again[1]["big"], obj["big"]), "writing a loaded tensor leaves the saved state as it was")
    # Tensors that share a loaded tensor's memory, each kept alone (the loaded one dropped).
    derived = {"a view of a detach()": st.load()[1]["big"].detach()[10:20],
               "an nn.Parameter": torch.nn.Parameter(st.load()[1]["big"]),
               "its numpy() array": st.load()[1]["big"].numpy()}
    return again[1]["big"], obj["big"], derived


def slots(st, held, want, derived):
    import torch

    # Loaded tensors stay as loaded when their slot is written again (two saves later).
    for step in (1, 2):
        st.save(step, {"big": torch.full((100_000,), float(step))})
    st.wait()
    check(torch.equal(held, want), "a loaded tensor kept alive keeps its values when its slot is reused")
    for what, t in derived.items():
        kept = torch.as_tensor(t).detach()
        check(torch.equal(kept, want[10:20] if kept.numel() == 10 else want),
              f"{what}, made of a loaded tensor, keeps its values when its slot is reused")
    check(st.steps() == [2, 1], f"the area holds the last two steps: {st.steps()}")

    # A save left uncommitted (its commit word cleared, as by a death mid-copy): the one before.
    latest = st._area.committed()[0]
    st._area.map[st._area.offset(latest[2]):st._area.offset(latest[2]) + 8] = bytes(8)  # the commit word
    got = st.load()
    check(got is not None and got[0] == 1 and float(got[1]["big"][0]) == 1.0, "an uncommitted slot: the step before")

    # A corrupted committed slot: the CRC-32 says so, not a silent load.
    st.save(3, {"big": torch.full((100_000,), 3.0)})
    st.wait()
    slot = st._area.committed()[0][2]
    at = st._area.offset(slot) + st._PAGE + 4096
    st._area.map[at] = st._area.map[at] ^ 0xFF
    got, said = loaded(st)
    check(got is None and "CRC-32" in said and "starting without this state" in said,
          f"a corrupted slot: not loaded, and said so (every rank starts without it): {said.strip()}")
    st._area.map[at] = st._area.map[at] ^ 0xFF


def too_large_and_fence(st):
    import torch

    # Too large: a clear error, and the state before is kept.
    try:
        st.save(4, {"huge": torch.zeros(SIZE // 4)})
        check(False, "a save over the capacity raises StateTooLarge")
    except st.StateTooLarge as e:
        check(e.needed > e.capacity == st.capacity() and "--state_memory" in str(e), f"StateTooLarge: {e}")
    check(st.load()[0] == 3, "after StateTooLarge the last state is still there")
    # The --state_memory it names is enough: one rank's area of that size holds the state, for
    # sizes on each side of the page boundaries of an area's two slots.
    short = []
    for mib in (2, 17):
        for needed in range(mib * 2**19 - 3 * st._PAGE, mib * 2**19, 256):
            m = int(re.search(r"at least (\d+)M", str(st.StateTooLarge(needed, 0))).group(1))
            area = st._Area(state_area(m << 20), m << 20)
            if area.capacity() < needed:
                short.append((needed, m))
            area.close()
    check(not short, f"StateTooLarge names a --state_memory whose area holds the state (short: {short[:3]})")

    # The fence: an optimizer's step (and an LR scheduler's, made after the import) waits for the copy.
    model = torch.nn.Linear(512, 512)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 10)
    st.save(5, {"model": model.state_dict()})
    model(torch.randn(2, 512)).sum().backward()
    opt.step()
    check(st._pending is None, "optimizer.step() waited for the save's copy")
    st.save(6, {"model": model.state_dict()})
    sched.step()
    opt.step()
    check(st._pending is None and st.stats()["saves"] >= 6, "... also when stepped through an LR scheduler's wrapper")


def native_state(st):
    # A native trainer's state (ddprun::runtime::MemoryState: its skeleton is not a pickle) in
    # the area: refused with a clear error, not unpickled.
    newest = st._area.committed()[0]
    st._write(st._area, 1 - newest[2], newest[0] + 1, 9, [b"DDPRUNN1" + bytes(4)], [], 0)
    got, said = loaded(st)
    check(got is None and "native trainer" in said, f"a native trainer's state: not loaded, and said so: {said.strip()}")


def tied(st):
    import torch

    # Tied weights (one Parameter under two names: state_dict() gives each a detach()) are saved
    # once, and load as one memory: a model of a bit over half the capacity fits.
    n = st.capacity() * 6 // 10 // 4
    emb, head = torch.nn.Embedding(n // 8, 8), torch.nn.Linear(8, n // 8, bias=False)
    head.weight = emb.weight
    model = torch.nn.Sequential(emb, head)
    sd = model.state_dict()
    check(sd["0.weight"] is not sd["1.weight"] and sd["0.weight"].data_ptr() == sd["1.weight"].data_ptr(),
          "state_dict() of tied weights: two tensors over one memory")
    try:
        square = torch.randn(3, 3)
        st.save(10, {"model": sd, "square": square, "t": square.t()})
        st.wait()
    except st.StateTooLarge as e:
        check(False, f"tied weights saved once: {e}")
        return
    got = st.load()
    w0, w1, t = got[1]["model"]["0.weight"], got[1]["model"]["1.weight"], got[1]["t"]
    check(got[0] == 10 and torch.equal(w0, emb.weight) and w0.data_ptr() == w1.data_ptr(),
          "... they load as one memory, with their values")
    check(torch.equal(t, square.t()) and torch.equal(got[1]["square"], square), "a transposed view of a tensor stays its own")
    fresh = torch.nn.Sequential(torch.nn.Embedding(n // 8, 8), torch.nn.Linear(8, n // 8, bias=False))
    fresh[1].weight = fresh[0].weight
    fresh.load_state_dict(got[1]["model"])
    check(torch.equal(fresh[1].weight, emb.weight) and fresh[1].weight is fresh[0].weight,
          "... and into a tied model, still tied")


def parameters(st):
    import torch

    # Parameters saved bare (not through state_dict(): a list of them, an optimizer's own) come
    # back Parameters, requires_grad as saved, and over one memory with a plain tensor of the
    # same memory saved beside them.
    w = torch.nn.Parameter(torch.randn(4, 3))
    frozen = torch.nn.Parameter(torch.randn(2), requires_grad=False)
    st.save(11, {"params": [w, frozen], "plain": w.detach(), "t": torch.ones(2)})
    st.wait()
    got = st.load()[1]
    p0, p1 = got["params"]
    check(type(p0) is torch.nn.Parameter and p0.requires_grad and torch.equal(p0, w),
          f"an nn.Parameter loads as one, with its values (got {type(p0).__name__})")
    check(type(p1) is torch.nn.Parameter and not p1.requires_grad, "... and a frozen one stays frozen")
    check(type(got["plain"]) is torch.Tensor and got["plain"].data_ptr() == p0.data_ptr(),
          "a plain tensor of its memory stays a tensor, over the same memory")
    check(type(got["t"]) is torch.Tensor and not got["t"].requires_grad, "a plain tensor stays a plain tensor")


def pinned(st):
    # A persist request pins a state until the agent has copied it: the save that would write
    # its slot waits on its thread (both committed states stay whole), then goes on; a save never
    # reuses a generation a request named. No agent here: the test answers as one.
    import struct
    import time

    import torch

    fd = st._area.fd
    for step in (100, 101):
        st.save(step, {"x": torch.full((1 << 16,), float(step))})
    st.wait()
    gen100 = st._area.committed()[1][0]
    (number,) = struct.unpack("<Q", os.pread(fd, 8, 2048))
    number += 2 + (number & 1)
    os.pwrite(fd, struct.pack("<QQ", number, gen100), 2048)  # a whole request for step 100
    st.save(102, {"x": torch.full((1 << 16,), 102.0)})
    time.sleep(0.3)
    check(st._pending.thread.is_alive() and st.steps() == [101, 100],
          f"a save over the pinned state waits, both committed states whole: {st.steps()}")
    os.pwrite(fd, struct.pack("<Q", number), 1536)  # the agent's "copied"
    st.wait()
    check(st.steps() == [102, 101], f"once copied, the save goes on: {st.steps()}")
    os.pwrite(fd, struct.pack("<QQ", number + 2, 500), 2048)  # a request for a save that never ended
    os.pwrite(fd, struct.pack("<Q", number + 2), 1536)
    st.save(103, {"x": torch.zeros(3)}, blocking=True)
    check(st._area.committed()[0][:2] == (501, 103), f"the next save is generation 501: {st._area.committed()}")
    # No agent answers the next request: a blocking persist with a time-out says so once it is out.
    t0 = time.monotonic()
    try:
        st.persist("/tmp/never.state", blocking=True, timeout=0.2)
        check(False, "persist(blocking=True, timeout=0.2) without an agent raised nothing")
    except st.StateError as e:
        check("had not written /tmp/never.state after 0.2 s" in str(e) and time.monotonic() - t0 < 5,
              f"persist(blocking=True, timeout=0.2) without an agent: {e}")
    (number,) = struct.unpack("<Q", os.pread(fd, 8, 2048))
    os.pwrite(fd, struct.pack("<Q", number), 1536)  # the agent's "copied" for it
    for bad in ({"timeout": 1}, {"blocking": True, "timeout": 0}):
        try:
            st.persist("/tmp/never.state", **bad)
            check(False, f"persist({bad}) raised nothing")
        except st.StateError as e:
            check("needs blocking=True" in str(e), f"persist({bad}) is refused, saying what it needs: {e}")


def whole(st):
    """Whether every committed slot's payload passes its CRC-32s."""
    for _gen, _step, slot in st._area.committed():
        _gen, _step, skel, data, chunk, crcs = st._area.slot(slot)
        base = st._area.offset(slot) + st._PAGE
        payload = memoryview(st._area.map)[base:base + st._align(skel) + data]
        try:
            if not st._verified(payload, chunk, crcs):
                return False
        finally:
            payload.release()
    return True


def copies_hold(st):
    # While the agent copies this area's saves to a buddy node (copies, at 1552, is 1), every save
    # first waits on its thread until the area's newest committed generation (the header's latest
    # >> 1, at 24) has been replicated (replicated, at 1544: the newest generation whose step every
    # rank's buddy holds): each save waits for the last one to reach every rank's buddy. Both
    # committed states stay whole meanwhile. The agent (here another thread, playing it) lets go by
    # writing the newest generation into replicated; after the wait's limit the save goes on and
    # says what that costs. No agent here: the test writes both words as one would.
    import contextlib
    import io
    import struct
    import threading
    import time

    import torch

    fd = st._area.fd

    def newest():
        return struct.unpack("<Q", os.pread(fd, 8, 24))[0] >> 1

    def put(replicated=None, copies=None):
        if replicated is not None:
            os.pwrite(fd, struct.pack("<Q", replicated), 1544)
        if copies is not None:
            os.pwrite(fd, struct.pack("<Q", copies), 1552)

    step = 200
    for s in (step, step + 1):
        st.save(s, {"x": torch.full((1 << 16,), float(s))})
    st.wait()

    # (a) Copies on, the newest state replicated: a save goes on at once.
    put(replicated=newest(), copies=1)
    t0 = time.monotonic()
    st.save(step + 2, {"x": torch.full((1 << 16,), float(step + 2))}, blocking=True)
    check(time.monotonic() - t0 < 0.5 and st.steps() == [step + 2, step + 1] and whole(st),
          f"copies on, the newest state replicated: a save does not wait: {st.steps()}")

    # (b) Copies on, the newest state not yet replicated: a save waits, both committed states whole,
    # until the agent writes the newest generation into replicated.
    behind = st._area.committed()[1][0]
    put(replicated=behind)
    check(newest() > behind, f"replicated ({behind}) is older than the newest generation ({newest()})")
    clear = threading.Timer(0.6, put, kwargs={"replicated": newest()})  # the agent: the newest is replicated
    clear.start()
    t0 = time.monotonic()
    st.save(step + 3, {"x": torch.full((1 << 16,), float(step + 3))})
    time.sleep(0.3)
    check(st._pending.thread.is_alive() and st.steps() == [step + 2, step + 1] and whole(st),
          f"copies on, the newest state not replicated: a save waits, both committed states whole: {st.steps()}")
    st.wait()
    clear.join()
    check(time.monotonic() - t0 >= 0.55 and st.steps() == [step + 3, step + 2] and whole(st),
          f"once the newest state is replicated, the save goes on: {st.steps()}")

    # (c) Copies off: no wait, however old replicated is.
    put(replicated=behind, copies=0)
    check(newest() > behind, "replicated is older than the newest generation")
    t0 = time.monotonic()
    st.save(step + 4, {"x": torch.zeros(3)}, blocking=True)
    check(time.monotonic() - t0 < 0.5 and st.steps() == [step + 4, step + 3] and whole(st),
          f"copies off, replicated behind: a save does not wait: {st.steps()}")

    # (d) Copies on and the newest state never replicated: after the limit the save goes on over
    # the older state, and says so once, naming its step.
    put(replicated=behind, copies=1)
    over = st.steps()[1]
    limit, st._PIN_WAIT_S = st._PIN_WAIT_S, 0.2
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            st.save(step + 5, {"x": torch.zeros(3)}, blocking=True)
    finally:
        st._PIN_WAIT_S = limit
        put(replicated=0, copies=0)
    said = err.getvalue()
    want = (f"ddprun.state: this rank's last save has not reached every rank's buddy node in {0.2:g} s; saving over "
            f"the state of step {over} (if a node is lost now, its ranks' state may be lost with it)")
    check(st.steps() == [step + 5, step + 4] and said.count("ddprun.state:") == 1 and said.strip() == want,
          f"the newest state never replicated: saved over step {over} after the limit, said once: {said.strip()}")


def count_again(st):
    # A save of a lower step than one the rank holds (a count started again): said, and load()
    # takes the highest step held, alone as ranks agreeing on the highest step they all hold do
    # (it took the newest save alone: a job's ranks and one rank loaded different states).
    import torch

    st.save(300, {"x": torch.full((1 << 16,), 300.0)})
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        st.save(3, {"x": torch.full((1 << 16,), 3.0)}, blocking=True)
    held = st.steps()
    got = st.load()
    check(held == [3, 300] and got[0] == 300 and float(got[1]["x"][0]) == 300.0 and st.steps() == [300] and
          any("step 3 is below step 300" in str(w.message) for w in said),
          f"a count started again: said, the highest step (300) loaded, the newer save dropped as agreeing ranks "
          f"drop it: {held} -> {st.steps()}, {[str(w.message) for w in said]}")
    for step in (301, 302):
        st.save(step, {"x": torch.full((1 << 16,), float(step))}, blocking=True)
    check(st.steps() == [302, 301], f"then steps increase again: {st.steps()}")

    # Tensors that are not dense refused at once, each named as what it is.
    for what, t in (("sparse", torch.ones(3).to_sparse()),
                    ("quantized", torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.quint8))):
        try:
            st.save(305, {"x": t})
            check(False, f"a {what} tensor is refused")
        except st.StateError as e:
            check(what in str(e) and st.steps() == [302, 301], f"a {what} tensor refused, named: {e}")

    # A step that is not a whole number from 0 to 2^63-1 is refused at once, nothing written
    # (int() would save 12.9 as 12; 2^63 failed on the copy's thread, at the next step).
    for bad in (12.9, -1, 2**63, "5", None, True, torch.tensor(5.5)):
        try:
            st.save(bad, {"x": torch.zeros(3)})
            check(False, f"step {bad!r} is refused")
        except st.StateError as e:
            check("step" in str(e) and st._pending is None and st.steps() == [302, 301], f"step {bad!r} refused: {e}")
    st.save(torch.tensor(303), {"x": torch.zeros(3)}, blocking=True)
    st.save(304.0, {"x": torch.zeros(3)}, blocking=True)
    check(st.steps() == [304, 303], f"an integer tensor's value and a whole float are steps: {st.steps()}")
    try:
        st.save(305, {"x": torch.zeros(3)}, replicated=5)
        check(False, "replicated=5 is refused")
    except st.StateError as e:
        check("replicated=" in str(e) and st.steps() == [304, 303], f"replicated=5 refused, saying what it takes: {e}")

    # load() in a job of several ranks before init_process_group: said (each rank takes its own).
    os.environ["WORLD_SIZE"] = "2"
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            got = st.load()
    finally:
        del os.environ["WORLD_SIZE"]
    check(got[0] == 304 and any("before init_process_group" in str(w.message) for w in said),
          f"load() before init_process_group in a job of 2 ranks: said: {[str(w.message) for w in said]}")


class SavesWhenLoaded:
    """Saves as it is unpickled (by load())."""

    def __init__(self):
        self.state = 1  # (an object without state is unpickled without __setstate__)

    def __setstate__(self, _state):
        sys.modules["ddprun.state"].save(1, {})


def threads(st):
    # Saves from several threads at once (a training thread and a checkpoint thread) are made one
    # after the other: the state loaded is one save, whole, never a mix of two.
    import threading

    import torch

    step, mixed = 1000, []
    for _round in range(20):
        start = threading.Barrier(4)

        def one(s, n):
            start.wait()
            st.save(s, {"step": s, "t": torch.full((n,), float(s))})

        workers = [threading.Thread(target=one, args=(step + k, 50_000 + 1000 * k)) for k in range(4)]
        step += 4
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (a step below one held: the threads' order is the scheduler's)
            for w in workers:
                w.start()
            for w in workers:
                w.join()
        got, said = loaded(st)
        if got is None or got[1]["step"] != got[0] or got[1]["t"].unique().tolist() != [float(got[0])]:
            mixed.append((got and got[0], got and got[1]["step"], said.strip()[:200]))
    check(not mixed, f"saves from four threads at once: each state loaded is one save, whole (not: {mixed[:3]})")

    class SavesWhilePickled:
        def __reduce__(self):
            st.save(step + 1, {})
            return (dict, ())

    held = st.steps()
    try:
        st.save(step, {"x": SavesWhilePickled()})
        check(False, "a save() from within save()'s pickling is refused")
    except st.StateError as e:
        check("while this thread is inside save() or load()" in str(e) and st.steps() == held,
              f"a save() from within save()'s pickling is refused, the last state kept: {e}")

    # ... and from within load()'s unpickling: that load fails (said), it does not wait on itself.
    st.save(step + 1, {"x": SavesWhenLoaded()}, blocking=True)
    got, said = loaded(st)
    check(got is None and "while this thread is inside save() or load()" in said,
          f"a save() from within load() is refused: load() says so and returns None ({said.strip()[:160]})")

    # A forked child (a DataLoader worker, an async checkpoint) shares the worker's area: refused.
    child = os.fork()
    if child == 0:
        try:
            st.save(step + 3, {})
            os._exit(3)
        except st.StateError as e:
            os._exit(0 if "called in a process forked from the worker" in str(e) else 4)
    check(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0, "a save() in a forked child is refused")

    # An optimizer step's fence (wait()) on another thread while saves go on: every save waits
    # for the last one's copy, so no two copies ever write at once.
    writing, overlaps, guard = [], [], threading.Lock()
    real_write = st._write

    def spied(*args):
        with guard:
            if writing:
                overlaps.append((args[1], list(writing)))
            writing.append(args[1])
        try:
            return real_write(*args)
        finally:
            with guard:
                writing.remove(args[1])

    st._write, done = spied, threading.Event()
    fencer = threading.Thread(target=lambda: [st._fence() for _ in iter(done.is_set, True)])
    fencer.start()
    try:
        for s in range(step + 10, step + 160):
            st.save(s, {"t": torch.full((500_000,), float(s))})
    finally:
        done.set()
        fencer.join()
        st._write = real_write
    st.wait()
    got = st.load()
    check(not overlaps and got[0] == step + 159 and got[1]["t"].unique().tolist() == [float(step + 159)],
          f"saves beside a fence on another thread: no two copies at once (overlaps: {overlaps[:3]}), the last whole")


def files(st):
    # load(path) of a file persist() wrote, and of what is no state file.
    import resource
    import stat
    import tempfile

    import torch

    tmp = tempfile.mkdtemp()
    want = torch.arange(1 << 20, dtype=torch.float32)
    st.save(2000, {"t": want}, blocking=True)
    # The file persist() writes: the area's layout with one slot (as the agent writes it).
    area, (gen, _step, slot) = st._area, st._area.committed()[0]
    _c, _g, _s, skel, data = st._SLOT.unpack_from(area.map, area.offset(slot))[:5]
    slot_bytes = st._PAGE + -(-(st._align(skel) + data) // st._PAGE) * st._PAGE
    path = os.path.join(tmp, "rank0.state")
    with open(path, "wb") as f:
        head = bytearray(st._PAGE)
        st._HEADER.pack_into(head, 0, st._MAGIC, st._VERSION, 1, slot_bytes, gen << 1)
        f.write(head + area.map[area.offset(slot):area.offset(slot) + slot_bytes])
    got, said = loaded_from(st, path)
    check(got is not None and got[0] == 2000 and torch.equal(got[1]["t"], want), f"load(path): the state ({said})")
    fifo = os.path.join(tmp, "fifo.state")
    os.mkfifo(fifo)
    for what, where, says in [("a FIFO", fifo, f"{fifo} is a FIFO, socket or device"),
                              ("a directory", tmp, f"{tmp} is a directory"),
                              ("a missing folder", "/nonexistent/rank0.state", "there is no folder /nonexistent")]:
        t0 = time.monotonic()
        got, said = loaded_from(st, where)
        check(got is None and says in said and time.monotonic() - t0 < 5, f"load() of {what}: None, said: {said.strip()}")
    got, said = loaded_from(st, os.path.join(tmp, "first_run.state"))
    check(got is None and said == "", f"load() of a missing file in a folder that is there: None, silent ({said!r})")
    # A state too large is refused after pickling at most a slot's worth of it (a big bytes
    # value is pickled into the skeleton): not all of it held in memory first.
    big = bytes(200 << 20)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        st.save(2001, {"blob": big})
        check(False, "a 200 MB bytes value in an 8 MB slot raises StateTooLarge")
    except st.StateTooLarge as e:
        grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) >> 10
        check(e.needed > 200 << 20 and grew < 64, f"StateTooLarge for 200 MB with its size ({e.needed}), the process "
              f"grown by {grew} MB (under 64)")
    check(stat.S_ISFIFO(os.stat(fifo).st_mode) and st.load()[0] == 2000, "the last state kept")


def loaded_from(st, path):
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        got = st.load(path)
    return got, err.getvalue()


def not_an_area():
    # A descriptor that is not an area (a subprocess that inherited the variables, not the memfd).
    code = ("import warnings, ddprun.state as s; warnings.simplefilter('always'); "
            "print(s.load(), s.available(), s.save(0, {}))")
    with open(os.devnull) as null:
        env = dict(os.environ, DDPRUN_STATE_FD=str(null.fileno()), PYTHONPATH=os.path.abspath(sys.argv[1]))
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, pass_fds=[null.fileno()])
    check(r.stdout.strip() == "None False None" and r.stderr.count("is not this process's state area") == 1,
          f"DDPRUN_STATE_FD on another file: one warning, nothing loaded or saved: {r.stdout!r} {r.stderr[-200:]!r}")


def main():
    need_torch()
    sys.path.insert(0, os.path.abspath(sys.argv[1]))
    fd = state_area(SIZE)
    os.environ.update(DDPRUN_STATE_FD=str(fd), DDPRUN_STATE_BYTES=str(SIZE))
    import ddprun.state as st

    held, want, derived = round_trips(st)
    slots(st, held, want, derived)
    too_large_and_fence(st)
    native_state(st)
    tied(st)
    parameters(st)
    pinned(st)
    copies_hold(st)
    count_again(st)
    threads(st)
    files(st)
    not_an_area()
    print(f"{len(FAILURES)} failed")
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    warnings.simplefilter("default")
    main()
