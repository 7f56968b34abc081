"""Using hoccl under Hugging Face accelerate and the transformers Trainer.

Why this file exists: accelerate chooses the backend itself. On a machine without an accelerator
(``Accelerator(cpu=True)``, ``TrainingArguments(use_cpu=True)``) its ``PartialState`` always
picks "gloo" (or "mpi"), and a requested ``backend="hoccl"`` (``InitProcessGroupKwargs``,
``TrainingArguments(ddp_backend="hoccl")``) fails with "Your assigned backend hoccl is not
available, please use gloo". There is no setting to name another CPU backend. What accelerate
does allow is a process group that already exists: it then uses that group as it is. So
:func:`accelerate_state` creates the hoccl group first, lets accelerate build its state on it,
and records the backend in that state's public ``backend`` attribute, which accelerate would
otherwise leave at "gloo" while every collective runs on hoccl. Nothing of accelerate's code is
replaced; the one assignment touches the attribute accelerate documents and prints.

On a machine with CUDA, accelerate passes a named backend through, and
``InitProcessGroupKwargs(backend="hoccl")`` or ``TrainingArguments(ddp_backend="hoccl")`` works
without this module; :func:`accelerate_state` with ``cpu=False`` does the same.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Optional

from hoccl_backend._registration import BACKEND_NAME


def accelerate_state(cpu: bool = True, timeout: Optional[timedelta] = None):
    """accelerate's ``PartialState`` on a hoccl process group: call it before creating an
    ``Accelerator`` or ``TrainingArguments`` (pass ``accelerator_config={"use_configured_state":
    True}`` to the latter, or the Trainer discards this state and reports "gloo").

    Creates the default process group with hoccl from the usual environment (``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, as torchrun sets them) unless it exists.
    Raises ValueError when the existing group is not hoccl's, and when accelerate would treat a
    multi-rank job as a single process (``cpu=False`` without an accelerator), which would train
    every rank on its own without a word."""
    import torch.distributed as dist
    from accelerate import PartialState
    from accelerate.utils import DistributedType

    _ensure_hoccl_group(dist, timeout)
    state = PartialState(cpu=True) if cpu else PartialState(backend=BACKEND_NAME)
    if state.distributed_type == DistributedType.NO and dist.get_world_size() > 1:
        raise ValueError(f"accelerate_state(cpu={cpu}): accelerate found no accelerator and would run "
                         f"{dist.get_world_size()} ranks as independent processes; pass cpu=True")
    if state.num_processes != dist.get_world_size():
        raise ValueError(f"accelerate_state: accelerate's state was set up for {state.num_processes} "
                         f"processes before hoccl's group of {dist.get_world_size()}; call this first")
    # accelerate names the backend it would have picked ("gloo" for CPU), not the group's
    state.backend = dist.get_backend()
    return state


def _ensure_hoccl_group(dist, timeout: Optional[timedelta]) -> None:
    import hoccl_backend  # noqa: F401  (registers the backend name)

    if not dist.is_initialized():
        kwargs = {} if timeout is None else {"timeout": timeout}
        dist.init_process_group(BACKEND_NAME, **kwargs)
        return
    backend = dist.get_backend()
    if backend != BACKEND_NAME:
        raise ValueError(f"accelerate_state: the default process group already uses {backend!r}, not "
                         f"{BACKEND_NAME!r}; call accelerate_state() before creating an Accelerator, "
                         "PartialState or TrainingArguments")
