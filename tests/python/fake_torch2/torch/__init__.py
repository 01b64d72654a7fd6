"""A stand-in for PyTorch 2.x (tests/python/progress_hook_torch_test.py): only what ddprun's
sitecustomize touches, with 2.x's behaviour where it matters: torch.version first, the global
optimizer step hooks, and ProcessGroupNCCL's warning for the 1.13 variable name (c10d's
WARN_ENV_VAR_ONCE, printed once per process when the group is made)."""
import os
import sys

from .version import __version__  # noqa: F401  (torch/__init__.py imports it first, as 2.x does)
from . import optim  # noqa: F401


def make_nccl_process_group():
    if os.environ.get("NCCL_ASYNC_ERROR_HANDLING") is not None:
        sys.stderr.write("[W1123 10:00:00.000000000 ProcessGroupNCCL.cpp:1032] Warning: Environment variable "
                         "NCCL_ASYNC_ERROR_HANDLING is deprecated; use TORCH_NCCL_ASYNC_ERROR_HANDLING instead "
                         "(function operator())\n")
    return os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")
