#!/usr/bin/python3
"""torchrun (python3 -m torch.distributed.run) for a PyTorch 2.x built without libuv, such as Debian
trixie's python3-torch 2.6 (bench/torch_no_libuv.py says why). Run it with USE_LIBUV=0."""
import sys

import torch_no_libuv

torch_no_libuv.apply()
from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend  # noqa: E402
import torch.distributed as dist  # noqa: E402

c10d_rendezvous_backend.TCPStore = dist.TCPStore  # imported by name before apply()
from torch.distributed.run import main  # noqa: E402

sys.exit(main())
