"""torch.distributed names that changed between the torch versions hoccl supports.

torch 2.13 renames ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` to
``all_gather_single`` / ``reduce_scatter_single`` and warns on the old names; torch 2.11 (the
GPU machines) has only the old ones. Same arguments either way.
"""
import torch.distributed as dist

all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = (getattr(dist, "reduce_scatter_single", None)
                         or dist.reduce_scatter_tensor)
