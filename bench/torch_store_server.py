#!/usr/bin/python3
"""PyTorch's own TCPStore server, for side-by-side benchmarks: prints 'listening on 127.0.0.1:PORT'
and serves until stdin closes or SIGTERM."""
import resource
import sys

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # as ddprun-store does, for 10,000 clients

import datetime  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=600))
print(f"listening on 127.0.0.1:{store.port} (torch {torch.__version__})", flush=True)
sys.stdin.read()
