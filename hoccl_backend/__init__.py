"""hoccl: a torch.distributed backend whose collectives keep off the GPU's compute units.

    import torch.distributed as dist
    dist.init_process_group(backend="hoccl")   # importing hoccl_backend is optional

Importing this package registers the "hoccl" backend name (torch also does this at
`import torch` through the `torch.backends` entry point when hoccl is installed).
"""
from hoccl_backend._registration import BACKEND_NAME, register
from hoccl_backend.monitored import monitored_barrier

register()

__all__ = ["BACKEND_NAME", "register", "load_extension", "monitored_barrier"]
__version__ = "0.1.0"


def load_extension():
    """Returns the compiled core module (hoccl_backend._C)."""
    import torch  # noqa: F401

    from hoccl_backend import _C

    return _C
