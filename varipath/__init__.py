"""VarioPath: topology- and demand-aware alltoallv scheduling.

Public API (tests and the hoccl backend rely on it):

* :class:`Topology` — presets, JSON, ``nvidia-smi topo -m`` parsing, fixed routing.
* :func:`schedule` — plan phases for a demand matrix with the C++ online scheduler.
* :func:`simulate`, :func:`lower_bound` — flow simulator and link-congestion bound.
* :mod:`varipath.baselines` — ``direct``, ``pairwise``, ``fast``.
* :func:`backend_scheduler` — the scheduler the backend plans with for ``HOCCL_TOPOLOGY`` and
  ``HOCCL_VARIPATH_MODEL``; :func:`backend_config` — its inputs.
"""
from __future__ import annotations

import os
from typing import List, Optional, Sequence, Tuple

import numpy as np

from .simulate import COPY_ENGINES, ETA_BETA, ETA_MIN, MODELS, check_demand, lower_bound, simulate
from .topology import NotInducible, Topology, flat

__all__ = ["Topology", "NotInducible", "schedule", "simulate", "lower_bound", "backend_config",
           "backend_scheduler", "backend_topology", "group_topology", "resolve_topology", "scheduler_for",
           "MODELS"]

Phases = List[List[Tuple[int, int, int]]]


def resolve_topology(spec: Optional[str], world_size: int) -> Topology:
    """``HOCCL_TOPOLOGY`` value -> Topology: a preset (``name`` or ``name:hosts``), a ``.json``
    path, ``auto`` (parse ``nvidia-smi topo -m``), or None for a flat topology."""
    if spec is None or spec == "" or spec == "flat":
        return flat(world_size)
    if spec == "auto":
        from .smi import detect

        topo = detect()
        return topo if topo is not None else flat(world_size)
    if spec.endswith(".json") or os.path.sep in spec:
        if not os.path.exists(spec):
            raise ValueError(f"HOCCL_TOPOLOGY={spec!r}: no such topology file")
        return Topology.from_json(spec)
    name, _, hosts = spec.partition(":")
    return Topology.preset(name, int(hosts) if hosts else 1)


def backend_topology(spec: Optional[str], world_size: int) -> Topology:
    """The topology ``HOCCL_TOPOLOGY=spec`` names for a group of ``world_size`` ranks (ValueError
    when its GPU count differs)."""
    topo = resolve_topology(spec, world_size)
    if topo.num_gpus != world_size:
        raise ValueError(f"HOCCL_TOPOLOGY={spec!r} describes {topo.num_gpus} GPUs but the process "
                         f"group has world_size={world_size}")
    return topo


def group_topology(spec: Optional[str], world_size: int, global_ranks: Sequence[int]) -> Topology:
    """The topology a process group over some of the world's ranks plans its all_to_all on.

    ``HOCCL_TOPOLOGY=spec`` describes the machine the whole world occupies, world rank r on GPU
    r; the group's rank i is world rank ``global_ranks[i]``, so it gets
    ``topology.induced(global_ranks)``: the same GPUs and links. Raises :class:`NotInducible`
    when that cannot be derived: the topology does not describe the world (its GPU count
    differs), or the group spans several hosts (varipath's multi-host channels are built for a
    preset replicated over whole hosts). A bad ``spec`` raises ValueError as for the world."""
    topo = resolve_topology(spec, world_size)
    ranks = [int(r) for r in global_ranks]
    if topo.num_gpus != world_size:
        raise NotInducible(f"HOCCL_TOPOLOGY={spec!r} describes {topo.num_gpus} GPUs but the world has "
                           f"{world_size} ranks, so world ranks {ranks} cannot be placed on its GPUs")
    if ranks == list(range(world_size)):
        return topo
    sub = topo.induced(ranks)
    if sub.num_hosts > 1:
        raise NotInducible(f"world ranks {ranks} span {sub.num_hosts} hosts of HOCCL_TOPOLOGY={spec!r}; "
                           "varipath plans several hosts only for a preset over whole hosts")
    return sub


