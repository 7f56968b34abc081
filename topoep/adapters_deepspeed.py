"""TopoEP inside DeepSpeed's MoE layer (``deepspeed.moe.layer.MoE``).

DeepSpeed's layer is ``MoE.deepspeed_moe`` (a ``MOELayer``): its ``gate`` (``TopKGate``) decides
the routing, and its ``experts`` (``Experts``: a ``ModuleList`` of the user's expert modules,
only this rank's when ``ep_size > 1``) compute behind a fixed-capacity all_to_all. The adapter
keeps the gate exactly as DeepSpeed runs it (top-1/2/k gating, capacity and drop decisions,
random token selection, noise policy, ``l_aux`` and ``exp_counts``) and replaces what follows
it, the dispatch, the experts and the combine, with the TopoEP wrapper, registered in place of
``deepspeed_moe.experts``. ``MoE.forward`` stays DeepSpeed's, so it still returns
``(output, l_aux, exp_counts)`` and still adds the residual MLP of ``use_residual``.

Supported expert placements:

* ``ep_size == 1``: every rank holds all E experts; TopoEP keeps this rank's share and frees
  the rest (any TopoEP group).
* ``ep_size > 1``: DeepSpeed's rank ``r`` of the expert-parallel group holds experts
  ``r * m .. r * m + m - 1`` (m = E / ep_size), which is TopoEP's default placement over the
  same group. The adapter builds TopoEP's view of all E experts from those local ones, so
  ``attach`` needs ``group=expert_parallel_group(layer)`` (the whole world when ep_size is the
  world size) and no ``placement=``; anything else raises. Attach before
  ``deepspeed.initialize`` (after ``deepspeed.init_distributed()``): the engine then sets the
  layer's group as usual.

Not supported (raises): tensor-parallel non-expert layers (``groups.mpu`` with TP > 1).

Under the DeepSpeed engine use ``ep_size`` equal to the TopoEP group's size: the engine then
reduces and scales expert gradients as for its own expert parallelism, which is what TopoEP's
expert gradients are. An ``ep_size=1`` layer suits plain PyTorch (``topoep.prepare`` for DDP).

Dropped routes (capacity overflow, unused tokens) come out of DeepSpeed's gate as expert -1
with gate weight 0. TopoEP takes a dense [n, k] routing, so such a route is sent to a real
expert with weight exactly 0: its contribution to the output and to every gradient is exactly
zero, as in DeepSpeed, at the cost of computing it.
"""
from __future__ import annotations

import copy
import sys
import types

import torch
import torch.nn as nn

DESCRIPTION = "deepspeed.moe.layer.MoE (gate kept, experts dispatch replaced)"
_STOCK_EXPERTS = "experts.deepspeed_experts."  # relative to MoE.deepspeed_moe


def is_deepspeed_moe(module) -> bool:
    """By class path and attributes, so that deepspeed need not be importable."""
    is_moe_class = any(c.__name__ == "MoE" and c.__module__.startswith("deepspeed.moe")
                       for c in type(module).__mro__)
    inner = getattr(module, "deepspeed_moe", None)
    return (is_moe_class and isinstance(inner, nn.Module)
            and isinstance(getattr(inner, "gate", None), nn.Module)
            and isinstance(getattr(getattr(inner, "experts", None), "deepspeed_experts", None),
                           nn.ModuleList))


def deepspeed_moe_spec(module) -> "ExpertsSpec | None":
    from .adapters import ExpertsSpec, module_caller
    if not is_deepspeed_moe(module):
        return None
    inner = module.deepspeed_moe
    _check_no_tensor_parallel(module)
    ep_size, ep_rank = _expert_parallel_position(module)
    modules = _all_experts_view(inner.experts.deepspeed_experts, module.num_experts, ep_size,
                                ep_rank)

    def install(layer, wrapper):
        _check_placement_matches(layer, wrapper, ep_size, ep_rank)
        inner.experts = wrapper
        inner.forward = types.MethodType(_gate_then_topoep, inner)

    return ExpertsSpec(kind=f"{type(module).__name__} (DeepSpeed MoE, ep_size={ep_size}; its "
                       "gate kept, experts dispatch replaced)", num_experts=module.num_experts,
                       modules=modules, fn=_first_output(module_caller(modules[0])),
                       top_k=int(inner.gate.k), install=install,
                       export_prefix=_STOCK_EXPERTS)


