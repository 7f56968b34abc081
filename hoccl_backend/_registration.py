"""Registers the "hoccl" name with torch.distributed (idempotent, no extension import)."""
from __future__ import annotations

import os
from datetime import timedelta

BACKEND_NAME = "hoccl"


def _create(store, rank: int, size: int, timeout: timedelta):
    """Creator torch calls for each new process group using hoccl."""
    import torch  # noqa: F401  (the extension needs libtorch loaded first)

    from hoccl_backend import _C

    pg = _C.ProcessGroupHOCCL(store, rank, size, timeout)
    _configure_alltoall(pg, size)
    return pg


def _configure_alltoall(pg, size: int) -> None:
    """Hands VarioPath's channel catalog for HOCCL_TOPOLOGY (default: flat) to the scheduler."""
    if os.environ.get("HOCCL_ALLTOALL_ALGO", "varipath") != "varipath" or size < 2:
        return
    try:
        import varipath
    except ImportError:
        return
    if not hasattr(varipath, "backend_config"):
        return
    cfg = varipath.backend_config(os.environ.get("HOCCL_TOPOLOGY") or None, size)
    pg.set_alltoall_channels(
        [[(int(s), int(d)) for s, d in ch] for ch in cfg["channels"]],
        float(cfg["phase_latency_s"]),
        float(cfg["bandwidth_Bps"]),
    )


def register() -> None:
    import torch.distributed as dist

    if not dist.is_available():
        return
    if BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])