def backend_config(spec: Optional[str], world_size: int) -> dict:
    """Inputs of the C++ ``Scheduler`` for ``HOCCL_TOPOLOGY=spec`` and ``world_size`` ranks:
    ``channels`` (expanded), ``phase_latency_s``, ``bandwidth_Bps`` and the ``topology``."""
    topo = backend_topology(spec, world_size)
    from .catalog import working_set

    return {"channels": working_set(topo), "phase_latency_s": topo.phase_start_s(),
            "bandwidth_Bps": topo.pair_bandwidth(), "topology": topo}


def backend_scheduler(spec: Optional[str], world_size: int, model: str = "contention"):
    """The scheduler the backend's ``all_to_all`` plans with for ``HOCCL_TOPOLOGY=spec`` and
    ``HOCCL_VARIPATH_MODEL=model``: :func:`scheduler_for` of that topology, so the backend's
    plans are exactly :func:`schedule`'s."""
    return scheduler_for(backend_topology(spec, world_size), model)


def _link_model(topo: Topology) -> Tuple[List[float], List[List[int]]]:
    from .simulate import _incidence

    inc = _incidence(topo)
    n = topo.num_gpus
    paths = [[] if s == d else inc.path(s, d).tolist() for s in range(n) for d in range(n)]
    return inc.bw.tolist(), paths


def configure_scheduler(sched, topo: Topology, model: str) -> None:
    """Installs ``topo``'s links, hosts and the cost model of ``model`` on a C++ ``Scheduler``."""
    sched.set_link_model(*_link_model(topo))
    if topo.num_hosts > 1:
        from .catalog import gpu_hosts

        host_of = [0] * topo.num_gpus
        for h, gpus in gpu_hosts(topo).items():
            for g in gpus:
                host_of[g] = h
        sched.set_hosts(host_of)
    if model == "contention":
        sched.set_cost_model(ETA_BETA, ETA_MIN, 0)
    elif model == "dma":
        sched.set_cost_model(0.0, 1.0, COPY_ENGINES)
    else:
        sched.set_cost_model(0.0, 1.0, 0)


def scheduler_for(topo: Topology, model: str = "contention"):
    """The (cached) C++ scheduler for ``topo`` with the link model and cost model installed.

    The hoccl backend plans its all_to_all with this very object (see :func:`backend_scheduler`):
    planning only reads it, but its setters must not be called while a process group uses it."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {MODELS}")
    cache = topo.__dict__.setdefault("_vp_schedulers", {})
    sched = cache.get(model)
    if sched is None:
        from ._build import load_scheduler
        from .catalog import working_set

        mod = load_scheduler()
        sched = mod.Scheduler(topo.num_gpus, working_set(topo), topo.phase_start_s(), topo.pair_bandwidth())
        configure_scheduler(sched, topo, model)
        cache[model] = sched
    return sched


def schedule(demand, topo: Topology, model: str = "contention") -> Phases:
    """Plan ``demand`` (N x N bytes, diagonal ignored) on ``topo`` with the C++ scheduler.

    ``model`` is the cost model the scheduler uses to choose among its candidate plans (the
    deployment's calibrated simulator model; ``contention`` by default)."""
    dem = check_demand(demand, topo.num_gpus)
    return scheduler_for(topo, model).plan(dem.ravel().tolist())


def plan_info(demand, topo: Topology, model: str = "contention") -> Tuple[Phases, dict]:
    """Like :func:`schedule`, plus the chosen candidate's estimate and shape."""
    dem = check_demand(demand, topo.num_gpus)
    return scheduler_for(topo, model).plan_info(dem.ravel().tolist())


def coverage(phases: Sequence[Sequence[Tuple[int, int, int]]], n: int) -> np.ndarray:
    """Bytes per (src, dst) summed over all phases."""
    out = np.zeros((n, n), dtype=np.int64)
    for ph in phases:
        for s, d, b in ph:
            out[s, d] += b
    return out


def __getattr__(name: str):
    """`varipath.baselines` without an explicit import (the documented contract), loaded on first
    use so that `import varipath` at process-group creation does not pull in scipy."""
    if name == "baselines":
        import importlib

        return importlib.import_module(".baselines", __name__)  # binds varipath.baselines too
    raise AttributeError(f"module 'varipath' has no attribute {name!r}")
