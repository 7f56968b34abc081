"""TopoEPMoE.rebalance on real ranks (hoccl, world 2 and 4): after home experts move, the
layer's outputs and gradients equal a single-process reference of the same MoE; Adam's state
moves with its rows, so a training step after rebalance equals the same step without it; the
placement is bitwise identical on every rank; bad configurations fail at construction.

All configurations of one world size run inside one spawned job (spawning costs seconds)."""
import copy

import pytest
import torch

from dist_utils import run_ranks

D, F_, N = 8, 12, 24  # model dim, ffn dim, tokens per rank


def _moe(world, cfg, seed):
    """A MoE whose router sends most tokens to the experts homed on rank 0 (evenly), more
    than the replica slots can carry away: a re-placement has to move homes."""
    from topoep.moe import SimpleMoE
    torch.manual_seed(seed)
    e = cfg["experts"]
    moe = SimpleMoE(D, F_, e, cfg["k"], stacked=cfg["stacked"]).double()
    u = torch.randn(D, dtype=torch.double)
    u = u / u.norm()
    with torch.no_grad():  # rank 0's experts: one shared hot direction, random otherwise
        hot = moe.router.weight[: e // world]
        hot.sub_((hot @ u)[:, None] * u).add_(cfg.get("skew", 1.5) * u)
    xs = [torch.randn(world * N, D, dtype=torch.double) + 2 * u for _ in range(4)]
    return moe, xs


def _flat(stacked, modules):
    """Expert rows flattened [rows, P], weights and gradients: from stacked tensors [rows, ...]
    or from one module per row."""
    if stacked is not None:
        return (torch.cat([p.detach().reshape(p.shape[0], -1) for p in stacked], 1),
                torch.cat([_grad(p).reshape(p.shape[0], -1) for p in stacked], 1))
    return (torch.stack([torch.cat([p.detach().reshape(-1) for p in ex.parameters()])
                         for ex in modules]),
            torch.stack([torch.cat([_grad(p).reshape(-1) for p in ex.parameters()])
                         for ex in modules]))


def _grad(p):
    return torch.zeros_like(p) if p.grad is None else p.grad


def _rows(w):
    """This rank's expert rows [m, P] (weights, gradients)."""
    if w.experts is None:
        return _flat([getattr(w, n) for n in w._names], None)
    return _flat(None, w.experts)


def _ref_rows(moe):
    """The reference's rows [E, P] (weights, gradients), by the user's expert id."""
    if moe.stacked:
        return _flat([moe.w1, moe.b1, moe.w2, moe.b2], None)
    return _flat(None, moe.experts)


def _by_expert(w, rows):
    """Every rank's rows [m, ...] gathered into [E, ...] by the user's expert id."""
    import torch.distributed as dist
    m = w.experts_per_rank
    ids = w.logical_at[w.rank * m:(w.rank + 1) * m].contiguous()
    all_rows = [torch.empty_like(rows) for _ in range(w.world)]
    all_ids = [torch.empty_like(ids) for _ in range(w.world)]
    dist.all_gather(all_rows, rows.contiguous())
    dist.all_gather(all_ids, ids)
    full = torch.empty((w.num_experts,) + tuple(rows.shape[1:]), dtype=rows.dtype)
    full[torch.cat(all_ids)] = torch.cat(all_rows)
    return full


def _same_everywhere(t):
    import torch.distributed as dist
    got = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(got, t.contiguous())
    return all(torch.equal(g, t) for g in got)


def _layer(moe, cfg, **kw):
    import topoep
    return topoep.TopoEPMoE(moe, hosts=cfg.get("hosts", 1), slots_per_gpu=cfg.get("slots", 1),
                            mode=cfg["mode"], capacity=cfg.get("capacity"), **kw)


def _policy(cfg):
    import topoep
    if cfg.get("threshold"):
        return topoep.ReplacementPolicy(threshold=1.0001, window=1, min_gain=0.0)
    return topoep.ReplacementPolicy(every=1, window=1, min_gain=0.0)


def numerics_case(rank, world, cfg, seed):
    """One step to fill the history, rebalance (gradients held move too), then a step on new
    tokens compared with the reference."""
    from test_topoep_planner import NoHostSync
    moe, xs = _moe(world, cfg, seed)
    sl = slice(rank * N, (rank + 1) * N)
    w = _layer(copy.deepcopy(moe), cfg, replacement=_policy(cfg))
    (w(xs[0][sl]) ** 2).sum().backward()
    grads_before = _by_expert(w, _rows(w)[1])
    if cfg["mode"] == "padded":  # padded mode: the whole re-placement reads nothing back
        with NoHostSync():
            st = w.rebalance(force=True)
    else:
        st = w.rebalance()  # due: every step / over the threshold after one step
    res = {"moved": int(st["moved"]), "same_placement": _same_everywhere(w.logical_at)}
    ref_w, _ = _ref_rows(moe)
    weights, grads = (_by_expert(w, t) for t in _rows(w))
    res["weights_exact"] = torch.equal(weights, ref_w)  # moved bitwise, to the right rows
    res["grads_moved_exact"] = torch.equal(grads, grads_before)
    for p in w.parameters():
        p.grad = None
    ref = copy.deepcopy(moe)
    xr = xs[1].clone().requires_grad_(True)
    gout = torch.randn_like(xr)
    out_ref = ref(xr)
    (out_ref * gout).sum().backward()
    xl = xs[1][sl].clone().requires_grad_(True)
    out = w(xl)
    (out * gout[sl]).sum().backward()
    import torch.distributed as dist
    rg = w.router.weight.grad.clone()
    dist.all_reduce(rg)
    res["out_err"] = float((out.detach() - out_ref.detach()[sl]).abs().max())
    res["xgrad_err"] = float((xl.grad - xr.grad[sl]).abs().max())
    res["router_err"] = float((rg - ref.router.weight.grad).abs().max())
    res["expert_err"] = float((_by_expert(w, _rows(w)[1]) - _ref_rows(ref)[1]).abs().max())
    res["overflow"] = int(w.last_stats["overflow"])
    return res


def _train_step(w, opt, x, gout):
    import torch.distributed as dist
    opt.zero_grad(set_to_none=False)
    (w(x) * gout).sum().backward()
    dist.all_reduce(w.router.weight.grad)  # the router is data parallel
    opt.step()


def training_case(rank, world, cfg, seed):
    """Two Adam steps, rebalance (moves the moments), a third step; the same without the
    rebalance gives the same weights (and, right after the move, the same moments). With
    ``bind``, the optimizer's step hook applies the policy (every 2 steps) by itself."""
    import topoep
    moe, xs = _moe(world, cfg, seed)
    sl = slice(rank * N, (rank + 1) * N)
    policy = (topoep.ReplacementPolicy(every=2, min_gain=0.0) if cfg.get("bind")
              else _policy(cfg))
    a = _layer(copy.deepcopy(moe), cfg, replacement=policy)
    b = _layer(copy.deepcopy(moe), cfg)
    opt_a = torch.optim.Adam(a.parameters(), lr=1e-2)
    opt_b = torch.optim.Adam(b.parameters(), lr=1e-2)
    if cfg.get("bind"):
        a.bind_optimizer(opt_a)
    gen = torch.Generator().manual_seed(seed)
    gouts = [torch.randn(N, D, dtype=torch.double, generator=gen) for _ in range(3)]
    for t in range(2):
        _train_step(a, opt_a, xs[t][sl], gouts[t])
        _train_step(b, opt_b, xs[t][sl], gouts[t])
    st = a.last_replacement if cfg.get("bind") else a.rebalance(optimizer=opt_a)
    res = {"moved": int(st["moved"])}
    res["moments_exact"] = all(
        torch.equal(_by_expert(a, _state_rows(a, opt_a, key)),
                    _by_expert(b, _state_rows(b, opt_b, key)))
        for key in ("exp_avg", "exp_avg_sq"))
    _train_step(a, opt_a, xs[2][sl], gouts[2])
    _train_step(b, opt_b, xs[2][sl], gouts[2])
    res["weights_err"] = float((_by_expert(a, _rows(a)[0]) - _by_expert(b, _rows(b)[0])
                                ).abs().max())
    res["router_err"] = float((a.router.weight - b.router.weight).abs().max())
    res["weights_changed"] = float((_by_expert(b, _rows(b)[0]) - _ref_rows(moe)[0]
                                    ).abs().max())
    return res


def _state_rows(w, opt, key):
    if w.experts is None:
        ps = [getattr(w, n) for n in w._names]
        return torch.cat([opt.state[p][key].reshape(p.shape[0], -1) for p in ps], 1)
    return torch.stack([torch.cat([opt.state[p][key].reshape(-1) for p in ex.parameters()])
                        for ex in w.experts])


def bad_inputs(rank, world):
    """Errors at construction, as (kind, message)."""
    import topoep
    from topoep.moe import SimpleMoE
    pol = topoep.ReplacementPolicy(every=4)
    out = {}

    def attempt(name, fn):
        try:
            fn()
            out[name] = None
        except (ValueError, TypeError, RuntimeError) as exc:
            out[name] = (type(exc).__name__, str(exc))

    stacked = SimpleMoE(D, F_, 2 * world, 2)
    listed = SimpleMoE(D, F_, 2 * world, 2, stacked=False)
    # the user's optimizer over the original module: the wrapper's expert rows are new tensors
    attempt("stacked", lambda: topoep.TopoEPMoE(
        stacked, replacement=pol, optimizer=torch.optim.Adam(stacked.parameters())))
    attempt("router_only", lambda: topoep.TopoEPMoE(
        listed, replacement=pol, optimizer=torch.optim.Adam(listed.router.parameters())))
    attempt("no_balance", lambda: topoep.TopoEPMoE(stacked, replacement=pol, balance=False))
    attempt("opt_without_policy", lambda: topoep.TopoEPMoE(
        listed, optimizer=torch.optim.Adam(listed.parameters())))
    w = topoep.TopoEPMoE(SimpleMoE(D, F_, 2 * world, 2))
    attempt("rebalance_without_policy", lambda: w.rebalance())
    w2 = topoep.TopoEPMoE(SimpleMoE(D, F_, 2 * world, 2), replacement=pol)
    attempt("bind_foreign", lambda: w2.bind_optimizer(torch.optim.SGD(
        stacked.parameters(), lr=0.1)))
    mine = copy.deepcopy(listed)
    attempt("attach_ok", lambda: topoep.attach(
        mine, replacement=pol, optimizer=torch.optim.Adam(mine.parameters())))
    return out


def job(rank, world, cfgs):
    torch.set_num_threads(1)
    num = [numerics_case(rank, world, c, 10 + i) for i, c in enumerate(cfgs["numerics"])]
    train = [training_case(rank, world, c, 50 + i) for i, c in enumerate(cfgs["training"])]
    return num, train, bad_inputs(rank, world)


def _cfgs(world):
    e = 4 * world if world == 2 else 8 * world  # more hot experts on rank 0 than slots elsewhere
    num = [dict(experts=e, k=2, stacked=True, mode="exact"),
           dict(experts=e, k=2, stacked=False, mode="exact", threshold=True),
           dict(experts=e, k=1, stacked=True, mode="padded", capacity=4 * N, slots=1),
           dict(experts=e, k=2, stacked=True, mode="padded", capacity=8 * N, threshold=True)]
    train = [dict(experts=e, k=2, stacked=True, mode="exact"),
             dict(experts=e, k=2, stacked=False, mode="exact"),
             dict(experts=e, k=2, stacked=True, mode="padded", capacity=8 * N, bind=True)]
    if world == 4:
        num.append(dict(experts=e, k=2, stacked=True, mode="exact", hosts=2))
        train.append(dict(experts=e, k=2, stacked=True, mode="exact", hosts=2, slots=2))
    return {"numerics": num, "training": train}


@pytest.mark.parametrize("world", [2, 4])
def test_rebalance_matches_reference_and_training(world):
    cfgs = _cfgs(world)
    out = run_ranks(job, world, cfgs, backend="hoccl", timeout=280)
    for rank, (num, train, bad) in enumerate(out):
        for cfg, res in zip(cfgs["numerics"], num):
            assert res["moved"] > 0, (rank, cfg, res)  # the homes really moved
            assert res["same_placement"] and res["weights_exact"], (rank, cfg, res)
            assert res["grads_moved_exact"], (rank, cfg, res)
            assert res["overflow"] == 0, (rank, cfg, res)
            for key in ("out_err", "xgrad_err", "router_err", "expert_err"):
                assert res[key] < 1e-9, (rank, key, cfg, res)
        for cfg, res in zip(cfgs["training"], train):
            assert res["moved"] > 0 and res["moments_exact"], (rank, cfg, res)
            assert res["weights_changed"] > 1e-3, res  # the steps really trained
            assert res["weights_err"] < 1e-12 and res["router_err"] < 1e-12, (rank, cfg, res)
        for name in ("stacked", "router_only", "bind_foreign"):
            kind, msg = bad[name]
            assert kind == "ValueError" and "does not own the expert parameters" in msg, bad
            assert f"rank {rank}" in msg, msg
        assert bad["no_balance"][0] == "ValueError" and "balance=True" in bad["no_balance"][1]
        assert "replacement=ReplacementPolicy" in bad["opt_without_policy"][1]
        assert bad["rebalance_without_policy"][0] == "RuntimeError"
        assert bad["attach_ok"] is None  # ModuleList experts: the user's optimizer owns them
