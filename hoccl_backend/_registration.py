"""Registers the "hoccl" name with torch.distributed (idempotent, no extension import)."""
from __future__ import annotations

import logging
import sys
from datetime import timedelta

BACKEND_NAME = "hoccl"


def _create(store, rank: int, size: int, timeout: timedelta, global_ranks=None):
    """Creator of a hoccl process group: ``global_ranks`` are the world ranks of a subgroup's
    members in its rank order, None for the default (world) group."""
    import torch  # noqa: F401  (the extension needs libtorch loaded first)

    from hoccl_backend import _C

    # Everything the creator reads from the settings is checked before any rank talks to the
    # store: rank 0 hosts it, so a rank 0 that raised halfway would leave the others reporting a
    # lost store connection instead of the bad setting. Whether the group spans hosts is known
    # only from the store, so a group across hosts builds the scheduler too, as that check, and
    # does not plan with it (its all_to_all is priced by VarioPath's cost model across hosts).
    alltoall = _alltoall_scheduler(rank, size, global_ranks)
    # The group exchanges the host table as it is created; one on several hosts is then joined
    # to its hosts.
    pg = _C.ProcessGroupHOCCL(store, rank, size, timeout, spans_hosts=True)
    if len(pg.hosts()) > 1:
        from hoccl_backend import multihost

        return multihost.span(pg, store, rank, size, timeout)
    if alltoall is not None:
        pg.set_alltoall_scheduler(alltoall[0])
    return pg


def _create_from_options(options, backend_options=None):
    """What torch calls for each new hoccl group (registered with ``extended_api=True``): the
    plain four-argument creator is not told which world ranks a subgroup holds, and a subgroup
    needs them to find its part of HOCCL_TOPOLOGY. torch passes [] for the default group."""
    return _create(options.store, options.group_rank, options.group_size, options.timeout,
                   list(options.global_ranks_in_group) or None)


def _alltoall_scheduler(rank: int, size: int, global_ranks=None):
    """The scheduler varipath.schedule() runs for HOCCL_TOPOLOGY and HOCCL_VARIPATH_MODEL, for
    the backend to plan all_to_all with (the same object, with its links, hosts and cost model),
    as a one-element tuple; None where the backend keeps its default (another algorithm, one
    rank, no varipath). On the flat topology (HOCCL_TOPOLOGY unset) there are no links to
    schedule for, and every pair goes in one phase: (None,). Values come from the configuration
    table, which has checked them."""
    from hoccl_backend import _C

    if _C.config_value("HOCCL_ALLTOALL_ALGO") != "varipath" or size < 2:
        return None
    try:
        import varipath
    except ImportError:
        return None
    spec = _C.config_value("HOCCL_TOPOLOGY")
    try:
        model = _C.config_value("HOCCL_VARIPATH_MODEL")
        topo = None if spec == "flat" else _group_topology(varipath, spec, rank, size, global_ranks)
        return (None if topo is None else varipath.scheduler_for(topo, model),)
    except ValueError as e:
        raise ValueError(f"hoccl process group creation on rank {rank}: {e}") from e


def _group_topology(varipath, spec: str, rank: int, size: int, global_ranks):
    """The topology this group plans on, or None for flat. The world group must match
    HOCCL_TOPOLOGY exactly (a mismatch is a misconfiguration, reported at init); a subgroup
    gets the part of it its ranks occupy, and plans flat with a note when that cannot be
    derived, since failing would make every multi-dimensional job (HSDP, TP x DP, EP x DP)
    unusable with a topology."""
    if global_ranks is None:
        return varipath.backend_topology(spec, size)
    import torch.distributed as dist

    try:
        topo = varipath.group_topology(spec, dist.get_world_size(), global_ranks)
    except varipath.NotInducible as e:
        _info(rank, f"group of world ranks {list(global_ranks)}: all_to_all plans flat, as without "
                    f"HOCCL_TOPOLOGY: {e}")
        return None
    _info(rank, f"group of world ranks {list(global_ranks)}: all_to_all plans on {topo.name}, "
                f"the part of HOCCL_TOPOLOGY={spec} its ranks occupy")
    return topo


def _info(rank: int, message: str) -> None:
    """An INFO note from the group's rank 0: on stderr like the extension's own notes when
    HOCCL_DEBUG is INFO or TRACE, else to the "hoccl" logger (shown where logging is set to
    INFO)."""
    if rank != 0:
        return
    from hoccl_backend import _C

    if _C.config_value("HOCCL_DEBUG") in ("INFO", "TRACE"):
        print(f"[hoccl rank {rank}] {message}", file=sys.stderr, flush=True)
    else:
        logging.getLogger("hoccl").info(message)


def register() -> None:
    import torch.distributed as dist

    if not dist.is_available():
        return
    if BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_from_options, extended_api=True,
                                  devices=["cpu", "cuda"])