# --------------------------------------------------------------------------- checks


def _check_no_tensor_parallel(module) -> None:
    from deepspeed.utils import groups
    from deepspeed.utils.bwc import bwc_tensor_model_parallel_world_size
    if groups.mpu is not None and bwc_tensor_model_parallel_world_size(groups.mpu) > 1:
        raise NotImplementedError(
            f"topoep: {type(module).__name__}: DeepSpeed MoE with tensor-parallel non-expert "
            "layers (groups.mpu, TP > 1) duplicates tokens across TP ranks; TopoEP does not "
            "support it")


def _expert_parallel_position(module) -> tuple:
    """(ep_size, this rank's index in DeepSpeed's expert-parallel group)."""
    ep_size = int(module.ep_size)
    if ep_size == 1:
        return 1, 0
    import torch.distributed as dist
    return ep_size, dist.get_rank(expert_parallel_group(module))


def expert_parallel_group(layer):
    """DeepSpeed's expert-parallel group of ``layer`` (``ep_size > 1``): pass it to
    ``topoep.attach(layer, group=...)``. Before ``deepspeed.initialize`` the layer has none
    yet; the group is then made as ``MoE.set_deepspeed_parallelism`` makes it (DeepSpeed's
    default rank order) but not set on the layer, because ``deepspeed.initialize`` sets it
    later and asserts that no group was set before. Needs ``deepspeed.init_distributed()``."""
    if layer.deepspeed_moe.ep_group is not None:
        return layer.deepspeed_moe.ep_group
    from deepspeed import comm
    from deepspeed.utils import groups
    if not comm.is_initialized():
        raise ValueError(f"topoep: {type(layer).__name__} has ep_size={layer.ep_size}: its "
                         "expert-parallel group is made by DeepSpeed's comm layer; call "
                         "deepspeed.init_distributed() before topoep.attach")
    if layer.expert_group_name not in groups._get_expert_parallel_group_dict():
        groups._create_expert_and_data_parallel(layer.ep_size)
    return groups._get_expert_parallel_group(layer.expert_group_name)


def _check_placement_matches(layer, wrapper, ep_size, ep_rank) -> None:
    """With ep_size > 1 the rank holds only DeepSpeed's block of experts: TopoEP must own
    exactly that block, i.e. run over DeepSpeed's expert-parallel group with its default
    placement."""
    if ep_size == 1:
        return
    import torch.distributed as dist
    m = layer.num_local_experts
    want = list(range(ep_rank * m, (ep_rank + 1) * m))
    ds_ranks = dist.get_process_group_ranks(expert_parallel_group(layer))
    tp_ranks = (list(range(dist.get_world_size())) if wrapper.group is None
                else dist.get_process_group_ranks(wrapper.group))
    if ds_ranks != tp_ranks or wrapper.owned != want:
        raise ValueError(
            f"topoep: rank {dist.get_rank()}: DeepSpeed MoE ep_size={ep_size} holds experts "
            f"{want} here (expert-parallel ranks {ds_ranks}), but TopoEP over ranks {tp_ranks} "
            f"would own experts {wrapper.owned}; attach with group="
            "topoep.adapters_deepspeed.expert_parallel_group(layer) and the default placement, "
            "or build the layer with ep_size=1")


# --------------------------------------------------------------------------- experts


def _all_experts_view(local: nn.ModuleList, num_experts: int, ep_size: int,
                      ep_rank: int) -> nn.ModuleList:
    """E modules for TopoEP: the local experts at DeepSpeed's positions, every other
    position a weightless (meta) copy that only describes the shapes; the placement check
    in ``install`` guarantees TopoEP keeps only the local ones."""
    if ep_size == 1:
        return local
    m = len(local)
    shape_only = copy.deepcopy(local[0]).to("meta")
    return nn.ModuleList(local[e - ep_rank * m] if ep_rank * m <= e < (ep_rank + 1) * m
                         else shape_only for e in range(num_experts))


