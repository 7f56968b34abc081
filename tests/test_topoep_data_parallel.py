"""TopoEP expert parallelism with DDP and FSDP2 on real hoccl ranks.

* A tiny transformers Qwen3-MoE causal LM trained 5 steps with TopoEP + DDP, and with TopoEP
  + FSDP2, gives the losses (and, for DDP, the final weights, exported to the stock layout) of
  plain DDP training of the same model: ``topoep.prepare`` keeps the experts out of data
  parallelism and scales their gradients as DDP's.
* DDP's default ``broadcast_buffers`` no longer breaks TopoEP's own layer (the rank-local
  row index used to be a buffer DDP overwrote with rank 0's), in exact and padded mode.
* Misuse that would train wrongly raises with a message naming the fix: DDP without
  ``prepare``, ``fully_shard`` sharding the experts, FSDP2 with unscaled expert gradients.
"""
import copy
import os
import sys

import pytest
import torch

from dist_utils import run_ranks

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
pytest.importorskip("transformers", reason="transformers is not installed "
                    "(scripts/install.sh installs it)")

STEPS, BATCH, SEQ = 5, 2, 12


def _model(world):
    from hf_moe_models import causal_lm
    torch.manual_seed(3)
    return causal_lm("qwen3_moe", experts=2 * world, hidden=32, ffn=16)


def _batches(rank):
    gen = torch.Generator().manual_seed(100 + rank)
    return [torch.randint(0, 64, (BATCH, SEQ), generator=gen) for _ in range(STEPS)]


def _train(model, rank, step_params=None):
    import torch.distributed as dist
    opt = torch.optim.SGD(step_params if step_params is not None else model.parameters(),
                          lr=0.5)
    losses = []
    for ids in _batches(rank):
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        lv = loss.detach().clone()
        dist.all_reduce(lv)
        losses.append(float(lv) / dist.get_world_size())
    return losses


def _unwrap(model):
    return getattr(model, "module", model)


def _plain_ddp(rank, world):
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(_model(world))
    losses = _train(model, rank)
    return losses, {k: v.clone() for k, v in _unwrap(model).state_dict().items()}


def _topoep_ddp(rank, world):
    import topoep
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = _model(world)
    topoep.attach(model, slots_per_gpu=1)
    topoep.prepare(model)
    ddp = DDP(model)
    losses = _train(ddp, rank)
    return losses, topoep.stock_state_dict(model)


def _topoep_fsdp2(rank, world):
    import topoep
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    model = _model(world)
    topoep.attach(model, slots_per_gpu=1)
    ignored = topoep.prepare(model)
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, ignored_params=ignored)
    fully_shard(model, mesh=mesh, ignored_params=ignored)
    return _train(model, rank)


def _raises(fn):
    try:
        fn()
    except RuntimeError as exc:
        return str(exc)
    return None


def _misuse(world):
    import topoep
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP
    ids = torch.randint(0, 64, (1, 6))
    out = {}
    model = _model(world)
    topoep.attach(model)
    out["ddp_unprepared"] = _raises(lambda: DDP(model)(input_ids=ids))
    model = _model(world)
    topoep.attach(model)
    mesh = init_device_mesh("cpu", (world,))
    fully_shard(model, mesh=mesh)
    out["fsdp_sharded_experts"] = _raises(lambda: model(input_ids=ids))
    model = _model(world)
    layers = topoep.attach(model)
    fully_shard(model, mesh=mesh, ignored_params={p for w in layers
                                                  for _, p in w.expert_named_parameters()})
    out["fsdp_unscaled"] = _raises(lambda: model(input_ids=ids))
    return out


def lm_job(rank, world):
    torch.set_num_threads(1)
    plain_losses, plain_state = _plain_ddp(rank, world)
    ddp_losses, ddp_state = _topoep_ddp(rank, world)
    fsdp_losses = _topoep_fsdp2(rank, world)
    state_err = max(float((ddp_state[k] - v).abs().max()) for k, v in plain_state.items())
    return {"plain": plain_losses, "ddp": ddp_losses, "fsdp": fsdp_losses,
            "keys_equal": sorted(ddp_state) == sorted(plain_state), "state_err": state_err,
            "misuse": _misuse(world)}


def test_lm_training_with_ddp_and_fsdp2_equals_plain_ddp():
    for res in run_ranks(lm_job, 2, timeout=240):
        plain = res["plain"]
        assert plain[-1] < plain[0]  # it trains
        assert res["ddp"] == pytest.approx(plain, rel=1e-5, abs=1e-6)
        assert res["fsdp"] == pytest.approx(plain, rel=1e-5, abs=1e-6)
        assert res["keys_equal"]
        assert res["state_err"] < 1e-5
        misuse = res["misuse"]
        assert "DistributedDataParallel" in misuse["ddp_unprepared"] and \
            "topoep.prepare(model)" in misuse["ddp_unprepared"]
        assert "fully_shard sharded its expert parameters" in misuse["fsdp_sharded_experts"]
        assert "FSDP2" in misuse["fsdp_unscaled"] and "topoep.prepare" in misuse["fsdp_unscaled"]


D, F_, N = 8, 12, 16


class _Net(torch.nn.Module):
    def __init__(self, experts, mode):
        super().__init__()
        import topoep
        self.inp = torch.nn.Linear(D, D)
        self.moe = topoep.SimpleMoE(D, F_, experts, 2)
        self.mode = mode

    def forward(self, x):
        h = self.inp(x)
        return h + self.moe(h)


def ddp_buffers_job(rank, world):
    """The project's own layer under DDP with broadcast_buffers=True (DDP's default)."""
    import topoep
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    out = {}
    for mode in ("exact", "padded"):
        torch.manual_seed(5)
        net = _Net(2 * world, mode).double()
        ref = copy.deepcopy(net)
        topoep.attach(net.moe, mode=mode, capacity=4 * N, slots_per_gpu=1)
        topoep.prepare(net)
        ddp = DDP(net, broadcast_buffers=True)
        gen = torch.Generator().manual_seed(9)
        x = torch.randn(world * N, D, generator=gen, dtype=torch.double)
        sl = slice(rank * N, (rank + 1) * N)
        errs = []
        for _ in range(2):  # buffers are broadcast before every forward
            errs.append(float((ddp(x[sl]) - ref(x[sl])).abs().max()))
        out[mode] = max(errs)
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_broadcast_buffers_leave_topoep_correct(world):
    for res in run_ranks(ddp_buffers_job, world, timeout=120):
        assert res["exact"] < 1e-12 and res["padded"] < 1e-12, res
