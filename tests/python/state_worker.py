"""Run by tests/python/state_torch_test.py under ddprun (or alone, as under torchrun): a gloo DDP
job that saves its state with ddprun.state.save after every step and resumes from
ddprun.state.load(), as docs/usage.md's example does (model, optimizer, RNG states, the data's
position). STATE_MODE says what else it does:

  crash        at STATE_CRASH_STEP of attempt 0, once every rank's save of it is committed,
               rank STATE_CRASH_RANK (1) dies (os._exit), once STATE_GO exists if set
  none         runs to the end: the uninterrupted run
  too_large    a save over the rank's capacity: StateTooLarge caught, the job goes on
  mid_copy     attempt 0 is killed halfway through the copy of STATE_CRASH_STEP's save
  hold         after the first save, prints its pids and waits for STATE_GO (another user tries
               to read the state meanwhile)
  persist      every 3rd step, asks the agent to persist the state to STATE_DIR/rankR.state;
               at STATE_CRASH_STEP of a run without STATE_RESUMING every rank dies (the whole
               job lost); started again with STATE_RESUMING=1 it loads those files
  persist_full persists after step 0 and 1 with blocking=True (STATE_DIR a small file system:
               the second fails), then loads the file back

It prints "RESUMED <step> steps=<the steps this rank held before load()>" (the step loaded), "FINAL <sha256 of the parameters>",
"STALL <s> ... bytes=<the last save's bytes> model_and_optimizer=<their tensors' bytes> course=<its course>".
STATE_REPLICATED=1: the model and the optimizer are saved as replicated (save(..., replicated=)).
STATE_MB: the size of the extra state tensor (MB). STATE_PAUSE: seconds to wait after each save,
having printed "SAVED <step> rank=R host=H t=<time> stale=<n>" (a job slow enough to be lost
midway; n: the copies' marks of steps before step - 2 still in the workers' store)."""
import hashlib
import os
import random
import socket
import sys
import time

import ddprun.state
import torch
import torch.distributed as dist

MODE = os.environ.get("STATE_MODE", "none")
STEPS = int(os.environ.get("STATE_STEPS", "8"))
CRASH = int(os.environ.get("STATE_CRASH_STEP", "4"))
PAUSE = float(os.environ.get("STATE_PAUSE", "0"))
HOLD_STEP = int(os.environ.get("STATE_HOLD_STEP", "-1"))  # after this step's save, wait for the file STATE_HOLD
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
# STATE_REPLICATED=1: the model and the optimizer (alike on every rank under DDP) are saved as
# replicated, each rank copying its share; the RNG states, the data's position and `extra` per rank.
REPLICATED = ("model", "optimizer") if os.environ.get("STATE_REPLICATED") == "1" else ()
if MODE == "mid_copy" and attempt == 0:
    os.environ["DDPRUN_STATE_TEST_KILL_AT_STEP"] = str(CRASH)

if os.environ.get("USE_LIBUV") == "0":  # PyTorch 2.x built without libuv (Debian trixie's 2.6)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))
    import torch_no_libuv

    torch_no_libuv.apply()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
random.seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Dropout(0.1), torch.nn.Linear(256, 8))
ddp = torch.nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3)
data = torch.Generator().manual_seed(1000 + rank)  # this rank's data order
extra = torch.zeros(int(float(os.environ.get("STATE_MB", "4")) * 2**20) // 4)  # a few MB of state

start = 0
held = ddprun.state.steps()  # what this rank held before the ranks agreed (load drops newer ones)
found = ddprun.state.load()
PERSISTED = os.path.join(os.environ.get("STATE_DIR", "."), f"rank{rank}.state")
if found is None and MODE == "persist":
    found = ddprun.state.load(PERSISTED)
    print(f"FROM_FILE {found[0] if found else None}", flush=True)
if found is not None:
    step, state = found
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    data.set_state(state["data_rng"])
    extra.copy_(state["extra"])
    start = state["next_step"]
    print(f"RESUMED {step} steps={held} extra={float(extra[0])} rank={rank} "
          f"host={socket.gethostname()}", flush=True)


MARKS = None  # the workers' store, where the agents count each step's copies


def stale_marks(step):
    """How many of the copies' marks ("ddprun/state/ROUND/step/S" and ".../done/S", ROUND the one
    whose "ddprun/state/ROUND/published" exists) of steps before step - 2 are still in the workers'
    store: the agents delete them once a later step is replicated. 0 where there are no copies."""
    global MARKS
    if MARKS is None:
        MARKS = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              wait_for_workers=False)
    # compare_set with an expected value no key holds: the key's value where it exists, else that
    # value back, nothing set (TCPStore has no check() in PyTorch 1.13)
    def exists(key):
        return MARKS.compare_set(key, "?", "?") != b"?"

    rounds = [r for r in range(64) if exists(f"ddprun/state/{r}/published")]
    return sum(exists(f"ddprun/state/{r}/{what}/{s}") for r in rounds for what in ("step", "done")
               for s in range(0, step - 2))


