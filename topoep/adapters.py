"""How TopoEP reads an MoE layer: the experts it balances and where its routing comes from.

TopoEP never re-implements a model's routing or its expert FFN. An adapter answers, for one
kind of layer, four questions, as an ``ExpertsSpec``:

* the experts' weights, as tensors stacked over experts (``stacked``: name -> [E, ...]) or as
  a ``ModuleList`` of E identical modules (``modules``);
* ``fn(x, params)``: one expert applied to rows ``x`` with ``params`` (name -> that expert's
  slice). For stacked experts this calls the model's own experts module (its forward, its
  activation, its chosen kernels) on a one-expert view, so the maths stays the model's;
* the routing: ``route(x) -> (ids [n, k], weights [n, k])`` for layers TopoEP runs whole, or
  ``None`` when the layer routes in its own forward and hands ``(x, ids, weights)`` to its
  experts module (transformers 5), which TopoEP then replaces;
* ``install(layer, wrapper)``: how ``topoep.attach`` puts the wrapper in the layer in place.

Adapters are tried in ``ADAPTERS`` order by ``describe``; ``register_adapter`` adds one. A
layer no adapter recognises raises ``TypeError`` naming what each adapter looked for.
"""
from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn

from . import adapters_deepspeed, megatron_style

PROTOCOL_HINT = ("see topoep/adapters.py for the protocol (ExpertsSpec) and "
                 "topoep.register_adapter to add one")


@dataclass
class ExpertsSpec:
    """What TopoEP needs from one MoE layer (see the module docstring)."""

    kind: str
    num_experts: int
    fn: Callable | None = None
    stacked: dict = field(default_factory=dict)
    modules: nn.ModuleList | None = None
    route: Callable | None = None
    router: nn.Module | None = None
    top_k: int | None = None
    install: Callable | None = None
    # where the stock model keeps the experts' tensors, relative to the module that holds
    # the wrapper once attached (checkpoint.py)
    export_prefix: str = ""
    # gathered experts (name -> [E, ...], or "{e}.{param}") -> the stock layout, for layers
    # that keep them otherwise (Megatron's grouped [d, E * 2f])
    export: Callable | None = None


def shell(module: nn.Module, drop: tuple = (), params: dict | None = None) -> nn.Module:
    """A new module object of the same class that shares everything with ``module`` except
    the attributes in ``drop`` (gone) and ``params`` (replaced). Used so that TopoEP can call
    a layer's own methods (its routing, its experts' forward) without keeping the layer's full
    expert weights alive."""
    out = copy.copy(module)
    out._parameters = {k: v for k, v in module._parameters.items() if k not in drop}
    out._buffers = {k: v for k, v in module._buffers.items() if k not in drop}
    out._modules = {k: v for k, v in module._modules.items() if k not in drop}
    for k, v in (params or {}).items():
        out._parameters[k] = v
    out._forward_hooks, out._forward_pre_hooks = type(module._forward_hooks)(), type(
        module._forward_pre_hooks)()
    return out


# --------------------------------------------------------------------------- stacked experts


def _takes_routing(module: nn.Module) -> bool:
    """A forward(hidden_states, top_k_index, top_k_weights), as transformers 5's experts."""
    try:
        params = list(inspect.signature(type(module).forward).parameters)
    except (TypeError, ValueError):
        return False
    return len(params) >= 4 and params[2] == "top_k_index" and params[3] == "top_k_weights"


def _stacked_params(module: nn.Module) -> dict:
    return dict(module.named_parameters(recurse=False))


def is_stacked_experts(module) -> bool:
    """A module holding E experts as tensors [E, ...] whose forward takes the routing."""
    if not isinstance(module, nn.Module) or not _takes_routing(module):
        return False
    e = getattr(module, "num_experts", None)
    ps = _stacked_params(module)
    return (isinstance(e, int) and e > 0 and bool(ps)
            and all(p.dim() >= 1 and p.shape[0] == e for p in ps.values()))


def one_expert_caller(experts: nn.Module) -> Callable:
    """``fn(x, params)`` running ``experts``' own forward as a one-expert module: every row
    routed to expert 0 with weight 1 (exact in every dtype), the gate applied by TopoEP."""
    meta = {n: nn.Parameter(torch.empty((1,) + tuple(p.shape[1:]), dtype=p.dtype,
                                        device="meta"), requires_grad=p.requires_grad)
            for n, p in _stacked_params(experts).items()}
    template = shell(experts, drop=tuple(meta), params=meta)
    template.num_experts = 1

    def fn(x, params):
        n = x.shape[0]
        ids = torch.zeros((n, 1), dtype=torch.long, device=x.device)
        ones = torch.ones((n, 1), dtype=x.dtype, device=x.device)
        one = {k: v.unsqueeze(0) for k, v in params.items()}
        return torch.func.functional_call(template, one, (x, ids, ones))
    return fn


def module_caller(template: nn.Module) -> Callable:
    """``fn(x, params)`` for ModuleList experts: ``template``'s forward with ``params``."""
    meta = copy.deepcopy(template).to("meta")
    return lambda x, params: torch.func.functional_call(meta, params, (x,))


