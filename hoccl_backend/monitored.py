"""monitored_barrier for hoccl groups.

torch's `dist.monitored_barrier` refuses every backend but gloo by name before it reaches the
backend, so hoccl offers the same call here. It runs hoccl's own implementation (rank 0 names
the ranks that did not arrive in time; the others learn that rank 0 failed):

    import hoccl_backend
    hoccl_backend.monitored_barrier(timeout=timedelta(seconds=30), wait_all_ranks=True)

`group.monitored_barrier(timeout, wait_all_ranks=...)` on a hoccl ProcessGroup works too.
"""
from __future__ import annotations

from datetime import timedelta


def monitored_barrier(group=None, timeout: timedelta | float | None = None,
                      wait_all_ranks: bool = False) -> None:
    """Same arguments and errors as torch's `dist.monitored_barrier`, for hoccl groups."""
    # Imported here: this module loads with the package during torch's own import (autoload).
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if c10d._rank_not_in_group(group):
        return
    if timeout is None:
        timeout = c10d._get_default_timeout(dist.get_backend(group))
    elif isinstance(timeout, (int, float)):
        timeout = timedelta(seconds=timeout)
    pg = c10d._get_default_group() if group is None else group
    pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
