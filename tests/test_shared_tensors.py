"""hoccl_backend.empty(): CPU tensors in shared memory that peers map instead of reading with
cross-memory copies. Collectives on them must give exactly the results they give on ordinary
tensors (references computed from every rank's known inputs), the mapped path must really be
taken (the process-wide mapped-bytes counter), and nothing may outlive the tensors."""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from collective_checks import assert_close, make_input
from dist_utils import run_ranks


def _mapped_bytes():
    from hoccl_backend import _C

    return _C.peer_mapped_bytes()


def _hoccl_regions_mapped():
    with open("/proc/self/maps") as f:
        return sum("hoccl-tensor" in line for line in f)


def _shared_like(t):
    import hoccl_backend

    s = hoccl_backend.empty(t.shape, dtype=t.dtype)
    s.copy_(t)
    return s


def check_ops_on_shared(rank, world, shared_in, shared_out):
    """Every direct-read op with inputs and/or outputs from hoccl_backend.empty()."""
    import hoccl_backend

    def inp(t):
        return _shared_like(t) if shared_in else t.clone()

    def out(shape, dtype):
        return hoccl_backend.empty(shape, dtype=dtype) if shared_out else torch.empty(shape, dtype=dtype)

    before = _mapped_bytes()
    case = 7000
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        n = 100_003  # odd, far above the 4 KiB direct-read threshold set by the test
        case += 1
        inputs = [make_input(r, case, n, dtype) for r in range(world)]
        # all_gather_into_tensor
        o = out((world * n,), dtype)
        dist.all_gather_into_tensor(o, inp(inputs[rank]))
        assert_close(o, torch.cat(inputs), f"all_gather {dtype}")
        # all_reduce (direct-read plan: reduce-scatter by reading peers, then gather)
        t = inp(inputs[rank])
        dist.all_reduce(t)
        ref = inputs[0].double() if dtype.is_floating_point else inputs[0].clone()
        for r in range(1, world):
            ref = ref + (inputs[r].double() if dtype.is_floating_point else inputs[r])
        assert_close(t, ref.to(dtype), f"all_reduce {dtype}")
        # reduce_scatter_tensor
        full = [make_input(r, case + 50, world * n, dtype) for r in range(world)]
        o = out((n,), dtype)
        dist.reduce_scatter_tensor(o, inp(full[rank]))
        ref = sum((f.double() if dtype.is_floating_point else f) for f in full)
        assert_close(o, ref[rank * n:(rank + 1) * n].to(dtype), f"reduce_scatter {dtype}")
        # broadcast from the last rank
        t = inp(inputs[rank])
        dist.broadcast(t, src=world - 1)
        assert_close(t, inputs[world - 1], f"broadcast {dtype}")
        # all_to_all_single with uneven splits (rows of 3)
        g = torch.Generator().manual_seed(case)
        m = torch.randint(5_000, 20_000, (world, world), generator=g)
        ins = [make_input(r, case + 90, int(m[r].sum()) * 3, dtype).view(-1, 3) for r in range(world)]
        o = out((int(m[:, rank].sum()), 3), dtype)
        dist.all_to_all_single(o, inp(ins[rank]), output_split_sizes=m[:, rank].tolist(),
                               input_split_sizes=m[rank].tolist())
        parts = [ins[s][int(m[s, :rank].sum()):int(m[s, :rank + 1].sum())] for s in range(world)]
        assert_close(o, torch.cat(parts), f"all_to_all_single {dtype}")
    return _mapped_bytes() - before


@pytest.mark.parametrize("world,shared_in,shared_out", [(2, True, True), (3, True, False), (4, False, True)])
def test_collectives_on_shared_tensors(world, shared_in, shared_out):
    env = {"HOCCL_CMA_MIN_BYTES": "4096"}
    mapped = run_ranks(check_ops_on_shared, world, shared_in, shared_out, env=env, timeout=300)
    if shared_in:
        # Every op reads peers' inputs (all_reduce in place: its input is its output).
        assert all(m > 1_000_000 for m in mapped), mapped
    else:
        # Peers never read these ops' separate outputs: everything went by cross-memory reads.
        assert mapped == [0] * world, mapped


def check_mixed_ranks(rank, world):
    """Only even ranks use shared tensors: readers map what they can and copy the rest."""
    case = 8100
    n = 300_001
    inputs = [make_input(r, case, n, torch.float32) for r in range(world)]
    x = _shared_like(inputs[rank]) if rank % 2 == 0 else inputs[rank].clone()
    o = torch.empty(world * n)
    before = _mapped_bytes()
    dist.all_gather_into_tensor(o, x)
    assert_close(o, torch.cat(inputs), "all_gather mixed")
    return _mapped_bytes() - before


def test_only_some_ranks_shared():
    mapped = run_ranks(check_mixed_ranks, 3, env={"HOCCL_CMA_MIN_BYTES": "4096"}, timeout=300)
    n = 300_001 * 4
    # rank 0 reads rank 2's block, rank 1 reads ranks 0 and 2, rank 2 reads rank 0.
    assert mapped == [n, 2 * n, n], mapped


