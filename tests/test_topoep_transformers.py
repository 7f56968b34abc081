"""TopoEP on transformers 5's MoE blocks, on real hoccl ranks.

Every supported family (Mixtral, Qwen2-MoE with its gated shared expert, Qwen3-MoE with
renormalised top-k, OLMoE, DeepSeek-V3 with sigmoid + bias + group-limited routing and a shared
expert) is built from a tiny config, wrapped with ``topoep.attach`` and compared with the
unwrapped block: forward output and every gradient (input, router, shared experts, each of
this rank's experts). The reference runs the stock block on each rank's tokens separately, so
its routing sees the same batch shapes as the wrapped run. fp32 tight, bf16 within its
rounding. ``topoep.stock_state_dict`` must load back into a stock block and equal it.

One spawned job per world size holds every case (spawning costs seconds).
"""
import copy
import gc
import os
import sys
import weakref

import pytest
import torch

from dist_utils import run_ranks

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
transformers = pytest.importorskip("transformers", reason="transformers is not installed "
                                   "(scripts/install.sh installs it)")

N = 10  # tokens per rank
DTYPES = {"fp32": (torch.float32, 1e-5), "bf16": (torch.bfloat16, 3e-2)}


def _block(family, experts, seed, dtype):
    from hf_moe_models import moe_block
    torch.manual_seed(seed)
    block = moe_block(family, experts=experts, hidden=16, ffn=8)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.4)
        for name, buf in block.named_buffers():
            if "bias" in name:  # DeepSeek-V3's routing correction: exercise it
                buf.normal_(0, 0.1)
    return block.to(dtype)


def _reference(block, xs, gouts):
    """The stock block on each rank's tokens, its gradients summed over ranks."""
    ref = copy.deepcopy(block)
    outs, xgrads = [], []
    for x, g in zip(xs, gouts):
        xr = x.clone().requires_grad_(True)
        out = ref(xr)
        (out.float() * g).sum().backward()
        outs.append(out.detach())
        xgrads.append(xr.grad)
    return ref, outs, xgrads


def _rel(a, b):
    a, b = a.float(), b.float()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-6))


def _case(rank, world, family, dtype_name, slots):
    import torch.distributed as dist
    import topoep
    dtype, _ = DTYPES[dtype_name]
    experts = 2 * world if world > 1 else 4
    block = _block(family, experts, 7, dtype)
    gen = torch.Generator().manual_seed(11)
    xs = [torch.randn(1, N, 16, generator=gen).to(dtype) for _ in range(world)]
    gouts = [torch.randn(1, N, 16, generator=gen) for _ in range(world)]
    ref, ref_outs, ref_xg = _reference(block, xs, gouts)
    local = copy.deepcopy(block)
    full = weakref.ref(local.experts.gate_up_proj)
    full_bytes = sum(p.numel() * p.element_size() for p in local.experts.parameters())
    wrapper = topoep.attach(local, slots_per_gpu=slots)
    gc.collect()
    x = xs[rank].clone().requires_grad_(True)
    out = local(x)
    (out.float() * gouts[rank]).sum().backward()
    res = {"out": _rel(out.detach(), ref_outs[rank]), "x": _rel(x.grad, ref_xg[rank])}
    dense = dict(ref.named_parameters())
    for name, p in local.named_parameters():
        if name.startswith("experts."):
            continue
        g = p.grad.clone()
        dist.all_reduce(g)  # data-parallel parts: the reference summed every rank's tokens
        res[name] = _rel(g, dense[name].grad)
    for name, p in wrapper.expert_named_parameters():
        stock = dense[f"experts.{name}"].grad
        res[f"experts.{name}"] = max(_rel(p.grad[i], stock[e])
                                     for i, e in enumerate(wrapper.owned))
    res["full_freed"] = full() is None
    res["held_fraction"] = sum(p.numel() * p.element_size()
                               for _, p in wrapper.expert_named_parameters()) / full_bytes
    res["kind"] = wrapper.kind
    sd = topoep.stock_state_dict(local)
    fresh = _block(family, experts, 99, dtype)
    fresh.load_state_dict(sd)
    res["export"] = all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(),
                                                          block.state_dict().values()))
    return res


def transformers_job(rank, world, cases):
    torch.set_num_threads(1)
    return [_case(rank, world, *c) for c in cases]


def _cases(world):
    from hf_moe_models import FAMILIES
    cases = [(f, "fp32", 2) for f in FAMILIES]
    cases += [(f, "bf16", 1) for f in ("mixtral", "qwen3_moe", "deepseek_v3")]
    return cases


@pytest.mark.parametrize("world", [1, 2, 4])
def test_transformers_blocks_match_the_stock_block(world):
    cases = _cases(world)
    out = run_ranks(transformers_job, world, cases, timeout=240)
    for rank, per_rank in enumerate(out):
        for (family, dtype_name, _), res in zip(cases, per_rank):
            tol = DTYPES[dtype_name][1]
            where = (rank, family, dtype_name)
            assert "replaced" in res.pop("kind"), where
            assert res.pop("full_freed"), (where, "the stock experts stayed alive")
            held = res.pop("held_fraction")
            assert held == pytest.approx(1 / world if world > 1 else 1.0), where
            assert res.pop("export"), (where, "stock_state_dict did not restore the block")
            for key, err in res.items():
                assert err <= tol, (where, key, err)


def router_layer_memory_job(rank, world):
    """TopoEP's own router layer: the wrapper keeps neither the layer nor its full experts."""
    import topoep
    out = {}
    for how in ("wrap", "attach"):
        moe = topoep.SimpleMoE(8, 16, 4 * world, 2)
        full, layer = weakref.ref(moe.w1), weakref.ref(moe)
        if how == "wrap":
            wrapper = topoep.TopoEPMoE(moe)
            del moe
        else:
            wrapper = topoep.attach(moe)
            moe(torch.randn(5, 8))  # still callable in place
            layer = lambda: None  # noqa: E731  (attach keeps the layer: it is the user's)
        gc.collect()
        out[how] = (full() is None, layer() is None, tuple(wrapper.w1.shape))
    return out


@pytest.mark.parametrize("world", [1, 2])
def test_router_layers_hold_only_this_ranks_experts(world):
    for res in run_ranks(router_layer_memory_job, world):
        for how, (full_freed, layer_freed, shape) in res.items():
            assert full_freed and layer_freed, how
            assert shape == (4, 8, 16), how  # 4 * world experts, 4 per rank


def unknown_layer_job(rank, world):
    import topoep
    errors = []
    for layer in (torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.Linear(4, 4))):
        try:
            topoep.attach(layer)
            errors.append(None)
        except TypeError as exc:
            errors.append(str(exc))
    return errors


def test_unknown_layers_name_what_was_looked_for():
    (errors,) = run_ranks(unknown_layer_job, 1)
    for e in errors:
        assert e and "not an MoE layer TopoEP knows" in e and "top_k_index" in e \
            and "ExpertsSpec" in e, e
