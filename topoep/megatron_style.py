"""A Megatron-style MoE layer and its TopoEP adapter.

Why a layer of our own: megatron-core 0.16 installs and builds its ``MoELayer`` on CPU (with
the ``allgather`` dispatcher), but ``TopKRouter.gating`` moves a CPU router weight to
``torch.cuda.current_device()`` on every forward and the ``alltoall`` dispatcher makes a CUDA
stream in its constructor, so Megatron's own layer cannot run where hoccl's tests run.
``MegatronStyleMoE`` has Megatron-Core's interfaces and weight layout, so the adapter reads
the same things it would read there:

* ``router(x) -> (probs [n, E], routing_map [n, E] bool)``: router weight [E, d]; softmax
  after the top-k selection (or before it, ``pre_softmax``) or sigmoid normalised over the
  top-k, times ``topk_scaling_factor``; ``probs`` is zero outside each token's top-k. A router
  may instead return ``(weights [n, k], ids [n, k])`` (``returns="ids"``).
* ``experts`` (GroupedMLP): ``weight1`` [d, E * 2f] and ``weight2`` [E * f, d], read per expert
  as ``weight1.view(E, d, 2f)`` / ``weight2.view(E, f, d)`` (a reinterpretation of the memory,
  not a column split, as GroupedMLP does); SwiGLU: ``silu(gate) * up``, gate the first half.
* ``forward(hidden_states) -> (output, mlp_bias)`` with ``mlp_bias`` None.

The adapter keeps the router (its output is the routing, converted, never recomputed),
TopoEP holds this rank's slices of ``weight1``/``weight2`` ([E_loc, d, 2f], [E_loc, f, d]), and
the expert maths is the layer's own ``experts.forward`` on a one-expert view.
``topoep.stock_state_dict`` exports the grouped layout ([d, E * 2f], [E * f, d]).

Not supported: a layer holding only some experts (``experts.num_local_experts`` smaller than
the router's E, Megatron's expert parallelism); it raises.
"""
from __future__ import annotations

import types

import torch
import torch.nn as nn
import torch.nn.functional as F

DESCRIPTION = ("Megatron-style layer (router -> (probs, routing_map) or (weights, ids); "
               "experts with grouped weight1 [d, E*2f], weight2 [E*f, d])")


class MegatronStyleRouter(nn.Module):
    def __init__(self, hidden_size: int, num_experts: int, topk: int,
                 score_function: str = "softmax", pre_softmax: bool = False,
                 topk_scaling_factor: float | None = None, returns: str = "map"):
        super().__init__()
        if score_function not in ("softmax", "sigmoid"):
            raise ValueError(f"MegatronStyleRouter: score_function must be 'softmax' or "
                             f"'sigmoid', got {score_function!r}")
        if returns not in ("map", "ids"):
            raise ValueError(f"MegatronStyleRouter: returns must be 'map' or 'ids', got "
                             f"{returns!r}")
        self.weight = nn.Parameter(torch.randn(num_experts, hidden_size) / hidden_size ** 0.5)
        self.num_experts, self.topk = num_experts, topk
        self.score_function, self.pre_softmax = score_function, pre_softmax
        self.topk_scaling_factor, self.returns = topk_scaling_factor, returns

    def forward(self, x):
        # routing in at least fp32, as Megatron's router dtype option does
        dtype = torch.promote_types(x.dtype, torch.float32)
        logits = F.linear(x.to(dtype), self.weight.to(dtype))
        probs, ids = self._topk_probs(logits)
        if self.topk_scaling_factor is not None:
            probs = probs * self.topk_scaling_factor
        if self.returns == "ids":
            return probs, ids
        full = torch.zeros_like(logits).scatter(1, ids, probs)
        return full, torch.zeros_like(logits, dtype=torch.bool).scatter(1, ids, True)

    def _topk_probs(self, logits):
        if self.score_function == "sigmoid":
            probs, ids = torch.topk(torch.sigmoid(logits), self.topk, dim=-1)
            if self.topk > 1:
                probs = probs / (probs.sum(-1, keepdim=True) + 1e-20)
            return probs, ids
        if self.pre_softmax:
            return torch.topk(torch.softmax(logits, dim=-1), self.topk, dim=-1)
        scores, ids = torch.topk(logits, self.topk, dim=-1)
        return torch.softmax(scores, dim=-1), ids


class MegatronStyleGroupedMLP(nn.Module):
    def __init__(self, hidden_size: int, ffn_hidden_size: int, num_local_experts: int):
        super().__init__()
        self.hidden_size, self.num_local_experts = hidden_size, num_local_experts
        e, d, f = num_local_experts, hidden_size, ffn_hidden_size
        self.weight1 = nn.Parameter(torch.randn(d, e * 2 * f) / d ** 0.5)
        self.weight2 = nn.Parameter(torch.randn(e * f, d) / f ** 0.5)

    def forward(self, permuted_tokens, tokens_per_expert):
        """Rows sorted by expert, ``tokens_per_expert`` [E_local] rows each."""
        w1 = self.weight1.view(self.num_local_experts, self.hidden_size, -1)
        w2 = self.weight2.view(self.num_local_experts, -1, self.hidden_size)
        counts = torch.as_tensor(tokens_per_expert).tolist()
        outs = []
        for e, rows in enumerate(torch.split(permuted_tokens, counts)):
            gate, up = torch.chunk(rows @ w1[e], 2, dim=-1)
            outs.append((F.silu(gate) * up) @ w2[e])
        return torch.cat(outs), None


