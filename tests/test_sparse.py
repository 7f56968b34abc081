"""Sparse COO all_reduce on real ranks: sums against a locally built reference, AVG, a sparse
embedding trained under DDP against gloo, and layout mismatches raising on every rank."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from dist_utils import run_ranks


def rank_sparse(rank: int, world: int, sparse_dims: int, dense_dims: int, dtype) -> torch.Tensor:
    """A sparse tensor whose nnz differs per rank, with repeated (uncoalesced) indices."""
    g = torch.Generator().manual_seed(100 + rank)
    shape = [7] * sparse_dims + [3] * dense_dims
    nnz = 2 * rank + 1
    indices = torch.randint(0, 7, (sparse_dims, nnz), generator=g)
    indices[:, -1] = indices[:, 0]  # a duplicate: the input is not coalesced
    values = torch.randint(-5, 6, [nnz] + [3] * dense_dims, generator=g).to(dtype)
    return torch.sparse_coo_tensor(indices, values, shape, check_invariants=True)


CASES = [(1, 0, torch.float32), (2, 0, torch.float64), (3, 0, torch.int64), (1, 1, torch.float32),
         (2, 2, torch.bfloat16), (1, 3, torch.int32)]


def sparse_sums(rank, world):
    out = []
    for sd, dd, dtype in CASES:
        t = rank_sparse(rank, world, sd, dd, dtype)
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        out.append(t.to_dense())
    avg = rank_sparse(rank, world, 2, 1, torch.float64)
    dist.all_reduce(avg, op=dist.ReduceOp.AVG)
    out.append(avg.to_dense())
    empty = torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.long), torch.zeros(0), [5])
    if rank == 1:
        empty = torch.sparse_coo_tensor(torch.tensor([[3]]), torch.tensor([2.5]), [5])
    dist.all_reduce(empty)
    out.append(empty.to_dense())
    return out


def test_sparse_all_reduce_matches_local_sum():
    for world in (2, 3):
        results = run_ranks(sparse_sums, world)
        expected = []
        for sd, dd, dtype in CASES:
            expected.append(sum(rank_sparse(r, world, sd, dd, dtype).to_dense() for r in range(world)))
        expected.append(sum(rank_sparse(r, world, 2, 1, torch.float64).to_dense() for r in range(world)) / world)
        expected.append(torch.tensor([0, 0, 0, 2.5, 0]))
        for rank, got in enumerate(results):
            for i, (g, e) in enumerate(zip(got, expected)):
                assert g.dtype == e.dtype, (world, rank, i)
                assert torch.equal(g, e), (world, rank, i, g, e)


def train_sparse_embedding(rank, world, group=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(50, 8, sparse=True), nn.Linear(8, 1))
    ddp = nn.parallel.DistributedDataParallel(model, process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(3):
        ids = torch.randint(0, 50, (16,), generator=g)
        loss = ddp(ids).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def embedding_beside_gloo(rank, world):
    gloo = dist.new_group(backend="gloo")
    return train_sparse_embedding(rank, world), train_sparse_embedding(rank, world, gloo)


def test_ddp_sparse_embedding_matches_gloo():
    """Trained on hoccl, then on a gloo group of the same ranks."""
    results = run_ranks(embedding_beside_gloo, 2)
    ours, gloo = [r[0] for r in results], results[0][1]
    for a, b in zip(ours[0], gloo):
        torch.testing.assert_close(a, b)
    for a, b in zip(ours[0], ours[1]):
        assert torch.equal(a, b)


def mismatched_sparse(rank, world):
    shape = [4, 4] if rank == 0 else [4, 5]
    t = torch.sparse_coo_tensor(torch.tensor([[0], [1]]), torch.tensor([1.0]), shape)
    try:
        dist.all_reduce(t)
    except RuntimeError as e:
        first = str(e)
    else:
        first = None
    try:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    except (RuntimeError, ValueError) as e:
        second = str(e)
    else:
        second = None
    # The group stays usable after a refused op.
    ok = torch.ones(3)
    dist.all_reduce(ok)
    return first, second, ok


def test_sparse_layout_mismatch_raises_on_every_rank():
    results = run_ranks(mismatched_sparse, 2)
    for rank, (first, second, ok) in enumerate(results):
        assert first is not None and "all_reduce" in first and f"rank {rank}" in first, first
        assert "sizes [4, 4]" in first and "sizes [4, 5]" in first, first
        assert second is not None and "MAX" in second.upper() and "sparse" in second, second
        assert torch.equal(ok, torch.full((3,), 2.0))


def expected_sums(world):
    expected = [sum(rank_sparse(r, world, sd, dd, dtype).to_dense() for r in range(world)) for sd, dd, dtype in CASES]
    expected.append(sum(rank_sparse(r, world, 2, 1, torch.float64).to_dense() for r in range(world)) / world)
    expected.append(torch.tensor([0, 0, 0, 2.5, 0]))
    return expected


def sums_and_embedding_beside_gloo(rank, world):
    """The sums, then the embedding trained on the default group and on a gloo group of the job."""
    return (sparse_sums(rank, world), *embedding_beside_gloo(rank, world))


def sums_then_mismatch(rank, world):
    return sparse_sums(rank, world), mismatched_sparse(rank, world)


def test_sparse_all_reduce_across_hosts():
    """A group spanning namespaced hosts runs the same steps over its own all_gather: the sums,
    AVG and empty cases on 2x2 and 2-1, a sparse embedding under DDP equal to gloo's on the same
    hosts, and a layout mismatch between hosts raising on every rank with the group still usable."""
    from hoccl_backend.testbed.hosts import Hosts

    for ranks in ([2, 2], [2, 1]):
        with Hosts(count=len(ranks), ranks=ranks) as hosts:
            job = sums_and_embedding_beside_gloo if ranks == [2, 2] else sums_then_mismatch
            results = hosts.run_ranks(job, backend="hoccl", pg_timeout=60, timeout=300)
            for rank, got in enumerate(r[0] for r in results):
                for i, (g, e) in enumerate(zip(got, expected_sums(hosts.world))):
                    assert g.dtype == e.dtype and torch.equal(g, e), (ranks, rank, i, g, e)
            if ranks == [2, 2]:
                ours, gloo = [r[1] for r in results], results[0][2]
                for a, b in zip(ours[0], gloo):
                    torch.testing.assert_close(a, b)
                for r in range(1, hosts.world):
                    assert all(torch.equal(a, b) for a, b in zip(ours[0], ours[r])), r
            else:
                for rank, (first, second, ok) in enumerate(r[1] for r in results):
                    assert first is not None and f"rank {rank}" in first, first
                    assert "sizes [4, 4]" in first and "sizes [4, 5]" in first, first
                    assert second is not None and "MAX" in second.upper() and "sparse" in second, second
                    assert torch.equal(ok, torch.full((3,), float(hosts.world)))
