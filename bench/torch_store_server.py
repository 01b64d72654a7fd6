#!/usr/bin/python3
"""PyTorch's own TCPStore server, for side-by-side benchmarks: prints 'listening on 127.0.0.1:PORT'
and serves until stdin closes or SIGTERM. PyTorch 2.x serves with libuv where it was built with
it (2.4 on: the default) and with its older server where not (Debian trixie's 2.6); the line
says which."""
import resource
import sys

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # as ddprun-store does, for 10,000 clients

import datetime  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

kwargs = dict(is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=600))
try:
    store = dist.TCPStore("127.0.0.1", 0, **kwargs)
except RuntimeError as e:
    if "libuv" not in str(e):
        raise
    store = dist.TCPStore("127.0.0.1", 0, use_libuv=False, **kwargs)
server = "libuv" if getattr(store, "libuvBackend", False) else "no libuv"
print(f"listening on 127.0.0.1:{store.port} (torch {torch.__version__}, {server})", flush=True)
sys.stdin.read()