def hash_params():
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.numpy().tobytes())
    return h.hexdigest()


for step in range(start, STEPS):
    x = torch.randn(32, 64, generator=data)
    y = torch.randn(32, 8, generator=data) + random.random()
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    extra.fill_(step)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "torch_rng": torch.get_rng_state(),
             "python_rng": random.getstate(), "data_rng": data.get_state(), "next_step": step + 1, "extra": extra}
    if MODE == "too_large" and step == 1:
        try:
            ddprun.state.save(step, {"big": torch.zeros(ddprun.state.capacity() // 4 + 1024)})
            print("NOT RAISED", flush=True)
        except ddprun.state.StateTooLarge as e:
            print(f"CAUGHT {type(e).__name__}: {e}", flush=True)
    ddprun.state.save(step, state, replicated=REPLICATED)
    if PAUSE:
        print(f"SAVED {step} rank={rank} host={socket.gethostname()} t={time.time():.3f} stale={stale_marks(step)}",
              flush=True)
        time.sleep(PAUSE)
    if step == HOLD_STEP:  # the test's hold: the job goes on only once it says so (a node lost meanwhile)
        while not os.path.exists(os.environ["STATE_HOLD"]):
            time.sleep(0.02)
    if MODE == "crash" and attempt == 0 and step == CRASH:
        ddprun.state.wait()
        dist.barrier()  # every rank's save of CRASH committed
        if rank == int(os.environ.get("STATE_CRASH_RANK", "1")):
            while os.environ.get("STATE_GO") and not os.path.exists(os.environ["STATE_GO"]):
                time.sleep(0.02)  # the test's go: the warm spares are ready
            print(f"CRASHING after step {step} t={time.time():.3f}", flush=True)
            os._exit(1)
    if MODE == "persist" and step % 3 == 2:
        ddprun.state.persist(PERSISTED)
    if MODE == "persist" and step == CRASH and not os.environ.get("STATE_RESUMING"):
        print(f"LOST after step {step}", flush=True)
        os._exit(1)
    if MODE == "persist_full" and step < 2:
        try:
            print(f"PERSISTED {ddprun.state.persist(PERSISTED, blocking=True)}", flush=True)
        except ddprun.state.StateError as e:
            print(f"PERSIST_FAILED {e}", flush=True)
            back = ddprun.state.load(PERSISTED)
            print(f"FILE_HOLDS {back[0] if back else None} mode={oct(os.stat(PERSISTED).st_mode & 0o777)}", flush=True)
    if MODE == "hold" and step == 0:
        ddprun.state.wait()
        print(f"PIDS {os.getpid()} {os.getppid()}", flush=True)
        while not os.path.exists(os.environ["STATE_GO"]):
            time.sleep(0.02)

ddprun.state.wait()
print(f"FINAL {hash_params()}", flush=True)
s = ddprun.state.stats()
shared = sum(t.numel() * t.element_size() for t in list(model.state_dict().values()) +
             [v for d in optimizer.state_dict()["state"].values() for v in d.values() if torch.is_tensor(v)])
held = ddprun.state._area.committed() if ddprun.state._area else []  # the last save's course: its generation >> 40
print(f"STALL {s['stall_s']:.4f} saves={s['saves']} copy={s['copy_s']:.4f} bytes={s['last_bytes']} "
      f"model_and_optimizer={shared} course={held[0][0] >> 40 if held else -1}", flush=True)
dist.destroy_process_group()