def stacked_experts_spec(experts: nn.Module) -> ExpertsSpec:
    return ExpertsSpec(kind=f"stacked experts ({type(experts).__name__})",
                       num_experts=experts.num_experts, fn=one_expert_caller(experts),
                       stacked=_stacked_params(experts))


def routed_block_spec(block: nn.Module) -> ExpertsSpec | None:
    """A block that routes in its own forward and calls ``block.experts(x, ids, weights)``
    (every transformers 5 MoE block: Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek-V3, ...). Only the
    experts are replaced; the block's routing, shared experts and jitter stay its own."""
    experts = getattr(block, "experts", None)
    if not is_stacked_experts(experts):
        return None
    spec = stacked_experts_spec(experts)
    spec.kind = f"{type(block).__name__} (its experts {type(experts).__name__} replaced)"

    def install(layer, wrapper):
        layer.experts = wrapper
    spec.install, spec.export_prefix = install, "experts."
    return spec


def experts_module_spec(module: nn.Module) -> ExpertsSpec | None:
    """The experts module itself (``TopoEPMoE(block.experts)``)."""
    return stacked_experts_spec(module) if is_stacked_experts(module) else None


# --------------------------------------------------------------------------- router layers


_FFN_NAMES = ("w1", "b1", "w2", "b2")


def _router_layer_route(layer: nn.Module, stacked_names: tuple) -> Callable | None:
    """The layer's own ``route`` method, bound to a shell without its expert weights."""
    if not callable(getattr(type(layer), "route", None)):
        return None
    return shell(layer, drop=stacked_names + ("experts",)).route


def router_layer_spec(layer: nn.Module) -> ExpertsSpec | None:
    """hoccl's own layout (``topoep.SimpleMoE``): ``router`` (Linear to E logits), ``top_k``,
    experts as stacked ``w1, b1, w2, b2`` or a ModuleList ``experts``; an optional
    ``route(x) -> (ids, weights)``, else softmax then top-k (no renormalisation)."""
    router = getattr(layer, "router", None)
    if not isinstance(router, nn.Linear) or not hasattr(layer, "top_k"):
        return None
    from .moe import stacked_ffn
    e = router.out_features
    spec = ExpertsSpec(kind=f"{type(layer).__name__} (router + experts)", num_experts=e,
                       router=router, top_k=int(layer.top_k))
    if all(isinstance(getattr(layer, n, None), torch.Tensor) for n in _FFN_NAMES):
        spec.stacked = {n: getattr(layer, n) for n in _FFN_NAMES}
        spec.fn = stacked_ffn
    elif isinstance(getattr(layer, "experts", None), nn.ModuleList):
        spec.modules = layer.experts
    else:
        raise TypeError(f"topoep: {type(layer).__name__} has a router but its experts are "
                        "neither stacked weights (w1, b1, w2, b2) nor a ModuleList `experts`; "
                        + PROTOCOL_HINT)
    spec.route = _router_layer_route(layer, tuple(spec.stacked))
    spec.export_prefix = "experts." if spec.modules is not None else ""

    names, listed = tuple(spec.stacked), spec.modules is not None  # (not the tensors)

    def install(target, wrapper):
        for n in names:  # the full tensors go: the wrapper holds this rank's rows
            delattr(target, n)
        if listed:
            del target.experts
        target.topoep = wrapper
        target.forward = wrapper.forward
    spec.install = install
    return spec


# --------------------------------------------------------------------------- lookup


ADAPTERS: list = [("transformers-style block (gate + experts(x, top_k_index, "
                   "top_k_weights))", routed_block_spec),
                  ("experts module with forward(x, top_k_index, top_k_weights)",
                   experts_module_spec),
                  ("router layer (router Linear, top_k, w1/b1/w2/b2 or ModuleList experts)",
                   router_layer_spec),
                  (adapters_deepspeed.DESCRIPTION, adapters_deepspeed.deepspeed_moe_spec),
                  (megatron_style.DESCRIPTION, megatron_style.megatron_style_spec)]


def register_adapter(description: str, fn: Callable, first: bool = True) -> None:
    """Adds an adapter: ``fn(module) -> ExpertsSpec | None`` (None: not this kind)."""
    entry = (description, fn)
    ADAPTERS.insert(0, entry) if first else ADAPTERS.append(entry)


def describe(module: nn.Module) -> ExpertsSpec:
    """The spec of the first adapter that recognises ``module``; TypeError naming what each
    adapter looked for when none does."""
    from .moe import TopoEPMoE
    if isinstance(module, TopoEPMoE):
        raise TypeError("topoep: this module is already a TopoEPMoE")
    for _, fn in ADAPTERS:
        spec = fn(module)
        if spec is not None:
            return spec
    looked = "; ".join(d for d, _ in ADAPTERS)
    raise TypeError(f"topoep: {type(module).__name__} is not an MoE layer TopoEP knows. It looked "
                    f"for: {looked}. " + PROTOCOL_HINT)


def is_moe_layer(module: nn.Module) -> bool:
    try:
        describe(module)
        return True
    except TypeError:
        return False