def check_fresh_tensors_each_op(rank, world, rounds):
    """A new shared tensor per op, the old one freed: the freed tensor's fd number is reused, so a
    reader that cached mappings by fd number would read stale bytes. Also counts how many of the
    peers' freed regions this process still maps afterwards (bounded: idle ones are unmapped)."""
    import hoccl_backend

    n = 70_001
    peak = 0
    for i in range(rounds):
        x = hoccl_backend.empty(n, dtype=torch.int64)
        x.fill_(rank * 1_000_000 + i)
        o = torch.empty(world * n, dtype=torch.int64)
        dist.all_gather_into_tensor(o, x)
        expected = torch.cat([torch.full((n,), r * 1_000_000 + i, dtype=torch.int64) for r in range(world)])
        assert torch.equal(o, expected), f"round {i}: stale or wrong bytes"
        del x
        peak = max(peak, _hoccl_regions_mapped())
    return peak


def test_fresh_tensor_per_op_and_mappings_are_released():
    rounds = 200
    peaks = run_ranks(check_fresh_tensors_each_op, 2, rounds, env={"HOCCL_CMA_MIN_BYTES": "4096"}, timeout=300)
    # Without release every rank would end up mapping ~200 of its peer's freed regions.
    assert all(p <= 100 for p in peaks), peaks


def test_empty_api_and_lifetime():
    import hoccl_backend

    shm_before = set(os.listdir("/dev/shm"))
    fds_before = len(os.listdir("/proc/self/fd"))
    t = hoccl_backend.empty(3, 5, dtype=torch.float64)
    assert t.shape == (3, 5) and t.dtype == torch.float64 and t.is_contiguous()
    assert hoccl_backend.is_shared(t) and hoccl_backend.is_shared(t[1:])
    assert not hoccl_backend.is_shared(torch.ones(4))
    z = hoccl_backend.zeros((4, 2), dtype=torch.int16)
    assert torch.equal(z, torch.zeros(4, 2, dtype=torch.int16))
    assert hoccl_backend.empty(torch.Size([2, 0])).shape == (2, 0)
    assert hoccl_backend.empty(7).dtype == torch.get_default_dtype()
    with pytest.raises(ValueError, match="negative dimension"):
        hoccl_backend.empty(2, -1)
    # Nothing named in /dev/shm (memfd), and freeing the tensors closes their descriptors.
    assert set(os.listdir("/dev/shm")) == shm_before
    del t, z
    assert len(os.listdir("/proc/self/fd")) == fds_before
    assert _hoccl_regions_mapped() == 0


def check_large_all_reduce_choice(rank, world, who_shares):
    """Past HOCCL_ALLREDUCE_CMA_MAX_BYTES all_reduce stages its data unless every rank's tensor
    is shared: then it reads peers through mappings. Both must give the reference result."""
    import hoccl_backend

    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    results = []
    case = 9100
    for dtype, op, name in ((torch.float32, dist.ReduceOp.SUM, "sum"), (torch.int64, dist.ReduceOp.MAX, "max"),
                            (torch.bfloat16, dist.ReduceOp.SUM, "sum")):
        n = 200_003
        case += 1
        inputs = [make_input(r, case, n, dtype) for r in range(world)]
        t = _shared_like(inputs[rank]) if rank in who_shares else inputs[rank].clone()
        before = _mapped_bytes()
        dist.all_reduce(t, op=op)
        mapped = _mapped_bytes() - before
        if name == "max":
            ref = torch.stack(inputs).max(0).values
        else:
            ref = sum(i.double() for i in inputs).to(dtype)
        assert_close(t, ref, f"all_reduce {name} {dtype} shared by {who_shares}")
        results.append((backend.last_algorithm(), mapped > 0))
    return results


@pytest.mark.parametrize("who_shares", [(0, 1, 2), (0, 2), ()])
def test_large_all_reduce_reads_mapped_only_when_every_rank_shares(who_shares):
    # 200 003 elements x 3 ranks are past the max; the min lets these sizes read peers at all
    env = {"HOCCL_ALLREDUCE_CMA_MAX_BYTES": "1M", "HOCCL_ALLREDUCE_CMA_MIN_BYTES": "256K"}
    results = run_ranks(check_large_all_reduce_choice, 3, who_shares, env=env, timeout=300)
    every = len(who_shares) == 3
    for per_rank in results:
        for algo, mapped in per_rank:
            assert (algo == "all_reduce/direct-read") == every, (who_shares, algo)
            assert mapped == every, (who_shares, per_rank)


def check_all_to_all_threshold(rank, world):
    read = []
    for n in (4096, 8192):  # float32, per rank: 16 KiB and 32 KiB, blocks of 8 and 16 KiB
        x = _shared_like(torch.arange(n, dtype=torch.float32) + 100_000 * rank)
        y = torch.empty(n)
        before = _mapped_bytes()
        dist.all_to_all_single(y, x)
        read.append(_mapped_bytes() - before)
        half = n // 2
        expected = torch.cat([torch.arange(half * rank, half * (rank + 1), dtype=torch.float32) + 100_000 * r
                              for r in range(world)])
        assert torch.equal(y, expected), f"n={n}"
    return read


def test_all_to_all_reads_peers_directly_from_16k_blocks():
    # HOCCL_ALLTOALL_CMA_MIN_BYTES auto: world x 16 KiB. The direct-read plan maps the peer's
    # shared input and reads its block (16 KiB); the staged plan below copies through slots.
    for read in run_ranks(check_all_to_all_threshold, 2):
        assert read == [0, 16384], read
