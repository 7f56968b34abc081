"""The direct all_reduce for inference code: ``torch.ops.hoccl.all_reduce_``.

Tensor-parallel decoding all-reduces a few KB several times per token. Through
``dist.all_reduce`` each call also pays c10d's path (the Python wrapper, a dispatcher round
trip, a Work and its future): several microseconds, as much as the data movement. The operator
goes from torch's dispatcher straight to the group's collective on the calling thread::

    handle = hoccl_backend.direct_handle(group)      # once per group (None: the default group)
    torch.ops.hoccl.all_reduce_(hidden, handle)      # in place; op="sum" (avg, max, min, product)

It is a registered torch operator (it traces under ``torch.compile``, mutating its argument),
takes dense CPU tensors of any dtype hoccl reduces, gives the same bits as ``dist.all_reduce``
on the same group, and raises the same errors for mismatched ranks. On a group spanning hosts it
runs that group's all_reduce and waits (the network, not c10d's path, sets its time there). CUDA
tensors keep ``dist.all_reduce``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def direct_handle(group=None) -> int:
    """The int naming ``group`` (a hoccl process group, on one host or spanning hosts) in the operator."""
    from hoccl_backend import load_extension
    _C = load_extension()
    pg = group or dist.distributed_c10d._get_default_group()
    try:
        backend = pg._get_backend(torch.device("cpu"))
    except (RuntimeError, ValueError) as exc:
        raise ValueError("hoccl.direct_handle: the group has no CPU backend; the direct "
                         "all_reduce needs a hoccl group") from exc
    if not isinstance(backend, _C.ProcessGroupHOCCL):
        raise ValueError(f"hoccl.direct_handle: the group's CPU backend is "
                         f"{type(backend).__name__}, not a single-host hoccl group nor one spanning "
                         "hosts; use dist.all_reduce on it")
    return backend.direct_handle()


def all_reduce_(tensor: torch.Tensor, group=None, op: str = "sum") -> torch.Tensor:
    """In-place all_reduce through the operator (looks the handle up on every call: keep the
    handle and call ``torch.ops.hoccl.all_reduce_`` where microseconds count)."""
    torch.ops.hoccl.all_reduce_(tensor, direct_handle(group), op)
    return tensor