def _first_output(run_expert):
    """DeepSpeed's ``Experts`` keeps the first element of a tuple-returning expert (an
    (output, bias) pair, as Megatron-DeepSpeed's experts return)."""
    def fn(x, params):
        out = run_expert(x, params)
        return out[0] if isinstance(out, tuple) else out
    return fn


# --------------------------------------------------------------------------- forward


def _gate_then_topoep(self, hidden_states, used_token=None, *args, **kwargs):
    """``MOELayer.forward`` with TopoEP behind DeepSpeed's own gate: ``self`` is the
    MOELayer, ``self.experts`` the TopoEP wrapper."""
    _check_not_averaged_by_engine(self)
    x = hidden_states.reshape(-1, hidden_states.shape[-1])
    # sparse_routes=True: the gate's per-route (expert, gate weight) form, which DeepSpeed's
    # own dispatch uses; experts evicted by capacity come back as -1
    (self.l_aux, _capacity, num_experts, expert_ids, _locations, gate_weights,
     self.exp_counts) = self.gate(x, used_token, True, self.use_tutel)
    ids, weights = _dense_routes(expert_ids, gate_weights, num_experts)
    out = self.experts(x, ids, weights)
    return out.reshape(hidden_states.shape)


def _check_not_averaged_by_engine(moe_layer) -> None:
    """An ep_size=1 layer's expert parameters are, to DeepSpeed's engine, replicated on every
    rank: it all-reduces their gradients over all ranks, which after attach hold different
    experts. Training that way would silently mix experts, so it raises."""
    wrapper = moe_layer.experts
    if moe_layer.ep_size != 1 or wrapper.world == 1 or not (
            moe_layer.training and torch.is_grad_enabled()):
        return
    if _inside_deepspeed_engine():
        raise RuntimeError(
            f"topoep: rank {wrapper.rank}: a DeepSpeed MoE layer built with ep_size=1 runs "
            f"TopoEP over {wrapper.world} ranks inside a DeepSpeed engine, which would average "
            "different experts' gradients over all ranks; build the layer with "
            f"ep_size={wrapper.world} (TopoEP's group size) and attach with group="
            "topoep.adapters_deepspeed.expert_parallel_group(layer)")


def _inside_deepspeed_engine() -> bool:
    """Whether a DeepSpeedEngine method is running this call (a short stack walk)."""
    from deepspeed.runtime.engine import DeepSpeedEngine
    frame = sys._getframe(2)
    for _ in range(32):
        if frame is None:
            return False
        # by the frame's `self`: the engine's forward is wrapped by a decorator
        if isinstance(frame.f_locals.get("self"), DeepSpeedEngine):
            return True
        frame = frame.f_back
    return False


def _dense_routes(expert_ids, gate_weights, num_experts):
    """[k, n] routes with -1 for dropped ones -> TopoEP's [n, k] ids and weights."""
    ids = expert_ids.t().long()
    kept = ids >= 0
    # a dropped route still needs an expert; spreading them keeps the planner's view of the
    # load close to the real one instead of piling them on expert 0
    spread = torch.arange(ids.numel(), device=ids.device).view_as(ids) % num_experts
    weights = torch.where(kept, gate_weights.t(), torch.zeros_like(gate_weights.t()))
    return torch.where(kept, ids, spread), weights


# --------------------------------------------------------------------------- checkpoints


def expert_parallel_state_dict(stock_sd: dict, layer_prefix: str, ep_size: int,
                               ep_rank: int, num_experts: int) -> dict:
    """``topoep.stock_state_dict`` holds all E experts under DeepSpeed's ``ep_size=1``
    names (``{layer_prefix}deepspeed_moe.experts.deepspeed_experts.{e}.*``); a stock layer
    built with ``ep_size > 1`` holds experts ``ep_rank * m ..`` renumbered from 0. This returns
    the state dict that layer loads on this rank."""
    m = num_experts // ep_size
    head = f"{layer_prefix}deepspeed_moe.{_STOCK_EXPERTS}"
    out = {}
    for key, tensor in stock_sd.items():
        if not key.startswith(head):
            out[key] = tensor
            continue
        expert, rest = key[len(head):].split(".", 1)
        local = int(expert) - ep_rank * m
        if 0 <= local < m:
            out[f"{head}{local}.{rest}"] = tensor
    return out
