"""For a PyTorch 2.x built without libuv, such as Debian trixie's python3-torch 2.6: it makes its
TCPStores with use_libuv=True, which that build refuses ("use_libuv was requested but PyTorch was
build without libuv support"), and USE_LIBUV=0 reaches none of them (2.6 reads it and drops it).
With USE_LIBUV=0 in the environment, apply() makes the stores torch.distributed makes (env://
and torchrun's) without libuv. Otherwise it changes nothing."""
import os


def apply():
    if os.environ.get("USE_LIBUV") != "0":
        return
    import sys

    import torch.distributed as dist

    rendezvous = sys.modules["torch.distributed.rendezvous"]  # the attribute is a function of that name

    if getattr(dist.TCPStore, "no_libuv", False):
        return

    class TCPStore(dist.TCPStore):
        no_libuv = True

        def __init__(self, *args, **kwargs):
            kwargs.setdefault("use_libuv", False)
            super().__init__(*args, **kwargs)

    dist.TCPStore = rendezvous.TCPStore = TCPStore
