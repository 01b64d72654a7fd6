#!/usr/bin/python3
"""Real PyTorch (Debian's python3-torch) clients against ddprun-store.

1. Every torch.distributed.TCPStore method, from several clients at once.
2. A 2-rank init_process_group("gloo", init_method="env://") in agent-store mode
   (TORCHELASTIC_USE_AGENT_STORE=True), checking an all_reduce result.

Exits 77 (skipped) when torch cannot be imported.
"""
import argparse
import datetime
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testlib import require, skip  # noqa: E402
import threading

try:
    import torch
    import torch.distributed as dist
except ImportError as e:  # pragma: no cover
    skip(f"torch is not importable with {sys.executable}: {e}")


def start_store(binary, *extra):
    proc = subprocess.Popen([binary, "--host", "127.0.0.1", "--port", "0", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    assert line.startswith("listening on "), f"unexpected first line {line!r}"
    port = int(line.rsplit(":", 1)[1])
    return proc, port


def store_methods(port):
    t = datetime.timedelta(seconds=10)
    s = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=t)
    require(s.host == "127.0.0.1" and s.port == port, "host and port")
    require(s.timeout == t, "timeout")
    s.set("key", "value")
    require(s.get("key") == b"value", "set/get")
    s.set("bin", b"\x00\xff\x01")
    require(s.get("bin") == b"\x00\xff\x01", "binary value")
    require(s.add("ctr", 5) == 5 and s.add("ctr", -2) == 3, "add")
    require(s.get("ctr") == b"3", "add stores decimal ASCII")
    require(s.compare_set("key", "value", "new") == b"new", "compare_set swaps on match")
    require(s.compare_set("key", "wrong", "x") == b"new", "compare_set keeps on mismatch")
    require(s.compare_set("fresh", "", "created") == b"created", "compare_set creates with empty expected")
    require(s.compare_set("absent", "e", "x") == b"e", "compare_set on missing key with expected")
    n = s.num_keys()
    require(n >= 4, f"num_keys counts keys ({n})")
    require(s.delete_key("fresh") is True and s.delete_key("fresh") is False, "delete_key")
    require(s.num_keys() == n - 1, "num_keys after delete")
    s.wait(["key", "ctr"])
    s.wait(["key"], datetime.timedelta(seconds=1))
    require(True, "wait on present keys")
    s.set_timeout(datetime.timedelta(milliseconds=300))
    try:
        s.wait(["never"])
        require(False, "wait on a missing key times out")
    except RuntimeError as e:
        require("imeout" in str(e) or "timed out" in str(e), f"wait times out ({e})")
    try:
        s.get("never2")
        require(False, "get on a missing key times out")
    except RuntimeError:
        require(True, "get on a missing key times out")

    # a second client's set wakes a waiting get
    s2 = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=t)
    s.set_timeout(t)
    result = {}
    th = threading.Thread(target=lambda: result.setdefault("v", s.get("later")))
    th.start()
    s2.set("later", "arrived")
    th.join(10)
    require(result.get("v") == b"arrived", "get woken by another client's set")

    # many clients adding at once give the exact total
    def adder():
        c = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=t)
        for _ in range(200):
            c.add("many", 1)
    ths = [threading.Thread(target=adder) for _ in range(8)]
    [x.start() for x in ths]
    [x.join(60) for x in ths]
    require(s.get("many") == b"1600", "8 clients x 200 adds")


WORKER = r"""
import os, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
t = torch.tensor([float(rank + 1)] * 4)
dist.all_reduce(t)
dist.barrier()
print(f"rank={rank} world={dist.get_world_size()} sum={t.tolist()}", flush=True)
dist.destroy_process_group()
"""


def process_group(port):
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True",
                   TORCHELASTIC_RESTART_COUNT="0", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        outs.append(out)
        require(p.returncode == 0, f"worker exited 0 (output: {out.strip()})")
    for rank, out in enumerate(outs):
        require(f"rank={rank} world=2 sum=[3.0, 3.0, 3.0, 3.0]" in out, f"rank {rank} all_reduce result")


def ddprun_authenticated_get(port, secret, key):
    """ddprun's handshake (rendezvous/include/ddprun/rendezvous/auth.hpp), written independently
    here with Python's hmac, then a 2.x GET of `key`."""
    import hashlib
    import hmac
    import socket
    import struct
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    cnonce = os.urandom(32)
    s.sendall(bytes([0xA7]) + struct.pack("<I", 0x41505044) + cnonce)

    def recv(n):
        buf = b""
        while len(buf) < n:
            chunk = s.recv(n - len(buf))
            assert chunk, "server closed the connection"
            buf += chunk
        return buf
    challenge = recv(65)
    assert challenge[0] == 0
    snonce, sproof = challenge[1:33], challenge[33:]
    expect = hmac.new(secret, b"ddprun-store-server" + cnonce + snonce, hashlib.sha256).digest()
    require(hmac.compare_digest(sproof, expect), "the server proves it knows the secret")
    s.sendall(hmac.new(secret, b"ddprun-store-client" + snonce + cnonce, hashlib.sha256).digest())
    require(recv(1) == b"\x00", "the server accepts our proof")
    s.sendall(bytes([0]) + struct.pack("<I", 0x3C85F7CE) + bytes([3]) + struct.pack("<Q", len(key)) + key)
    n = struct.unpack("<Q", recv(8))[0]
    value = recv(n) if n else b""
    s.close()
    return value


def secured_store(binary):
    import tempfile
    fd, path = tempfile.mkstemp()
    os.write(fd, b"job-secret-123\n")
    os.close(fd)
    os.chmod(path, 0o600)
    proc, port = start_store(binary, "--secret_file", path)
    try:
        t = datetime.timedelta(seconds=3)
        refused = False
        try:
            s = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=t)
            s.set("/round", "999")
            s.get("/round")
        except Exception as e:  # noqa: BLE001 - any failure is the refusal we expect
            refused = True
            print(f"  (PyTorch client error: {type(e).__name__}: {str(e).splitlines()[0][:100]})")
        require(refused, "a PyTorch TCPStore client cannot use a secured store")
        require(ddprun_authenticated_get(port, b"job-secret-123", b"/round") == b"",
              "its SET was never applied (read back through an authenticated connection)")
        require(proc.poll() is None, "the secured store is still running")
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
        os.unlink(path)
    require("did not authenticate" in err, "the store logged the refusal")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", required=True)
    args = ap.parse_args()
    print(f"torch {torch.__version__}")
    proc, port = start_store(args.store)
    try:
        store_methods(port)
        process_group(port)
        require(proc.poll() is None, "ddprun-store still running")
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    require(proc.returncode == 0, "ddprun-store exits 0 on SIGTERM")
    secured_store(args.store)
    print("all PyTorch checks passed")


if __name__ == "__main__":
    main()