class MegatronStyleMoE(nn.Module):
    """Router + GroupedMLP experts; ``forward(hidden_states [..., d]) -> (output, None)``."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int, num_experts: int,
                 topk: int = 2, **router_options):
        super().__init__()
        self.router = MegatronStyleRouter(hidden_size, num_experts, topk, **router_options)
        self.experts = MegatronStyleGroupedMLP(hidden_size, ffn_hidden_size, num_experts)

    def forward(self, hidden_states):
        x = hidden_states.reshape(-1, hidden_states.shape[-1])
        probs, routing_map = routing_as_map(self.router(x), self.router.num_experts)
        expert_of_row, token_of_row = routing_map.t().nonzero(as_tuple=True)  # expert-major
        out_rows, _ = self.experts(x.index_select(0, token_of_row), routing_map.sum(0))
        weighted = out_rows * probs[token_of_row, expert_of_row][:, None]
        out = torch.zeros_like(x).index_add(0, token_of_row, weighted.to(x.dtype))
        return out.reshape(hidden_states.shape), None


def routing_as_map(router_output, num_experts):
    """(probs, routing_map) from either router output form."""
    first, second = router_output
    if second.dtype == torch.bool:
        return first, second
    probs = torch.zeros(first.shape[0], num_experts, dtype=first.dtype, device=first.device)
    probs = probs.scatter(1, second, first)
    return probs, torch.zeros_like(probs, dtype=torch.bool).scatter(1, second, True)


def routing_as_ids(router_output, topk):
    """TopoEP's (ids [n, k], weights [n, k]) from either router output form. A token with
    fewer than k experts in its routing map (dropped by a capacity) gets unselected experts
    at probability 0, which contribute exactly nothing."""
    first, second = router_output
    if second.dtype != torch.bool:
        return second, first
    # stable sort of the boolean map puts each token's chosen experts first, in expert order
    ids = torch.sort(second.to(torch.int8), dim=1, descending=True, stable=True).indices
    ids = ids[:, :topk]
    return ids, first.gather(1, ids)


# --------------------------------------------------------------------------- adapter


def is_megatron_style(module) -> bool:
    router, experts = getattr(module, "router", None), getattr(module, "experts", None)
    return (isinstance(router, nn.Module) and isinstance(experts, nn.Module)
            and isinstance(getattr(experts, "weight1", None), torch.Tensor)
            and isinstance(getattr(experts, "weight2", None), torch.Tensor)
            and isinstance(getattr(experts, "num_local_experts", None), int)
            and isinstance(getattr(router, "topk", None), int))


def megatron_style_spec(module) -> "ExpertsSpec | None":
    from .adapters import ExpertsSpec
    if not is_megatron_style(module):
        return None
    experts = module.experts
    num_experts = _router_experts(module)
    if experts.num_local_experts != num_experts:
        raise NotImplementedError(
            f"topoep: {type(module).__name__}: its experts hold {experts.num_local_experts} of "
            f"the router's {num_experts} experts (Megatron expert parallelism); TopoEP needs a "
            "layer built with all experts (expert_model_parallel_size=1) and distributes them "
            "itself")
    d = experts.hidden_size
    stacked = {"weight1": experts.weight1.view(num_experts, d, -1),
               "weight2": experts.weight2.view(num_experts, -1, d)}

    def install(layer, wrapper):
        layer.experts = wrapper
        layer.forward = types.MethodType(_route_then_topoep, layer)

    return ExpertsSpec(kind=f"{type(module).__name__} (Megatron-style; its router kept, "
                       "grouped experts replaced)", num_experts=num_experts,
                       fn=_one_expert_caller(experts), stacked=stacked,
                       top_k=int(module.router.topk), install=install,
                       export_prefix="experts.", export=_grouped_layout)


def _router_experts(module) -> int:
    e = getattr(module.router, "num_experts", None)
    if not isinstance(e, int):
        w = getattr(module.router, "weight", None)
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"topoep: {type(module).__name__}: its router has neither "
                            "num_experts nor a weight [E, d] to count the experts by")
        e = w.shape[0]
    return e


def _one_expert_caller(experts):
    """``fn(x, params)``: the layer's own GroupedMLP forward with one expert."""
    from .adapters import shell
    d = experts.hidden_size
    e = experts.num_local_experts
    one_shapes = {"weight1": (d, experts.weight1.shape[1] // e),
                  "weight2": (experts.weight2.shape[0] // e, d)}
    meta = {n: nn.Parameter(torch.empty(s, dtype=experts.weight1.dtype, device="meta"))
            for n, s in one_shapes.items()}
    template = shell(experts, drop=tuple(meta), params=meta)
    template.num_local_experts = 1

    def fn(x, params):
        one = {"weight1": params["weight1"].reshape(d, -1),
               "weight2": params["weight2"].reshape(-1, d)}
        counts = torch.tensor([x.shape[0]])
        out = torch.func.functional_call(template, one, (x, counts))
        return out[0] if isinstance(out, tuple) else out
    return fn


def _route_then_topoep(self, hidden_states):
    """The layer's forward once attached: ``self.experts`` is the TopoEP wrapper."""
    x = hidden_states.reshape(-1, hidden_states.shape[-1])
    ids, weights = routing_as_ids(self.router(x), self.router.topk)
    out = self.experts(x, ids, weights)
    return out.reshape(hidden_states.shape), None


def _grouped_layout(out: dict) -> dict:
    """TopoEP gathers experts stacked [E, d, 2f] / [E, f, d]; the stock layer keeps the same
    memory as [d, E * 2f] / [E * f, d]."""
    d = out["weight1"].shape[1]
    out["weight1"] = out["weight1"].reshape(d, -1)
    out["weight2"] = out["weight2"].reshape(-1, d)
    return out
