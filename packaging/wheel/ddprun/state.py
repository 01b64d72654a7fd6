"""Training state kept in memory by ddprun, across a worker's crash (docs/usage.md: In-memory state).

    import ddprun.state
    found = ddprun.state.load()          # (step, obj) or None; after init_process_group
    ...
    ddprun.state.save(step, {"model": model.state_dict(), "optim": optimizer.state_dict(), ...})

ddprun's agent owns one memory area per local rank (a memfd, DDPRUN_STATE_FD, of
DDPRUN_STATE_BYTES bytes) that outlives the worker and is handed to the next attempt's worker of
that rank. The area holds a header and two slots; a save writes the slot that does not hold the
last committed state:

    header (4 KiB):  magic "DDPRUNST", version, slot count, slot bytes, latest (generation << 1 | slot),
                     then persist()'s request and the agent's answer, and what holds a save
                     back (a persist request's pin, the buddy copies' progress): at _REPLY_AT
    slot:            slot header (4 KiB): commit word, generation, step, skeleton length,
                                          data length, chunk length, chunk count, then a
                                          CRC-32 per chunk (64 MiB) of skeleton and data
                     skeleton: a pickle of `obj` with each tensor replaced by (dtype, shape, offset)
                     tensor bytes, each at a 64-byte aligned offset after the skeleton

The commit word (equal to the generation) is written last, after the CRC-32s of the skeleton and
the tensor bytes (load() checks the chunks on every CPU at once); a save first clears it. A worker killed mid-copy leaves that slot uncommitted
and the other slot's state whole, so a reader never sees a torn state.

save() pickles the skeleton and clones small tensors at once; the slot is written (larger
tensors copied, the CRC-32, the commit) on a background thread while the next forward and
backward run. Their copy must end before anything
changes them: before the next optimizer step (a pre-step hook, PyTorch 2.x; each optimizer
class's step() wrapped, PyTorch 1.x), the next save(), and the process's normal exit. A large
tensor changed outside optimizer.step() (a big buffer updated in forward) must be given as a
clone, or saved with save(..., blocking=True).

Under torchrun (no DDPRUN_STATE_FD), or ddprun --no_state, this module warns once; load()
returns None and save() does nothing, so a script written for ddprun runs elsewhere.
"""
import atexit
import io
import mmap
import operator
import os
import pickle
import stat
import struct
import sys
import threading
import time
import warnings
import weakref
import zlib

__all__ = ["save", "load", "persist", "wait", "steps", "available", "capacity", "stats", "StateError", "StateTooLarge"]

_MAGIC = b"DDPRUNST"
_NATIVE = b"DDPRUNN1"  # a native trainer's skeleton (ddprun/runtime/memory_state.hpp), not a pickle
_VERSION = 1
_SLOTS = 2
_PAGE = mmap.PAGESIZE
_HEADER = struct.Struct("<8sIIQQ")  # magic, version, slots, slot bytes, latest (generation << 1 | slot)
# commit word, generation, step, skeleton bytes, data bytes, chunk bytes, chunks; then a CRC-32
# per chunk of the payload (skeleton and data), so that load() checks the chunks on every CPU.
_SLOT = struct.Struct("<QQqQQQI")
_CHUNK = 64 << 20
_MAX_CHUNKS = (_PAGE - _SLOT.size) // 4
_ALIGN = 64
# Tensors of fewer bytes are copied inside save() itself: a small buffer that forward updates
# (BatchNorm's statistics) is then copied before forward runs. Larger ones go to the thread.
_SYNC_BELOW = 1 << 16
_MADV_POPULATE_WRITE = 23  # <linux/mman.h>; Python's mmap module names it from 3.13 on only


class StateError(Exception):
    """The in-memory state cannot be saved or loaded (the message says why)."""


class StateTooLarge(StateError):
    """A save does not fit its rank's share of --state_memory. The previous state is kept."""

    def __init__(self, needed, capacity):
        self.needed, self.capacity = needed, capacity
        super().__init__(
            f"ddprun.state.save: the state needs {needed} bytes ({needed / 2**20:.2f} MiB) but a slot of this "
            f"rank's area holds {capacity} bytes ({capacity / 2**20:.2f} MiB: half its share of --state_memory, two slots); raise ddprun's "
            f"--state_memory to at least {-(-_rank_bytes(needed) * _local_world() // 2**20)}M for this node")


