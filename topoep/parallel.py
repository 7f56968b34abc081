"""Expert parallelism beside data parallelism (DDP, FSDP2): ``topoep.prepare(model)``.

TopoEP's expert rows differ between ranks, so data parallelism must leave them alone: DDP
would broadcast rank 0's rows to every rank at construction and average unrelated experts'
gradients; ``fully_shard`` would shard them. Their gradients, on the other hand, must be
scaled as the rest: after TopoEP's backward an owner's gradient holds every rank's tokens
(a sum), where DDP and FSDP2 average the dense gradients over the ranks.

``prepare(model)`` does both, once, before ``DistributedDataParallel(model)`` or
``fully_shard(model, ignored_params=...)`` (it returns that set). A layer that runs under DDP or
FSDP2 without it raises at its next training forward instead of training wrongly.
"""
from __future__ import annotations

import sys
import weakref

import torch
import torch.distributed as dist
import torch.nn as nn

_TOPOEP_BUFFERS = ("logical_at", "phys_of", "_home_gpu")
_ignored_by_ddp: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def topoep_layers(model: nn.Module) -> list:
    """(qualified name, TopoEPMoE) of every TopoEP layer in ``model``."""
    from .moe import TopoEPMoE
    return [(n, m) for n, m in model.named_modules() if isinstance(m, TopoEPMoE)]


def expert_parameters(model: nn.Module) -> set:
    """The parameters TopoEP owns per rank (this rank's expert rows)."""
    return {p for _, layer in topoep_layers(model) for _, p in layer.expert_named_parameters()}


def prepare(model: nn.Module, group=None) -> set:
    """Makes ``model``'s TopoEP layers safe under data parallelism over ``group`` (default:
    the world) and returns their expert parameters, for ``fully_shard(ignored_params=...)``.

    * DDP ignores the expert parameters and TopoEP's buffers (set on ``model``: wrap this
      same module in ``DistributedDataParallel``);
    * each expert gradient is divided by the group's size as it is produced, so the experts
      train as under plain DDP (whose averaged gradients equal TopoEP's sum over ranks / size).

    The TopoEP layers' expert-parallel group must hold the same ranks as ``group``.
    """
    layers = topoep_layers(model)
    if not layers:
        raise ValueError("topoep.prepare: the model holds no TopoEP layer (call topoep.attach "
                         "first)")
    size = dist.get_world_size(group)
    dp_ranks = _ranks(group)
    for name, layer in layers:
        if _ranks(layer.group) != dp_ranks:
            raise NotImplementedError(
                f"topoep.prepare: rank {dist.get_rank()}: layer {name!r} is expert parallel over "
                f"ranks {_ranks(layer.group)} but data parallel over {dp_ranks}; TopoEP "
                "supports expert parallelism over the data-parallel group only")
    _ignore_in_ddp(model, layers)
    for _, layer in layers:
        for _, p in layer.expert_named_parameters():
            if getattr(p, "_topoep_grad_scale", None) is None:
                p.register_hook(lambda g, s=size: g / s)
                p._topoep_grad_scale = size
        layer._data_parallel_ready = True
    return expert_parameters(model)


def _ranks(group) -> list:
    if group is None or group is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    return list(dist.get_process_group_ranks(group))


def _ignore_in_ddp(model, layers) -> None:
    names = set(getattr(model, "_ddp_params_and_buffers_to_ignore", ()))
    for name, layer in layers:
        prefix = f"{name}." if name else ""
        names |= {prefix + n for n, _ in layer.expert_named_parameters()}
        names |= {prefix + b for b in _TOPOEP_BUFFERS}
    torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        model, sorted(names))


# --------------------------------------------------------------------------- misuse


def check_data_parallel_use(layer) -> None:
    """Raises when ``layer`` trains under DDP or FSDP2 that would corrupt its experts or leave
    their gradients unscaled. Cheap: a short walk up the Python stack per training forward."""
    if not (layer.training and torch.is_grad_enabled()) or torch.compiler.is_compiling():
        return
    where = f"topoep: rank {layer.rank}: TopoEP layer ({layer.kind})"
    fix = "call topoep.prepare(model) before wrapping the model"
    params = [p for _, p in layer.expert_named_parameters()]
    ready = getattr(layer, "_data_parallel_ready", False)
    if getattr(layer, "_is_fsdp_managed_module", False):  # set by fully_shard on its modules
        if {id(p) for p in params} != layer._expert_ids:
            raise RuntimeError(f"{where}: fully_shard sharded its expert parameters, which "
                               "differ between ranks; pass ignored_params=topoep.prepare(model) "
                               "to fully_shard")
        if not ready:
            raise RuntimeError(f"{where} runs inside an FSDP2 model, whose gradients are "
                               f"averaged over ranks while its experts' are summed; {fix} and "
                               "pass ignored_params=topoep.prepare(model) to fully_shard")
    ddp = _enclosing_ddp()
    if ddp is None:
        return
    ignored = _ddp_ignored_ids(ddp)
    if not all(id(p) in ignored for p in params):
        raise RuntimeError(f"{where} runs under DistributedDataParallel, which broadcasts rank "
                           "0's expert rows to every rank and averages unrelated experts' "
                           f"gradients; {fix}")
    if not ready:
        raise RuntimeError(f"{where}: DDP ignores its experts but their gradients are not "
                           f"scaled as DDP's averaged ones; {fix}")


def _enclosing_ddp():
    """The DistributedDataParallel whose forward is running this call, if any."""
    ddp_cls = torch.nn.parallel.DistributedDataParallel
    codes = {ddp_cls.forward.__code__, ddp_cls._run_ddp_forward.__code__}
    frame = sys._getframe(2)
    for _ in range(32):
        if frame is None:
            return None
        if frame.f_code in codes:
            return frame.f_locals.get("self")
        frame = frame.f_back
    return None


def _ddp_ignored_ids(ddp) -> set:
    if ddp not in _ignored_by_ddp:
        names = getattr(ddp, "parameters_to_ignore", set())
        _ignored_by_ddp[ddp] = {id(p) for n, p in ddp.module.named_parameters() if n in names}
    return _ignored_by_ddp[ddp]
