"""hoccl: a torch.distributed backend whose collectives keep off the GPU's compute units.

    import torch.distributed as dist
    dist.init_process_group(backend="hoccl")   # importing hoccl_backend is optional

Importing this package registers the "hoccl" backend name (torch also does this at
`import torch` through the `torch.backends` entry point when hoccl is installed).
"""
from hoccl_backend._registration import BACKEND_NAME, register
from hoccl_backend.direct import direct_handle
from hoccl_backend.monitored import monitored_barrier

register()

__all__ = ["BACKEND_NAME", "register", "load_extension", "monitored_barrier", "empty", "zeros",
           "is_shared", "direct_handle"]
__version__ = "0.1.0"


def load_extension():
    """Returns the compiled core module (hoccl_backend._C)."""
    import torch  # noqa: F401

    from hoccl_backend import _C

    return _C


def _size_args(size):
    if len(size) == 1 and not isinstance(size[0], int):
        size = tuple(size[0])  # empty((2, 3)), empty([2, 3]), empty(torch.Size(...))
    return tuple(int(s) for s in size)


def empty(*size, dtype=None):
    """An uninitialised CPU tensor in memory that the other ranks on this host can map.

    hoccl's large collectives read peers' buffers directly. From ordinary memory that takes a
    kernel cross-memory copy that pins every page on every call (about 60 % of memcpy speed);
    a tensor from this function lives in anonymous shared memory (a memfd), which each peer
    maps once and then reads at memcpy speed. Use it for buffers you pass to collectives again
    and again (all_to_all dispatch buffers, gradient buckets). Like ``torch.empty`` otherwise;
    nothing is left in /dev/shm, and the memory is freed with the tensor (a peer that mapped it
    lets go within 64 of its later ops). Other tensors keep working as before.
    """
    import torch

    from hoccl_backend import _C

    shape = _size_args(size)
    dtype = dtype or torch.get_default_dtype()
    numel = 1
    for s in shape:
        if s < 0:
            raise ValueError(f"hoccl_backend.empty: negative dimension in {shape}")
        numel *= s
    elem = torch.empty((), dtype=dtype).element_size()
    raw = _C.shared_bytes(numel * elem)
    return raw.view(dtype).view(shape)


def zeros(*size, dtype=None):
    """Like :func:`empty`, filled with zeros."""
    return empty(*size, dtype=dtype).zero_()


def is_shared(tensor) -> bool:
    """True if ``tensor`` lies in memory from :func:`empty` (peers read it through a mapping)."""
    from hoccl_backend import _C

    return _C.is_shared(tensor)