def _rank_bytes(needed):
    """The smallest share of --state_memory whose slots hold `needed` bytes: the header page, then
    two slots, each a header page and the bytes, in whole pages (as the agent cuts the area)."""
    return _PAGE + 2 * -(-(needed + _PAGE) // _PAGE) * _PAGE


def _local_world():
    n = os.environ.get("LOCAL_WORLD_SIZE", "1")
    return int(n) if n.isdigit() and int(n) > 0 else 1


class _Stats:
    saves = 0
    save_blocked_s = 0.0  # time save() itself took (pickling, small copies, waiting on the last save)
    fence_waited_s = 0.0  # time optimizer steps (and exit) waited for a copy to end
    copy_s = 0.0          # the background copies' own time (copy and CRC)
    last_bytes = 0


def stats():
    """What the saves cost so far: {saves, save_blocked_s, fence_waited_s, stall_s, copy_s, last_bytes}."""
    s = {k: getattr(_Stats, k) for k in ("saves", "save_blocked_s", "fence_waited_s", "copy_s", "last_bytes")}
    s["stall_s"] = s["save_blocked_s"] + s["fence_waited_s"]
    return s


class _Area:
    """This rank's area, mapped shared for the process's life (tensors made over it hold it)."""

    def __init__(self, fd, size, slots=_SLOTS, slot_bytes=None):
        self.fd, self.size, self.slots = fd, size, slots
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if slots == _SLOTS else 0)
        self.map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=prot)
        self.slot_bytes = slot_bytes or (size - _PAGE) // _SLOTS // _PAGE * _PAGE
        self.loaded = {}  # slot: [(weakref to a private mapping load() made tensors over, bytes)]

    @classmethod
    def of_file(cls, path):
        """A file persist() wrote (the area's layout, one slot), or None where there is none. It is
        mapped, not read (no copy: as fast as the page cache); a FIFO is never waited on."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            folder = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(folder):  # a typo in the folder is not a first run
                print(f"ddprun.state.load: there is no folder {folder}, so no {path} to load", file=sys.stderr)
            return None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                kind = "a directory" if stat.S_ISDIR(info.st_mode) else "a FIFO, socket or device"
                raise StateError(f"ddprun.state.load: {path} is {kind}, not a state file that ddprun.state.persist() wrote")
            size = info.st_size
            head = os.pread(fd, _HEADER.size, 0)
            magic, version, slots, slot_bytes, _latest = _HEADER.unpack(head) if len(head) == _HEADER.size else (b"",) * 5
            if magic != _MAGIC or version != _VERSION or slots != 1 or not 2 * _PAGE <= slot_bytes <= size - _PAGE:
                raise StateError(f"ddprun.state.load: {path} is not a state file that ddprun.state.persist() wrote")
            return cls(fd, size, 1, slot_bytes)
        except OSError as e:
            os.close(fd)
            raise StateError(f"ddprun.state.load: cannot read {path}: {e.strerror or e}") from e
        except BaseException:
            os.close(fd)
            raise

    def close(self):
        self.map.close()
        os.close(self.fd)

    def offset(self, slot):
        return _PAGE + slot * self.slot_bytes

    def capacity(self):
        return self.slot_bytes - _PAGE

    def header(self):
        magic, version, slots, slot_bytes, latest = _HEADER.unpack_from(self.map, 0)
        if magic != _MAGIC or version != _VERSION or slots != self.slots or slot_bytes != self.slot_bytes:
            return None
        return latest

    def slot(self, i):
        commit, gen, step, skel, data, chunk, n = _SLOT.unpack_from(self.map, self.offset(i))
        if commit == 0 or commit != gen or _align(skel) + data > self.capacity() or n > _MAX_CHUNKS or (n and chunk <= 0):
            return None
        crcs = struct.unpack_from(f"<{n}I", self.map, self.offset(i) + _SLOT.size)
        return gen, step, skel, data, chunk, crcs

    def committed(self):
        """[(generation, step, slot)] of the committed slots, newest first."""
        if self.header() is None:
            return []
        found = [(s[0], s[1], i) for i in range(self.slots) for s in [self.slot(i)] if s is not None]
        return sorted(found, reverse=True)

    def keep_loaded(self, slot):
        """Before `slot` is written again: tensors load() made over it that are still in use get
        their own copy of its pages (copy-on-write broken page by page in the private mapping), so
        they keep the state they were loaded with (PyTorch 2.x's Optimizer.load_state_dict keeps
        the tensors it is given). In use: the mapping lives. Every tensor sharing a loaded
        tensor's storage (its views, `detach()`, an `nn.Parameter` made of it, `numpy()`) holds the
        mapping through that storage, which torch.frombuffer made over it."""
        for ref, length in self.loaded.pop(slot, []):
            private = ref()
            if private is None:
                continue
            try:
                private.madvise(_MADV_POPULATE_WRITE, 0, length)  # Linux 5.14: no write to race with
            except (OSError, ValueError):
                import torch

                torch.frombuffer(private, dtype=torch.uint8, count=length)[::_PAGE].add_(0)


_area = None
_area_checked = False
_warned = False
_pending = None  # the save being copied: a thread, or None
# One save() or load() at a time in a process (a training thread and a checkpoint thread may both
# call save()): two at once would pick the same slot and write it together, a mix of both that
# its CRC-32s pass. `_owner`: the thread inside one, to refuse a save() or load() from within it
# (a __reduce__ or __setstate__ that saves, a signal handler), which would wait on itself.
# `_pending_mu` guards `_pending` itself: wait() runs on any thread (an optimizer step's fence).
_lock = threading.Lock()
_owner = None
_pending_mu = threading.Lock()
_forked_from = None  # in a process forked from the worker: the worker's pid


def _after_fork():
    global _lock, _owner, _pending_mu, _pending, _forked_from
    # The child: the threads holding these are not there, nor the save's copy thread.
    _lock, _owner, _pending_mu, _pending = threading.Lock(), None, threading.Lock(), None
    _forked_from = _forked_from or os.getppid()


os.register_at_fork(after_in_child=_after_fork)


class _Exclusive:
    """save() and load(): one at a time in the process, never nested in one thread, and only in
    the worker itself (a forked child, a DataLoader worker, shares its area)."""

    def __init__(self, what):
        self.what = what

    def __enter__(self):
        global _owner
        if _forked_from is not None:
            raise StateError(f"ddprun.state.{self.what}: called in a process forked from the worker (pid "
                             f"{_forked_from}): only the worker saves and loads its rank's state")
        if _owner == threading.get_ident():
            raise StateError(f"ddprun.state.{self.what}: called while this thread is inside save() or load() (from "
                             f"a __reduce__, __setstate__ or a signal handler?): call it once that has returned")
        _lock.acquire()
        _owner = threading.get_ident()
        return self

    def __exit__(self, *_exc):
        global _owner
        _owner = None
        _lock.release()
        return False


def _warn_once(why):
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"ddprun.state: {why}: load() returns None and save() does nothing", RuntimeWarning,
                      stacklevel=4)  # the caller of load(), save(), available()


def _open_area():
    """This rank's area, or None (said once)."""
    global _area, _area_checked
    if _area_checked:
        return _area
    _area_checked = True
    fd_text, size_text = os.environ.get("DDPRUN_STATE_FD", ""), os.environ.get("DDPRUN_STATE_BYTES", "")
    if not fd_text:
        _warn_once("no in-memory state here (not started by ddprun, or ddprun --no_state)")
        return None
    try:
        fd, size = int(fd_text), int(size_text)
        # A process that inherited the variables but not the descriptor (a subprocess, a nested
        # launcher) must not write into whatever file now has that number.
        if not os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:ddprun-state-"):
            raise OSError("not ddprun's state area")
        if os.fstat(fd).st_size != size or size < 4 * _PAGE:
            raise OSError(f"its size is not {size} bytes")
        _area = _Area(fd, size)
    except (OSError, ValueError) as e:
        _warn_once(f"DDPRUN_STATE_FD={fd_text} is not this process's state area ({e})")
    return _area


