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


def train_ddp(rank, world):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_model(), bucket_cap_mb=0.001)  # tiny buckets: several allreduces per step
    _train(model, rank)
    return [p.detach().clone() for p in model.module.parameters()]


def train_fsdp2(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    model = _model()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    _train(model, rank)
    return [p.full_tensor().detach().clone() for p in model.parameters()]


def _compare(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.allclose(x, y, rtol=1e-5, atol=1e-6), (x - y).abs().max()


def test_ddp_matches_gloo():
    hoccl = run_ranks(train_ddp, 2, backend="hoccl")
    gloo = run_ranks(train_ddp, 2, backend="gloo")
    _compare(hoccl[0], hoccl[1])
    _compare(hoccl[0], gloo[0])
    # training moved the parameters (the comparison is not between two untouched models)
    assert any(not torch.equal(p, q) for p, q in zip(hoccl[0], _model().parameters()))


def test_fsdp2_matches_gloo():
    hoccl = run_ranks(train_fsdp2, 2, backend="hoccl")
    gloo = run_ranks(train_fsdp2, 2, backend="gloo")
    _compare(hoccl[0], hoccl[1])
    _compare(hoccl[0], gloo[0])
