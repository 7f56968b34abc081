"""TopoEP on MoE layers from outside transformers: DeepSpeed's ``deepspeed.moe.layer.MoE`` and
the Megatron-style layer of ``topoep.megatron_style``, on real hoccl ranks at worlds 1, 2, 4.

References (independent of TopoEP, run in the same processes):

* DeepSpeed ``ep_size=1``: the stock layer, unwrapped, run on each rank's tokens separately
  (DeepSpeed's capacity depends on the batch it sees, so it must see the same batches), with
  the same RNG seed per batch, so that its random token selection and gumbel sampling draw the
  same numbers. Its gradients are summed over the batches, as TopoEP's owners sum theirs.
* DeepSpeed ``ep_size=R``: DeepSpeed's own expert parallelism on the same ranks (its
  fixed-capacity all_to_all over hoccl), built from the same seeds: each rank compares with
  its stock twin directly, no reduction needed.
* Megatron-style: the stock layer run on all ranks' tokens in this process.

* DeepSpeed engine (world 2): two SGD steps of ``deepspeed.initialize``'s engine with TopoEP
  attached before it vs the same engine on the stock layer (ep_size = world), all parameters.

Compared: output, ``l_aux`` and ``exp_counts`` (DeepSpeed), the input gradient, the gate's /
router's gradient, every other dense parameter's gradient, and each expert this rank holds.
``topoep.stock_state_dict`` must load back into a stock layer and equal the original.

DeepSpeed is an optional test dependency (``scripts/install.sh``); its tests skip only when
``import deepspeed`` fails. One spawned job per world size runs both libraries (spawning costs
seconds); each library's test reads its part.
"""
import copy
import gc
import weakref

import pytest
import torch

from dist_utils import run_ranks

N, D, F, E = 12, 8, 16, 8  # tokens per rank, hidden, expert hidden, experts
TOL = 2e-5  # fp32, relative to the reference's largest magnitude
DS_ENV = {"DS_ACCELERATOR": "cpu"}


def _rel(a, b):
    if a is None or b is None:
        # a parameter the layer never uses (an expert's ignored bias): the stock layer leaves
        # its grad None, TopoEP's flat expert rows give it zeros
        if a is None and b is None:
            return 0.0
        a, b = (torch.zeros_like(b) if a is None else a), (torch.zeros_like(a) if b is None else b)
        return float(a.abs().max() + b.abs().max())
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))