def available():
    """True when ddprun holds this rank's state (save() and load() do something)."""
    return _open_area() is not None


def capacity():
    """The largest state a save can hold, in bytes (0 when unavailable)."""
    area = _open_area()
    return area.capacity() if area else 0


def _align(n):
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class _Skeleton(pickle.Pickler):
    """Pickles `obj` with every tensor replaced by (dtype, shape, offset): its bytes are copied
    into the slot, not pickled. `tensors`: [(tensor, offset, bytes)].

    Replicated tensors (`shared`: their ids) are laid out one after the other in a space of
    their own, as ("s", dtype, shape, offset in it); split() then cuts that space into `world`
    equal ranges, one a rank, and this rank (`rank`) copies only its own, after its other
    tensors."""

    _SHARED = "ddprun.state: shared out"  # the key of split()'s record, pickled before the state

    def __init__(self, file, shared=frozenset(), world=1, rank=0):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        import torch

        self.torch = torch
        self.tensors = []
        self.data = 0
        self.shared, self.world, self.rank = shared, world, rank
        self.space = []  # [(tensor, offset)] of the replicated tensors
        self.space_bytes = 0
        self.seen = {}  # a tensor's memory and view -> its pid

    def persistent_id(self, obj):
        if not isinstance(obj, self.torch.Tensor):
            return None
        if obj.layout != self.torch.strided or obj.is_quantized:
            kind, instead = ((f"quantized ({obj.dtype})", "its dequantize(), or its int_repr() and scales")
                             if obj.is_quantized else (str(obj.layout), "its to_dense()"))
            raise StateError(f"ddprun.state.save: a {kind} tensor cannot be saved (dense, unquantized tensors only: "
                             f"save {instead})")
        nbytes = obj.numel() * obj.element_size()
        dtype, shape, grad = str(obj.dtype).replace("torch.", ""), tuple(obj.shape), bool(obj.requires_grad)
        # The same memory seen the same way again (tied weights: state_dict() gives one detach() a
        # key) is saved once, and loads as one memory again.
        key = (obj.data_ptr(), str(obj.device), dtype, shape, obj.stride(), obj.is_conj(), obj.is_neg())
        # An nn.Parameter comes back one (a model's parameters saved bare), over the same memory
        # as a detach() of it saved beside it; each as it was, requires_grad and all.
        param = isinstance(obj, self.torch.nn.Parameter)
        if key in self.seen:
            return self.seen[key][:4] + (grad, param)
        if id(obj) in self.shared:
            offset = self.space_bytes
            self.space.append((obj, offset))
            self.space_bytes = _align(offset + nbytes)
            pid = ("s", dtype, shape, offset, grad, param)
        else:
            offset = self.data
            self.tensors.append((obj, offset, nbytes))
            self.data = _align(offset + nbytes)
            pid = ("t", dtype, shape, offset, grad, param)
        self.seen[key] = pid
        return pid

    def split(self):
        """The record of the split (the world, this rank, where its range starts in the space
        and in the data, and the space's size): None where nothing is shared out. This rank's
        range of the space joins its tensors, as pieces of the replicated tensors' bytes."""
        if not self.space:
            return None
        ranges = _ranges(self.space_bytes, self.world)
        lo, hi = ranges[self.rank]
        at = self.data
        for t, offset in self.space:
            a, b = max(lo, offset), min(hi, offset + t.numel() * t.element_size())
            if a < b:
                flat = t.detach().resolve_conj().resolve_neg().reshape(-1).view(self.torch.uint8)
                self.tensors.append((flat[a - offset:b - offset], at + a - lo, b - a))
        self.data = _align(at + hi - lo)
        return {self._SHARED: 1, "world": self.world, "rank": self.rank, "bytes": self.space_bytes, "share_at": at}


class _Bounded(io.BytesIO):
    """The skeleton's bytes, kept while they fit `limit` and only counted past it: a state too large
    (a big NumPy array or bytes is pickled into the skeleton) raises StateTooLarge with its size,
    without holding all of it in memory first."""

    def __init__(self, limit):
        super().__init__()
        self.limit, self.count = limit, 0

    def write(self, b):
        n = memoryview(b).nbytes
        self.count += n
        if self.count <= self.limit:
            super().write(b)
        return n


