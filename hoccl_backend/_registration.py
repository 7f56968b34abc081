"""Registers the "hoccl" name with torch.distributed (idempotent, no extension import)."""
from __future__ import annotations

import os
from datetime import timedelta

BACKEND_NAME = "hoccl"
# The cost model VarioPath chooses all_to_all plans by: varipath.schedule()'s default, the one
# the README recommends.
DEFAULT_VARIPATH_MODEL = "contention"


def _create(store, rank: int, size: int, timeout: timedelta):
    """Creator torch calls for each new process group using hoccl."""
    import torch  # noqa: F401  (the extension needs libtorch loaded first)

    from hoccl_backend import _C

    pg = _C.ProcessGroupHOCCL(store, rank, size, timeout)
    _configure_alltoall(pg, rank, size)
    return pg


def varipath_model() -> str:
    """HOCCL_VARIPATH_MODEL (default DEFAULT_VARIPATH_MODEL), checked against varipath's models."""
    from varipath.simulate import MODELS

    model = os.environ.get("HOCCL_VARIPATH_MODEL") or DEFAULT_VARIPATH_MODEL
    if model not in MODELS:
        raise ValueError(f"hoccl: HOCCL_VARIPATH_MODEL={model!r} is not one of {', '.join(MODELS)}")
    return model


def _configure_alltoall(pg, rank: int, size: int) -> None:
    """Hands the backend the scheduler varipath.schedule() runs for HOCCL_TOPOLOGY (default:
    flat) and HOCCL_VARIPATH_MODEL: the same object, with its links, hosts and cost model."""
    if os.environ.get("HOCCL_ALLTOALL_ALGO", "varipath") != "varipath" or size < 2:
        return
    try:
        import varipath
    except ImportError:
        return
    try:
        scheduler = varipath.backend_scheduler(os.environ.get("HOCCL_TOPOLOGY") or None, size, varipath_model())
    except ValueError as e:
        raise ValueError(f"hoccl process group creation on rank {rank}: {e}") from e
    pg.set_alltoall_scheduler(scheduler)


def register() -> None:
    import torch.distributed as dist

    if not dist.is_available():
        return
    if BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])