def _batches(world, seed=11):
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(2, N // 2, D, generator=gen) for _ in range(world)]
    gouts = [torch.randn(2, N // 2, D, generator=gen) for _ in range(world)]
    return xs, gouts


# --------------------------------------------------------------------------- DeepSpeed

DS_CASES = {  # name -> MoE keyword arguments
    "top1-rts-rsample": dict(k=1, capacity_factor=1.0, min_capacity=2,
                             noisy_gate_policy="RSample"),
    "top2-sampled-drops": dict(k=2, capacity_factor=1.0, min_capacity=1),
    "top3-drops-residual": dict(k=3, capacity_factor=0.75, min_capacity=1, use_residual=True),
    "top2-no-drops-jitter": dict(k=2, drop_tokens=False, noisy_gate_policy="Jitter"),
    "top2-expert-returns-bias": dict(k=2, capacity_factor=2.0, min_capacity=1),
}
DS_DROPPING = ("top1-rts-rsample", "top2-sampled-drops", "top3-drops-residual")


class _ExpertReturningBias(torch.nn.Module):
    """An expert returning (output, bias), as Megatron-DeepSpeed's MLPs do; DeepSpeed keeps
    the output only."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(D, F), torch.nn.Linear(F, D, bias=False)
        self.bias = torch.nn.Parameter(torch.zeros(D))

    def forward(self, x):
        return self.fc2(torch.nn.functional.silu(self.fc1(x))), self.bias


def _ds_layer(ep_size, case, seed=7, set_group=True):
    """A DeepSpeed MoE layer whose expert e has weights drawn from (seed, e) whatever ep_size
    and rank hold it, so layers of different ep_size describe the same model. ``set_group``:
    its expert-parallel group set now (as deepspeed.initialize does), else left for later."""
    import torch.distributed as dist
    from deepspeed.moe.layer import MoE
    from topoep.adapters_deepspeed import expert_parallel_group
    torch.manual_seed(seed)
    expert = (_ExpertReturningBias() if case == "top2-expert-returns-bias" else
              torch.nn.Sequential(torch.nn.Linear(D, F), torch.nn.GELU(), torch.nn.Linear(F, D)))
    layer = MoE(D, expert, num_experts=E, ep_size=ep_size, **DS_CASES[case])
    ep_rank = 0
    if ep_size > 1:
        if set_group:
            layer.set_deepspeed_parallelism()
        ep_rank = dist.get_rank(expert_parallel_group(layer))
    local = layer.deepspeed_moe.experts.deepspeed_experts
    with torch.no_grad():
        for i, ex in enumerate(local):
            gen = torch.Generator().manual_seed(seed * 1000 + ep_rank * len(local) + i)
            for p in ex.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return layer


def _ds_step(layer, x, gout, seed):
    """forward + backward of (output . gout + l_aux / 3) with DeepSpeed's RNG draws fixed."""
    torch.manual_seed(seed)
    x = x.clone().requires_grad_(True)
    out, l_aux, counts = layer(x)
    ((out * gout).sum() + l_aux / 3).backward()
    return {"out": out.detach(), "l_aux": l_aux.detach(), "counts": counts.clone(), "x": x.grad}


def _ds_compare(res, ref, wrapped, stock, wrapper, expert_of, reduce_dense):
    import torch.distributed as dist
    errs = {k: _rel(res[k], ref[k]) for k in ("out", "l_aux", "x")}
    errs["counts"] = 0.0 if torch.equal(res["counts"], ref["counts"]) else 1.0
    stock_params = dict(stock.named_parameters())
    for name, p in wrapped.named_parameters():
        if name.startswith("deepspeed_moe.experts."):
            continue
        g = p.grad.clone()
        if reduce_dense:  # the reference's dense gradients hold every rank's batch
            dist.all_reduce(g, group=wrapper.group)
        errs[name] = _rel(g, stock_params[name].grad)
    for i, ex in enumerate(wrapper.experts):
        stock_ex = stock.deepspeed_moe.experts.deepspeed_experts[expert_of(i)]
        for (n, p), q in zip(ex.named_parameters(), stock_ex.parameters()):
            errs[f"expert {wrapper.owned[i]}.{n}"] = _rel(p.grad, q.grad)
    return errs


def _ds_replicated_case(rank, world, case):
    """ep_size=1 layer: TopoEP over the world vs the stock layer on each rank's batch."""
    import topoep
    xs, gouts = _batches(world)
    stock = _ds_layer(1, case)
    original = copy.deepcopy(stock.state_dict())
    refs = [_ds_step(stock, xs[r], gouts[r], 1000 + r) for r in range(world)]
    wrapped = _ds_layer(1, case)
    every_expert = [weakref.ref(ex.fc1.weight if hasattr(ex, "fc1") else ex[0].weight)
                    for ex in wrapped.deepspeed_moe.experts.deepspeed_experts]
    wrapper = topoep.attach(wrapped, slots_per_gpu=2)
    gc.collect()
    res = _ds_step(wrapped, xs[rank], gouts[rank], 1000 + rank)
    errs = _ds_compare(res, refs[rank], wrapped, stock, wrapper, lambda i: wrapper.owned[i],
                       reduce_dense=True)
    fresh = _ds_layer(1, case, seed=99)
    fresh.load_state_dict(topoep.stock_state_dict(wrapped))
    errs["export"] = _state_dicts_differ(fresh.state_dict(), original)
    errs["dropped routes"] = _dropped_routes(stock, xs[rank], 1000 + rank)
    alive = [e for e, ref in enumerate(every_expert) if ref() is not None]
    errs["only this rank's experts alive"] = 0.0 if alive == wrapper.owned else 1.0
    return errs


def _dropped_routes(layer, x, seed) -> int:
    """How many (token, k) routes DeepSpeed's gate drops on this batch (the same draws as the
    compared step): the cases meant to drop must really exercise that path."""
    torch.manual_seed(seed)
    with torch.no_grad():
        ids = layer.deepspeed_moe.gate(x.reshape(-1, D), None, True, False)[3]
    return int((ids < 0).sum())


def _ds_expert_parallel_case(rank, world, case, ep_size):
    """ep_size=R layer: TopoEP over DeepSpeed's expert-parallel group vs DeepSpeed's own
    expert parallelism on the same ranks."""
    import topoep
    from topoep.adapters_deepspeed import expert_parallel_group, expert_parallel_state_dict
    xs, gouts = _batches(world)
    # attached as a user would before deepspeed.initialize (first, so that the adapter makes
    # DeepSpeed's group), which then sets the layer's group itself
    wrapped = _ds_layer(ep_size, case, set_group=False)
    wrapper = topoep.attach(wrapped, group=expert_parallel_group(wrapped), slots_per_gpu=1)
    wrapped.set_deepspeed_parallelism()
    stock = _ds_layer(ep_size, case)
    original = copy.deepcopy(stock.state_dict())
    ref = _ds_step(stock, xs[rank], gouts[rank], 1000 + rank)
    res = _ds_step(wrapped, xs[rank], gouts[rank], 1000 + rank)
    errs = _ds_compare(res, ref, wrapped, stock, wrapper, lambda i: i, reduce_dense=False)
    full = topoep.stock_state_dict(wrapped)
    fresh = _ds_layer(ep_size, case, seed=99)
    fresh.load_state_dict(expert_parallel_state_dict(
        full, "", ep_size, wrapper.rank, E))
    errs["export"] = _state_dicts_differ(fresh.state_dict(), original)
    return errs


class _DeepSpeedNet(torch.nn.Module):
    """A dense layer before a DeepSpeed MoE layer, its loss including l_aux."""

    def __init__(self, ep_size):
        super().__init__()
        self.inp = torch.nn.Linear(D, D)
        self.moe = _ds_layer(ep_size, "top2-sampled-drops", set_group=False)

    def forward(self, x):
        out, l_aux, _ = self.moe(self.inp(x))
        return out.pow(2).mean() + l_aux / 10


def _ds_engine_rejects_replicated_layer(world):
    """An ep_size=1 layer under TopoEP inside the engine would have its experts' gradients
    averaged over ranks that hold different experts: its first training forward raises."""
    import deepspeed
    import topoep
    net = _DeepSpeedNet(ep_size=1)
    topoep.attach(net.moe)
    engine, *_ = deepspeed.initialize(model=net, optimizer=torch.optim.SGD(net.parameters()),
                                      config={"train_micro_batch_size_per_gpu": 1})
    try:
        engine(torch.randn(N, D))
    except RuntimeError as exc:
        return str(exc)
    return None


def _ds_engine_trained(world, use_topoep, steps=2):
    """Parameters after ``steps`` SGD steps of ``deepspeed.initialize``'s engine, with the
    expert parameter groups DeepSpeed's own helper makes."""
    import deepspeed
    import topoep
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
    from topoep.adapters_deepspeed import expert_parallel_group
    torch.manual_seed(5)
    net = _DeepSpeedNet(ep_size=world)
    if use_topoep:  # before deepspeed.initialize, as a user would
        topoep.attach(net.moe, group=expert_parallel_group(net.moe), slots_per_gpu=1)
    groups = split_params_into_different_moe_groups_for_optimizer(
        {"params": list(net.parameters()), "name": "all"})
    engine, *_ = deepspeed.initialize(model=net, optimizer=torch.optim.SGD(groups, lr=0.5),
                                      config={"train_micro_batch_size_per_gpu": 1})
    gen = torch.Generator().manual_seed(300 + engine.global_rank)
    for step in range(steps):
        torch.manual_seed(400 + 10 * step + engine.global_rank)
        engine.backward(engine(torch.randn(N, D, generator=gen)))
        engine.step()
    return {n.replace("experts.experts.", "experts.deepspeed_experts."): p.detach().clone()
            for n, p in net.named_parameters()}


def _ds_engine_case(world):
    """Two training steps under deepspeed.initialize (ep_size = world): TopoEP vs DeepSpeed's
    own expert parallelism, every parameter after the steps."""
    stock = _ds_engine_trained(world, use_topoep=False)
    wrapped = _ds_engine_trained(world, use_topoep=True)
    errs = {n: _rel(wrapped[n], p) for n, p in stock.items()}
    errs["same parameters"] = 0.0 if stock.keys() == wrapped.keys() else 1.0
    return errs


def _state_dicts_differ(a, b) -> float:
    same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    return 0.0 if same else 1.0


def _ds_misuse(rank, world):
    """ep_size < world attached over the whole world: TopoEP would own other experts."""
    import topoep
    try:
        topoep.attach(_ds_layer(world // 2, "top2-sampled-drops"))
    except ValueError as exc:
        return str(exc)
    return None


def deepspeed_cases(rank, world):
    import deepspeed
    deepspeed.init_distributed(dist_backend="hoccl")
    out = {}
    for case in DS_CASES:
        out[("ep1", case)] = _ds_replicated_case(rank, world, case)
    if world > 1:
        out[(f"ep{world}", "top2-sampled-drops")] = _ds_expert_parallel_case(
            rank, world, "top2-sampled-drops", world)
    if world == 2:
        out[("engine", "ep2")] = _ds_engine_case(world)
        out["engine misuse"] = _ds_engine_rejects_replicated_layer(world)
    if world == 4:
        out[("ep2", "top3-drops-residual")] = _ds_expert_parallel_case(
            rank, world, "top3-drops-residual", 2)
        out["misuse"] = _ds_misuse(rank, world)
    return out


@pytest.mark.parametrize("world", [1, 2, 4])
def test_deepspeed_moe_matches_the_stock_layer(world):
    pytest.importorskip("deepspeed", reason="deepspeed is not installed "
                        "(scripts/install.sh installs it, DS_BUILD_OPS=0)")
    for rank, per_rank in enumerate(_results(world)):
        per_rank = _part(per_rank, "deepspeed", rank)
        if world == 2:
            misuse = per_rank.pop("engine misuse")
            assert misuse and "ep_size=2" in misuse and "DeepSpeed engine" in misuse, misuse
        if world == 4:
            misuse = per_rank.pop("misuse")
            assert misuse and "expert_parallel_group(layer)" in misuse, (rank, misuse)
        for where, errs in per_rank.items():
            dropped = errs.pop("dropped routes", None)
            assert dropped is None or dropped > 0 or where[1] not in DS_DROPPING, (rank, where)
            for key, err in errs.items():
                assert err <= TOL, (rank, where, key, err)


# --------------------------------------------------------------------------- Megatron-style

MEGATRON_CASES = {  # name -> router options
    "softmax-after-topk": {},
    "softmax-before-topk": dict(pre_softmax=True),
    "sigmoid-scaled": dict(score_function="sigmoid", topk_scaling_factor=2.5),
    "router-returns-ids": dict(returns="ids"),
}
MEGATRON_TOL = 1e-10  # fp64


def _megatron_layer(case, seed=7):
    from topoep.megatron_style import MegatronStyleMoE
    torch.manual_seed(seed)
    return MegatronStyleMoE(D, F, E, topk=2, **MEGATRON_CASES[case]).double()


def _megatron_case(rank, world, case):
    """TopoEP over the world vs the stock layer on every rank's tokens at once."""
    import torch.distributed as dist
    import topoep
    xs, gouts = _batches(world)
    xs, gouts = [x.double() for x in xs], [g.double() for g in gouts]
    stock = _megatron_layer(case)
    original = copy.deepcopy(stock.state_dict())
    x_all = torch.cat(xs).requires_grad_(True)
    ref_out, bias = stock(x_all)
    (ref_out * torch.cat(gouts)).sum().backward()
    rows = slice(rank * xs[0].shape[0], (rank + 1) * xs[0].shape[0])

    layer = _megatron_layer(case)
    full_weight1 = weakref.ref(layer.experts.weight1)
    wrapper = topoep.attach(layer, slots_per_gpu=2)
    gc.collect()
    x = xs[rank].clone().requires_grad_(True)
    out, wrapped_bias = layer(x)
    (out * gouts[rank]).sum().backward()
    errs = {"out": _rel(out, ref_out[rows]), "x": _rel(x.grad, x_all.grad[rows]),
            "bias": 0.0 if bias is None and wrapped_bias is None else 1.0,
            "full weights freed": 0.0 if full_weight1() is None else 1.0}
    router_grad = layer.router.weight.grad.clone()
    dist.all_reduce(router_grad)  # the reference's router saw every rank's tokens
    errs["router"] = _rel(router_grad, stock.router.weight.grad)
    stock_grads = {"weight1": stock.experts.weight1.grad.view(E, D, -1),
                   "weight2": stock.experts.weight2.grad.view(E, -1, D)}
    for name, p in wrapper.expert_named_parameters():
        for i, e in enumerate(wrapper.owned):
            errs[f"expert {e}.{name}"] = _rel(p.grad[i], stock_grads[name][e])
    fresh = _megatron_layer(case, seed=99)
    fresh.load_state_dict(topoep.stock_state_dict(layer))
    errs["export"] = _state_dicts_differ(fresh.state_dict(), original)
    return errs


def megatron_cases(rank, world):
    return {case: _megatron_case(rank, world, case) for case in MEGATRON_CASES}


@pytest.mark.parametrize("world", [1, 2, 4])
def test_megatron_style_layer_matches_the_stock_layer(world):
    for rank, per_rank in enumerate(_results(world)):
        for case, errs in _part(per_rank, "megatron", rank).items():
            for key, err in errs.items():
                assert err <= MEGATRON_TOL, (rank, case, key, err)


# --------------------------------------------------------------------------- one job per world


def adapters_job(rank, world):
    """Both libraries in one spawned job; each part's failure is reported by its own test."""
    import importlib.util
    import traceback
    torch.set_num_threads(1)
    parts = {"megatron": megatron_cases}
    if importlib.util.find_spec("deepspeed") is not None:
        parts["deepspeed"] = deepspeed_cases
    out = {}
    for name, cases in parts.items():
        try:
            out[name] = cases(rank, world)
        except Exception:  # noqa: BLE001 - the part's test shows it
            out[name] = ("error", traceback.format_exc())
    return out


_RESULTS: dict = {}


def _results(world):
    if world not in _RESULTS:
        _RESULTS[world] = run_ranks(adapters_job, world, env=DS_ENV, timeout=300)
    return _RESULTS[world]


def _part(per_rank, name, rank):
    part = per_rank[name]
    if isinstance(part, tuple):
        pytest.fail(f"rank {rank}, {name}:\n{part[1]}")
    return part


class _RouterWithoutGroupedExperts(torch.nn.Module):
    """Megatron-like names, but its experts are a plain Linear: no adapter may guess."""

    def __init__(self):
        super().__init__()
        self.router = torch.nn.Module()
        self.router.topk = 2
        self.experts = torch.nn.Linear(4, 4)


def test_unknown_layers_still_get_describes_type_error():
    from topoep.adapters import describe
    with pytest.raises(TypeError, match="not an MoE layer TopoEP knows") as info:
        describe(_RouterWithoutGroupedExperts())
    assert "deepspeed.moe.layer.MoE" in str(info.value)
    assert "weight1 [d, E*2f]" in str(info.value)