def _ranges(total, world):
    """[(lo, hi)] of each rank: `total` bytes cut into `world` ranges at 64-byte bounds."""
    cuts = [min(total, (total * r // world) // _ALIGN * _ALIGN) for r in range(world)] + [total]
    return [(cuts[r], cuts[r + 1]) for r in range(world)]


def _tensor_ids(obj, ids):
    """The ids of the tensors within `obj`'s dicts, lists and tuples."""
    import torch

    if isinstance(obj, torch.Tensor):
        ids.add(id(obj))
    elif isinstance(obj, dict):
        for v in obj.values():
            _tensor_ids(v, ids)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _tensor_ids(v, ids)
    return ids


def _shared_out(obj, replicated):
    """(ids of the replicated tensors, world, rank): what save(..., replicated=) shares out.
    Nothing without a group of several ranks (torch.distributed), whose load() could not gather it."""
    if not replicated:
        return frozenset(), 1, 0
    if not isinstance(obj, dict) or any(k not in obj for k in replicated):
        missing = [k for k in replicated if not isinstance(obj, dict) or k not in obj]
        raise StateError(f"ddprun.state.save: replicated= names {missing!r}, which the state does not hold: name "
                         f"top-level keys of the dict saved (say, replicated=('model', 'optimizer'))")
    dist = _group()
    if dist is None:
        return frozenset(), 1, 0
    ids = set()
    for k in replicated:
        _tensor_ids(obj[k], ids)
    return frozenset(ids), dist.get_world_size(), dist.get_rank()


def _view(buf, offset, tensor):
    """A tensor over `buf` at `offset`, shaped and typed as `tensor`."""
    import torch

    if tensor.numel() == 0:
        return None
    return torch.frombuffer(buf, dtype=tensor.dtype, count=tensor.numel(), offset=offset).view(tensor.shape)


def _chunk_bytes(payload):
    """64 MiB, or more where a slot's payload would need more chunks than its header holds."""
    least = -(-payload // _MAX_CHUNKS)
    return max(_CHUNK, -(-least // _PAGE) * _PAGE)


def _verified(payload, chunk, crcs):
    """Whether every chunk of `payload` has its CRC-32, checked on every CPU this process may use
    (zlib.crc32 lets go of the GIL): the training waits for the load."""
    from concurrent.futures import ThreadPoolExecutor

    parts = [payload[i:i + chunk] for i in range(0, len(payload), chunk)]
    if len(parts) != len(crcs):
        return False
    try:
        with ThreadPoolExecutor(max_workers=min(len(parts), len(os.sched_getaffinity(0))) or 1) as pool:
            return list(pool.map(zlib.crc32, parts)) == list(crcs)
    finally:
        for p in parts:
            p.release()


def _write(area, slot, gen, step, skeleton, tensors, data_bytes):
    """Writes the slot, then its CRC-32, then commits it: the save's thread. `tensors`: [(tensor,
    offset)], the small ones already cloned."""
    t0 = time.perf_counter()
    import torch

    _wait_unpinned(area, slot)
    area.keep_loaded(slot)
    base = area.offset(slot)
    _SLOT.pack_into(area.map, base, 0, 0, 0, 0, 0, 0, 0)  # uncommitted from here on
    at = base + _PAGE
    for part in skeleton:  # the split's record, then the state's
        area.map[at:at + len(part)] = part
        at += len(part)
    skeleton_bytes = at - base - _PAGE
    data_at = base + _PAGE + _align(skeleton_bytes)
    die = os.environ.get("DDPRUN_STATE_TEST_KILL_AT_STEP") == str(step)
    with torch.no_grad():
        for i, (t, offset) in enumerate(tensors):
            if die and i == len(tensors) // 2:
                os.kill(os.getpid(), 9)  # tests: a worker killed halfway through its copy
            dst = _view(area.map, data_at + offset, t)
            if dst is not None:
                dst.copy_(t.detach())
    payload = memoryview(area.map)[base + _PAGE:data_at + data_bytes]
    try:
        chunk = _chunk_bytes(len(payload))
        crcs = [zlib.crc32(payload[i:i + chunk]) for i in range(0, len(payload), chunk)]
    finally:
        payload.release()
    struct.pack_into(f"<{len(crcs)}I", area.map, base + _SLOT.size, *crcs)
    _SLOT.pack_into(area.map, base, 0, gen, step, skeleton_bytes, data_bytes, chunk, len(crcs))
    _SLOT.pack_into(area.map, base, gen, gen, step, skeleton_bytes, data_bytes, chunk, len(crcs))  # the commit, last
    _HEADER.pack_into(area.map, 0, _MAGIC, _VERSION, _SLOTS, area.slot_bytes, gen << 1 | slot)
    _Stats.copy_s += time.perf_counter() - t0


class _Pending:
    def __init__(self, target, args):
        self.error = None
        self.thread = threading.Thread(target=self._run, args=(target, args), name="ddprun-state-save", daemon=True)
        self.thread.start()

    def _run(self, target, args):
        try:
            target(*args)
        except BaseException as e:  # noqa: BLE001  (raised by wait(), on the training thread)
            self.error = e


def wait():
    """Blocks until the last save is committed. Raises what its copy raised."""
    global _pending, _last_gen
    pending = _pending
    if pending is None:
        return
    pending.thread.join()
    with _pending_mu:
        if _pending is not pending:
            return  # another thread's wait() ended it (and raised its error)
        _pending = None
        if pending.error is not None:
            _last_gen = 0  # never committed: a persist() asks for the newest committed state
    if pending.error is not None:
        raise StateError(f"ddprun.state.save: the copy failed: {pending.error}") from pending.error


def _fence(*_args):
    if _pending is None:
        return
    t0 = time.perf_counter()
    try:
        wait()
    finally:
        _Stats.fence_waited_s += time.perf_counter() - t0


def save(step, obj, blocking=False, replicated=()):
    """Saves `obj` (nested dicts, lists, tuples, tensors, numbers, strings, anything picklable)
    as the state at `step` (an int). Returns once what can change before the next optimizer
    step is copied; the tensors' bytes follow on a thread (blocking=True: returns once
    committed). Raises StateTooLarge when it does not fit (the previous state is kept).

    replicated: top-level keys of `obj` (a dict) whose tensors every rank holds the same, as DDP
    keeps the model and the optimizer (replicated=("model", "optimizer")). Each rank then copies
    only its share of them, 1/world of their bytes, and load() gathers the shares from every
    rank (a broadcast from each): the stall and the memory of that part shrink world-fold. Name
    nothing that differs between ranks (RNG states, a data loader's position, sharded optimizer
    state): a rank would load another's. Without torch.distributed (one rank) it is ignored."""
    t0 = time.perf_counter()
    try:
        area = _open_area()
        if area is None:
            return
        _install_fence()
        with _Exclusive("save"):  # saves from several threads one after the other, each whole
            wait()  # the previous save's thread still writes the slot this one picks (counted as save()'s time)
            _save(area, _step(step), obj, _replicated(replicated))
            if blocking:
                wait()
    finally:
        _Stats.save_blocked_s += time.perf_counter() - t0


def _replicated(replicated):
    """save()'s replicated= as a tuple of top-level keys: a key, or an iterable of keys."""
    if isinstance(replicated, str):
        return (replicated,)
    try:
        return tuple(replicated or ())
    except TypeError:
        raise StateError(f"ddprun.state.save: replicated= takes the top-level keys of the saved dict whose tensors "
                         f"every rank holds alike, e.g. replicated=(\"model\", \"optimizer\"), not "
                         f"{type(replicated).__name__} {replicated!r}") from None


def _step(step):
    """`step` as an int: an integer (a Python, NumPy or one-element integer torch value), or a
    whole float (12.0), in 0 .. 2^63-1; anything else (12.9, True) raises StateError before a byte
    is written."""
    try:
        value = None if isinstance(step, bool) else operator.index(step)  # not int(): 12.9 would become 12
    except TypeError:
        item = getattr(step, "item", None)
        value = item() if callable(item) and getattr(step, "numel", lambda: 0)() == 1 else step
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # 12.0
    if not isinstance(value, int) or isinstance(value, bool):
        raise StateError(f"ddprun.state.save: step must be an integer (the job's global step), not "
                         f"{type(step).__name__} {step!r}; the previous state is kept")
    if not 0 <= value < 2**63:
        raise StateError(f"ddprun.state.save: step {value} is outside 0 .. 2^63-1; save the job's global "
                         f"step, counted from 0 (the previous state is kept)")
    return value


def _save(area, step, obj, replicated):
    """The part of a save that runs before save() returns: the skeleton pickled and the small
    tensors cloned (what can change before the next optimizer step); the thread does the rest."""
    import torch

    global _pending, _last_gen
    out = _Bounded(area.capacity())
    pickler = _Skeleton(out, *_shared_out(obj, replicated))
    pickler.dump(obj)
    split = pickler.split()
    # The split's record goes first (load() needs it before the state's tensors are made).
    skeleton = [pickle.dumps(split, protocol=pickle.HIGHEST_PROTOCOL) if split else b"", out.getbuffer()]
    needed = _align(len(skeleton[0]) + out.count) + pickler.data
    if needed > area.capacity():
        raise StateTooLarge(needed, area.capacity())
    found = area.committed()
    highest = max((s for _g, s, _slot in found), default=step)
    if step < highest:
        warnings.warn(f"ddprun.state.save: step {step} is below step {highest}, which this "
                      f"rank holds: load() takes the highest step held; steps must increase (the job's global "
                      f"step, not a batch index that starts again)", RuntimeWarning, stacklevel=3)
    slot = 1 - found[0][2] if found else 0
    # Never a generation used before: a persist request may name one whose save never ended, and
    # the header's latest keeps the newest ever committed (a load drops newer states: _drop_newer).
    (latest,) = struct.unpack_from("<Q", area.map, 24)
    gen = max(found[0][0] if found else 0, _requested(area), latest >> 1) + 1
    with torch.no_grad():
        tensors = [(t.detach().clone() if nbytes < _SYNC_BELOW else t, offset)
                   for t, offset, nbytes in pickler.tensors]
    _Stats.saves += 1
    _Stats.last_bytes = needed
    with _pending_mu:
        _pending = _Pending(_write, (area, slot, gen, step, skeleton, tensors, pickler.data))
        _last_gen = gen  # (only once its copy runs: a persist() names it)


def steps():
    """The steps this rank holds committed, newest first (at most two)."""
    area = _open_area()
    return [step for _gen, step, _slot in area.committed()] if area else []


# persist(): the request to the agent and its answer, in the area's header (the layout is
# ddprun/common/state_layout.hpp's). The request is a sequence lock: an odd number while it is
# written, the next even number once whole. It pins its generation: until the agent has copied
# it (_COPIED_AT), saves leave its slot alone. While the agent copies the saves to a buddy node
# (for the loss of a node; _COPIES_AT is 1), a save first waits until the area's newest state
# has reached every rank's buddy (_REPLICATED_AT, the newest generation whose step they all
# hold): the area keeps that one until the next is replicated, and no save is skipped.
_REPLY_AT, _COPIED_AT, _REQUEST_AT, _REQUEST_PATH_AT, _REQUEST_PATH_BYTES = 1024, 1536, 2048, 2072, 2000
_REPLICATED_AT, _COPIES_AT, _HOLD_LIMIT_AT = 1544, 1552, 1560
_REPLY = struct.Struct("<QqiI")  # request number answered, step written, errno (0: written), message bytes
_REQUEST = struct.Struct("<QQII")  # request number, generation, path bytes, 0
_last_gen = 0  # the generation of this process's last save (its copy may still run)


_PIN_WAIT_S = 60.0


def _requested(area):
    """The generation the last persist request named (0: none)."""
    return struct.unpack_from("<Q", area.map, _REQUEST_AT + 8)[0]


def _pinned(area, gen):
    """What holds back a save that would write over generation `gen`: a tuple of "persist" (a
    whole request for it not yet copied) and "copies" (the agent's copies are on and the area's
    newest state has not reached every rank's buddy); () when nothing does."""
    number, requested = struct.unpack_from("<QQ", area.map, _REQUEST_AT)
    (copied,) = struct.unpack_from("<Q", area.map, _COPIED_AT)
    replicated, copies = struct.unpack_from("<QQ", area.map, _REPLICATED_AT)
    (latest,) = struct.unpack_from("<Q", area.map, 24)
    return tuple(name for name, held in (("persist", gen and number % 2 == 0 and number > copied and requested == gen),
                                         ("copies", copies == 1 and latest >> 1 > replicated)) if held)


def _wait_unpinned(area, slot):
    """Before the save's thread writes `slot`: while something holds back the save, until it lets
    go: a persist request for the state the slot holds until the agent has copied it (at memory
    speed; the copy's flush to disk comes after), the agent's copies until the area's newest state
    has reached every rank's buddy. The area keeps two committed states throughout. After
    _PIN_WAIT_S the save goes on, and says what that costs (that persist fails: its copy is found
    overwritten; a node lost now loses its ranks' state)."""
    held = area.slot(slot)
    gen, step = (held[0], held[1]) if held else (0, None)
    if not _pinned(area, gen):
        return
    # A checkpoint being written: the progress hook beats "saving" meanwhile, so that ddprun does
    # not take the wait (the next optimizer step's, the other ranks' in a collective) for a hang.
    saving = getattr(sys.modules.get("sitecustomize"), "_Saving", None)
    with saving() if saving else _Nothing():
        pins = _pinned(area, gen)
        # The copies' hold lasts as long as the agent's own bound (its node's state at its pace).
        (hold,) = struct.unpack_from("<Q", area.map, _HOLD_LIMIT_AT)
        limit = max(_PIN_WAIT_S, hold) if "copies" in pins else _PIN_WAIT_S
        end = time.monotonic() + limit
        while pins:
            if time.monotonic() > end:
                print(_pin_message(pins, step, limit), file=sys.stderr)
                return
            time.sleep(0.002)
            pins = _pinned(area, gen)


def _pin_message(pins, step, limit=None):
    """Why a save goes on over the state of `step` while `pins` (_pinned()) still hold it back, and
    what that costs."""
    why = {"persist": "the agent has not copied the state asked to persist",
           "copies": "this rank's last save has not reached every rank's buddy node"}
    cost = ["that persist fails"] if "persist" in pins else []
    if "copies" in pins:
        cost.append("if a node is lost now, its ranks' state may be lost with it")
    over = f" of step {step}" if step is not None else ""
    return (f"ddprun.state: {' and '.join(why[p] for p in pins)} in {limit or _PIN_WAIT_S:g} s; saving over the state{over} "
            f"({'; '.join(cost)})")


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        return False


def persist(path, blocking=False, timeout=None):
    """Asks ddprun's agent to write this rank's last saved state to the file `path`, in the
    background: training goes on while the agent copies it (from the area, so the file holds
    the step of the last save() on every rank that calls it after the same step). The file is
    replaced whole or not at all; load(path) reads it back. It is what survives the loss of
    every node. blocking=True: returns the step written once the file is in place, and raises
    StateError when it could not be written (a full disk, a missing folder), or, with `timeout`
    (seconds), when it is not in place by then (a stuck file system: the agent may still write
    it); otherwise the agent logs such a failure. Does nothing where there is no state."""
    if timeout is not None and (not blocking or not timeout > 0):
        raise StateError(f"ddprun.state.persist: timeout={timeout!r} needs blocking=True and a number of seconds "
                         f"over 0")
    area = _open_area()
    if area is None:
        return None
    target = os.fsencode(os.path.abspath(os.fspath(path)))
    if len(target) > _REQUEST_PATH_BYTES or b"\0" in target:
        raise StateError(f"ddprun.state.persist: the path {path!r} is too long (over {_REQUEST_PATH_BYTES} bytes) "
                         f"or holds a NUL byte; use a shorter one")
    held = area.committed()
    gen = _last_gen or (held[0][0] if held else 0)
    if not gen:
        raise StateError("ddprun.state.persist: this rank has saved no state yet (ddprun.state.save first)")
    if blocking:
        wait()
    (number,) = struct.unpack("<Q", os.pread(area.fd, 8, _REQUEST_AT))
    number += number & 1
    os.pwrite(area.fd, struct.pack("<Q", number + 1), _REQUEST_AT)
    os.pwrite(area.fd, _REQUEST.pack(number + 1, gen, len(target), 0) + target, _REQUEST_AT)
    os.pwrite(area.fd, struct.pack("<Q", number + 2), _REQUEST_AT)
    if not blocking:
        return None
    until = None if timeout is None else time.monotonic() + timeout
    while True:
        done, step, err, length = _REPLY.unpack(os.pread(area.fd, _REPLY.size, _REPLY_AT))
        if done >= number + 2:
            break
        if until is not None and time.monotonic() > until:
            raise StateError(f"ddprun.state.persist: the agent had not written {os.fsdecode(target)} after {timeout:g} s "
                             f"(a slow or stuck file system?); it may still write it, or call persist again")
        time.sleep(0.01)
    if err:
        message = os.pread(area.fd, min(length, 480), _REPLY_AT + _REPLY.size).decode(errors="replace")
        raise StateError(f"ddprun.state.persist: {message}")
    return step


def _group():
    """torch.distributed where it joins several ranks, else None."""
    try:
        import torch.distributed as dist

        return dist if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 else None
    except Exception:  # noqa: BLE001
        return None


# A save's generation >> 40 is its course: in a job of several nodes the agent starts each round's
# generations at round << 40, so that a state a later round abandoned (its step done again, from
# an earlier one) is never taken for the state of that step made since (a buddy node may still
# hold the abandoned one). Ranks agree on a step and its course.
_COURSE_SHIFT = 40


def _agree(held):
    """(step, course) of the newest state every rank holds (torch.distributed initialized), else
    of this rank's newest; None when there is none. `held`: [(generation, step)] newest first."""
    mine = [(step, gen >> _COURSE_SHIFT) for gen, step in held]
    dist = _group()
    if dist is None:
        return max(mine) if mine else None  # the highest step, as ranks agree on (steps increase)
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    common = set(map(tuple, every[0])).intersection(*[set(map(tuple, e)) for e in every[1:]])
    if held and not common:
        print(f"ddprun.state.load: rank {dist.get_rank()} holds steps {[s for s, _c in mine]} but the ranks hold no "
              f"step in common (each rank's (step, course): {every}); starting without in-memory state", file=sys.stderr)
    return max(common) if common else None


def _all_loaded(error):
    """Whether every rank loaded the agreed state (`error`: this rank's failure, or None). Where
    one did not, every rank says so and starts without it (returns False), so that none goes on
    to a collective the others never join, and none restarts into the same failure."""
    failed = {} if error is None else {0: str(error)}
    dist = _group()
    if dist is not None:
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, None if error is None else str(error))
        failed = {r: e for r, e in enumerate(every) if e is not None}
    if failed:
        rank, why = next(iter(failed.items()))
        print(f"{why}" + (f" (rank {rank}; {len(failed)} rank(s) failed)" if dist is not None else "")
              + "; starting without this state", file=sys.stderr)
    return not failed


def load(path=None, verify=True):
    """(step, obj) of the newest state every rank holds, or None. With torch.distributed
    initialized every rank must call it (it agrees on the step with the others). Tensors come
    back on the CPU, mapped over the area copy-on-write (no copy until written);
    model.load_state_dict copies them into the model. verify: check the CRC-32 first.
    path: load the file persist() wrote there instead (each rank its own; None where it is
    missing), under ddprun or not: what survives the loss of every node."""
    if path is None:
        area = _open_area()
        if area is None and not os.environ.get("DDPRUN_STATE_FD"):
            return None  # not under ddprun, on any rank: nothing to agree on
        with _Exclusive("load"):  # not beside a save() of another thread
            return _load(area, verify, "memory written outside ddprun.state?")
    try:
        area = _Area.of_file(os.fspath(path))
    except (StateError, OSError) as e:  # this rank holds nothing from it, and still agrees
        print(f"{e}; rank {os.environ.get('RANK', '0')} loads nothing from it", file=sys.stderr)
        area = None
    try:
        return _load(area, verify, os.fspath(path))
    finally:
        if area is not None:
            area.close()


def _load(area, verify, where):
    world = os.environ.get("WORLD_SIZE", "1")
    if area is not None and world.isdigit() and int(world) > 1 and _group() is None:
        warnings.warn(f"ddprun.state: load() before init_process_group in a job of {world} ranks: each rank takes "
                      f"the highest step it holds, and the ranks may resume at different steps; call load() after "
                      f"init_process_group", RuntimeWarning, stacklevel=3)
    if area is _area and area is not None:
        try:
            wait()  # the last save committed (or failed) before what this rank holds is read
        except StateError as e:
            print(e, file=sys.stderr)
    held = area.committed() if area else []
    agreed = _agree([(g, s) for g, s, _slot in held])
    if area is None or agreed is None:
        return None
    step = agreed[0]
    error, obj, private, space, shares, skel, mine = None, None, None, None, None, 0, None
    try:
        _gen, step, slot = next(h for h in held if (h[1], h[0] >> _COURSE_SHIFT) == agreed)
        _gen, _step, skel, data, chunk, crcs = area.slot(slot)
        base = area.offset(slot)
        private = mmap.mmap(area.fd, area.slot_bytes, flags=mmap.MAP_PRIVATE,
                            prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=base)
        payload = memoryview(private)[_PAGE:_PAGE + _align(skel) + data]
        try:
            if verify and not _verified(payload, chunk, crcs):
                raise StateError(f"ddprun.state.load: the state of step {step} fails its CRC-32 check ({where})")
            if bytes(payload[:7]) == _NATIVE[:7]:  # "DDPRUNN1", or "DDPRUNN2" (replicated buffers shared out)
                raise StateError(f"ddprun.state.load: the state of step {step} was saved by a native trainer "
                                 f"(ddprun::runtime::MemoryState), not by ddprun.state")
            stream = io.BytesIO(payload[:skel])
            obj = _Unpickler(stream, private, _PAGE + _align(skel)).load()
            if isinstance(obj, dict) and _Skeleton._SHARED in obj:  # the split's record, then the state
                shares = obj
                _check_shares(shares, step)
                import torch

                space = torch.empty(shares["bytes"], dtype=torch.uint8)
                unpickler = _Unpickler(stream, private, _PAGE + _align(skel), space)
                obj = unpickler.load()
                shares = dict(shares, layout=unpickler.layout)
                mine = _own_range(space, shares, private, _PAGE + _align(skel))
        finally:
            payload.release()
    except Exception as e:  # noqa: BLE001  (said, and agreed on by every rank)
        error = e if isinstance(e, StateError) else StateError(f"ddprun.state.load: the state of step {step} "
                                                               f"does not load ({where}): {e!r}")
    if not _all_loaded(error) or not _gathered(space, shares, mine):
        return None
    if area is _area:
        area.loaded.setdefault(slot, []).append((weakref.ref(private), _PAGE + _align(skel) + data))
        _drop_newer(area, held, step, _gen, slot)
    return step, obj


def _check_shares(shares, step):
    """The replicated part of a state can be gathered: the same ranks, this one among them."""
    dist = _group()
    if dist is None:
        import torch.distributed

        alone = torch.distributed.is_available() and torch.distributed.is_initialized()
        raise StateError(f"ddprun.state.load: the state of step {step} was shared out among {shares['world']} ranks "
                         f"(save(..., replicated=)): load() gathers it with torch.distributed, " +
                         (f"and this process's group has one rank: load it in a job of {shares['world']} ranks"
                          if alone else "so call init_process_group before load()"))
    if dist.get_world_size() != shares["world"] or dist.get_rank() != shares["rank"]:
        raise StateError(f"ddprun.state.load: the state of step {step} was saved as rank {shares['rank']} of "
                         f"{shares['world']}, its replicated part shared out among them; this is rank "
                         f"{dist.get_rank()} of {dist.get_world_size()}, which cannot gather it")


def _own_range(space, shares, buf, data_at):
    """This rank's range of the replicated bytes copied into `space`, from its slot; the buffer
    it sends from: `space`'s range, or a copy on the GPU where the group is NCCL's (made here, in
    load()'s checks, so that a failure is agreed on before any broadcast)."""
    import torch

    dist = _group()
    lo, hi = _ranges(shares["bytes"], dist.get_world_size())[dist.get_rank()]
    if hi > lo:
        space[lo:hi].copy_(torch.frombuffer(buf, dtype=torch.uint8, count=hi - lo, offset=data_at + shares["share_at"]))
    return space[lo:hi].to(_device(dist)) if _device(dist) is not None else space[lo:hi]


def _device(dist):
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None


def _gathered(space, shares, mine):
    """Fills `space`, the replicated tensors' bytes, with every rank's range of it: each rank
    broadcasts its own (`mine`, _own_range's). Every rank calls it once every rank's state
    loaded; False where the ranks' states were not shared out alike (each says so)."""
    dist = _group()
    if dist is None:
        return True  # nothing shared out (_check_shares refused the rest)
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, (shares["bytes"], shares["layout"]) if shares else None)
    if all(e is None for e in every):
        return True
    if any(e != every[0] for e in every):
        print(f"ddprun.state.load: the ranks' states were not shared out alike (the replicated part's bytes and "
              f"layout on each rank: {every}: was replicated= the same on every rank?); starting without this state",
              file=sys.stderr)
        return False
    import torch

    device = _device(dist)
    for owner, (a, b) in enumerate(_ranges(shares["bytes"], dist.get_world_size())):
        if b > a:
            part = mine if owner == dist.get_rank() else space[a:b] if device is None else \
                torch.empty(b - a, dtype=torch.uint8, device=device)
            dist.broadcast(part, src=owner)
            if device is not None and owner != dist.get_rank():
                space[a:b].copy_(part)
    return True


def _drop_newer(area, held, step, gen, slot):
    """The states newer than the agreed `step` are of a course the job abandoned: uncommitted, so
    that the next save writes over one of them, never over the agreed one, and no later agreement
    takes one for the step it names. The header's latest names the agreed slot with the newest
    generation ever committed: generations are never used twice (the agent's copies count them)."""
    newer = [(g, s) for g, _st, s in held if g > gen]  # newer by generation, whatever step it names
    for _g, s in newer:
        struct.pack_into("<Q", area.map, area.offset(s), 0)
    if newer:
        (latest,) = struct.unpack_from("<Q", area.map, 24)
        struct.pack_into("<Q", area.map, 24, max([latest >> 1, gen] + [g for g, _s in newer]) << 1 | slot)


class _Unpickler(pickle.Unpickler):
    """The skeleton back, each tensor over the slot's bytes; each replicated tensor (an "s")
    over `space`, where load() gathers every rank's range of them."""

    def __init__(self, stream, buf, data_at, space=None):
        super().__init__(stream)
        self.buf, self.data_at, self.space = buf, data_at, space
        self.layout = 0  # a CRC-32 of the replicated tensors' (dtype, shape, offset): alike on every rank

    def persistent_load(self, pid):
        import torch

        tag, dtype, shape, offset, requires_grad = pid[:5]
        param = len(pid) > 5 and pid[5]  # (a state saved before Parameters were marked has none)
        dtype = getattr(torch, dtype)
        count = 1
        for n in shape:
            count *= n
        if tag == "s":
            self.layout = zlib.crc32(repr(pid[1:4]).encode(), self.layout)
            size = count * torch.empty((), dtype=dtype).element_size()
            t = self.space[offset:offset + size].view(dtype).view(shape)
        elif count == 0:
            t = torch.empty(shape, dtype=dtype)
        else:
            t = torch.frombuffer(self.buf, dtype=dtype, count=count, offset=self.data_at + offset).view(shape)
        if param:
            return torch.nn.Parameter(t, requires_grad=requires_grad)
        return t.requires_grad_(requires_grad) if requires_grad else t


# ---- the fence: every optimizer step waits for the copy of the last save ------------------

_fenced = False


def _install_fence():
    """PyTorch 2.x: a global optimizer step pre-hook. 1.x has none: each Optimizer class's step()
    is wrapped (again at each save, for classes defined since); import this module before making
    an LR scheduler, which keeps the step() it found."""
    global _fenced
    import torch.optim

    if not _fenced:
        _fenced = True
        register = getattr(sys.modules.get("torch.optim.optimizer"), "register_optimizer_step_pre_hook", None)
        if register is not None:
            register(lambda optimizer, args, kwargs: _fence())
            _wrap_steps.done = True
    if not getattr(_wrap_steps, "done", False):
        _wrap_steps(torch.optim.Optimizer)


def _wrap_steps(cls):
    import functools

    step = cls.__dict__.get("step")
    if step is not None and not getattr(step, "_ddprun_fenced", False):
        @functools.wraps(step)
        def fenced_step(*args, **kwargs):
            _fence()
            return step(*args, **kwargs)

        fenced_step._ddprun_fenced = True  # (functools.wraps keeps 1.x's profiler mark, `hooked`)
        cls.step = fenced_step
    for sub in cls.__subclasses__():
        _wrap_steps(sub)


def _early_fence():
    """At import, where ddprun holds state: the fence, before any optimizer or LR scheduler is
    made (a script that saves state trains with torch: importing it now costs nothing more)."""
    if os.environ.get("DDPRUN_STATE_FD"):
        try:
            _install_fence()
        except Exception:  # noqa: BLE001  (no torch: save() installs it, and says what fails)
            pass


def _at_exit():
    try:
        _fence()
    except StateError as e:
        print(e, file=sys.stderr)


atexit.register(_at_exit)
_early_fence()
