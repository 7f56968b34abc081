"""DDP and FSDP2 on hoccl reach the same parameters as on gloo (3 steps, CPU)."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from dist_utils import run_ranks


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def _batch(rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def _train(model, rank, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        x, y = _batch(rank, step)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def train_ddp(rank, world, group=None):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_model(), bucket_cap_mb=0.001, process_group=group)  # tiny buckets: several allreduces per step
    _train(model, rank)
    return [p.detach().clone() for p in model.module.parameters()]


def train_fsdp2(rank, world, group=None):
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,)) if group is None else DeviceMesh.from_group(group, "cpu")
    model = _model()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    _train(model, rank)
    return [p.full_tensor().detach().clone() for p in model.parameters()]


def train_on_both_backends(rank, world):
    """DDP and FSDP2 on the default group (hoccl), then on a gloo group over the same ranks."""
    import torch.distributed as dist

    gloo = dist.new_group(backend="gloo")
    return {"hoccl": [train_ddp(rank, world), train_fsdp2(rank, world)],
            "gloo": [train_ddp(rank, world, gloo), train_fsdp2(rank, world, gloo)]}


def _compare(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.allclose(x, y, rtol=1e-5, atol=1e-6), (x - y).abs().max()


def test_ddp_and_fsdp2_match_gloo():
    """One job trains with DDP and FSDP2 on hoccl, then on a gloo group of the same ranks."""
    results = run_ranks(train_on_both_backends, 2, backend="hoccl")
    for i in range(2):  # DDP, FSDP2
        hoccl = [r["hoccl"][i] for r in results]
        _compare(hoccl[0], hoccl[1])
        _compare(hoccl[0], results[0]["gloo"][i])
        # training moved the parameters (the comparison is not between two untouched models)
        assert any(not torch.equal(p, q) for p, q in zip(hoccl[0], _model().parameters())), i
