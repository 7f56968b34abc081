"""Registers the "hoccl" name with torch.distributed (idempotent, no extension import)."""
from __future__ import annotations

from datetime import timedelta

BACKEND_NAME = "hoccl"


def _create(store, rank: int, size: int, timeout: timedelta):
    """Creator torch calls for each new process group using hoccl."""
    import torch  # noqa: F401  (the extension needs libtorch loaded first)

    from hoccl_backend import _C

    if size > 1:
        names, host_of = _C.host_table(store, rank, size, timeout)
        if len(names) > 1:
            from hoccl_backend import multihost

            return multihost.create(store, rank, size, timeout, names, host_of)
    pg = _C.ProcessGroupHOCCL(store, rank, size, timeout)
    _configure_alltoall(pg, rank, size)
    return pg


def _configure_alltoall(pg, rank: int, size: int) -> None:
    """Hands the backend the scheduler varipath.schedule() runs for HOCCL_TOPOLOGY and
    HOCCL_VARIPATH_MODEL: the same object, with its links, hosts and cost model. On the flat
    topology (HOCCL_TOPOLOGY unset) there are no links to schedule for, and every pair goes in
    one phase. Values come from the configuration table, which has checked them."""
    from hoccl_backend import _C

    if _C.config_value("HOCCL_ALLTOALL_ALGO") != "varipath" or size < 2:
        return
    try:
        import varipath
    except ImportError:
        return
    spec = _C.config_value("HOCCL_TOPOLOGY")
    try:
        model = _C.config_value("HOCCL_VARIPATH_MODEL")
        scheduler = None if spec == "flat" else varipath.backend_scheduler(spec, size, model)
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
