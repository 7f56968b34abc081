"""Every collective x dtypes x sizes on real ranks (world 2, 3, 4) against references computed
locally from the known inputs of all ranks. Staging slots are shrunk to 64 KiB so that the
larger sizes run chunked (several staging rounds), as messages larger than the slots do."""
from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from collective_checks import (ALL_DTYPES, FLOAT_DTYPES, SIZES, all_to_all_reference, assert_close, make_input,
                               ops_for, redop, reference_reduce)
from dist_utils import run_ranks

SMALL_SLOTS = {"HOCCL_SHM_SLOT_BYTES": "65536", "HOCCL_SHM_RING_BYTES": "16384"}


def env_for(world: int, **extra) -> dict:
    """Each world size exercises a different data path, so all of them are covered:
    world 2 stages everything through shared memory (cross-memory reads off) and copies into
    outputs with streaming stores from 100 bytes (odd sizes and alignments), world 3 reads
    peers' buffers directly from 4 KiB up, world 4 reads directly from the default 256 KiB (all_reduce
    from its default 2 MiB) and stages smaller payloads in rounds of 8 KiB (many rounds, a ragged
    last one)."""
    env = dict(SMALL_SLOTS, **extra)
    if world == 4:
        env["HOCCL_STAGED_ROUND_BYTES"] = "8192"
    if world == 2:
        env["HOCCL_SHM_CMA"] = "0"
        env["HOCCL_STREAMING_COPY_BYTES"] = "100"
    elif world == 3:
        env["HOCCL_CMA_MIN_BYTES"] = "4096"
    return env


def check_all_reduce(rank, world):
    case = 0
    for dtype in ALL_DTYPES:
        for op in ops_for(dtype):
            for n in SIZES:
                case += 1
                small = op == "product"
                inputs = [make_input(r, case, n, dtype, small) for r in range(world)]
                t = inputs[rank].clone()
                dist.all_reduce(t, op=redop(op))
                assert_close(t, reference_reduce(inputs, op, world), f"all_reduce {op} {dtype} n={n}")
    return case


def check_gathers(rank, world):
    case = 100_000
    for dtype in ALL_DTYPES:
        for n in SIZES:
            case += 1
            inputs = [make_input(r, case, n, dtype) for r in range(world)]
            outs = [torch.empty(n, dtype=dtype) for _ in range(world)]
            dist.all_gather(outs, inputs[rank])
            for r in range(world):
                assert_close(outs[r], inputs[r], f"all_gather {dtype} n={n} block {r}")
            big = torch.empty(world * n, dtype=dtype)
            dist.all_gather_into_tensor(big, inputs[rank])
            assert_close(big, torch.cat(inputs), f"all_gather_into_tensor {dtype} n={n}")
            for root in range(world):
                t = inputs[root].clone() if rank == root else torch.zeros(n, dtype=dtype)
                dist.broadcast(t, src=root)
                assert_close(t, inputs[root], f"broadcast root={root} {dtype} n={n}")
                g = [torch.empty(n, dtype=dtype) for _ in range(world)] if rank == root else None
                dist.gather(inputs[rank], gather_list=g, dst=root)
                if rank == root:
                    for r in range(world):
                        assert_close(g[r], inputs[r], f"gather root={root} {dtype} n={n}")
                chunks = [make_input(r, case + 50_000, n, dtype) for r in range(world)]
                out = torch.empty(n, dtype=dtype)
                dist.scatter(out, scatter_list=chunks if rank == root else None, src=root)
                assert_close(out, chunks[rank], f"scatter root={root} {dtype} n={n}")
    return case


def check_reduce_scatter_and_reduce(rank, world):
    case = 200_000
    for dtype in ALL_DTYPES:
        for op in ops_for(dtype):
            for n in (0, 1, 7, 20_001):
                case += 1
                small = op == "product"
                full = [make_input(r, case, n * world, dtype, small) for r in range(world)]
                expected = reference_reduce(full, op, world)
                out = torch.empty(n, dtype=dtype)
                dist.reduce_scatter_tensor(out, full[rank], op=redop(op))
                assert_close(out, expected[rank * n:(rank + 1) * n], f"reduce_scatter_tensor {op} {dtype} n={n}")
                out2 = torch.empty(n, dtype=dtype)
                dist.reduce_scatter(out2, list(full[rank].chunk(world)) if n else
                                    [torch.empty(0, dtype=dtype)] * world, op=redop(op))
                assert_close(out2, expected[rank * n:(rank + 1) * n], f"reduce_scatter {op} {dtype} n={n}")
                root = case % world
                t = full[rank].clone()
                dist.reduce(t, dst=root, op=redop(op))
                if rank == root:
                    assert_close(t, expected, f"reduce root={root} {op} {dtype} n={n}")
                else:
                    assert_close(t, full[rank], f"reduce leaves non-root input alone {op} {dtype}")
    return case


def split_matrix(world, case, skew):
    g = torch.Generator().manual_seed(case)
    if skew == "zero":
        m = torch.zeros(world, world, dtype=torch.int64)
        m[0, world - 1] = 5
        return m
    if skew == "skewed":
        m = torch.randint(0, 3, (world, world), generator=g)
        m[:, 0] += 40_000  # everyone sends far more to rank 0 than a staging slot holds
        return m
    if skew in ("mixed", "mixed-large"):
        # rank 0's blocks are all one size, every other rank's are not: rank 0 takes the
        # even path and must find out at its first barrier that its peers did not
        m = torch.randint(0, 9, (world, world), generator=g)
        m[0, :] = m[:, 0] = 4 if skew == "mixed" else 40_000
        if world > 1:
            m[1, 1] = int(m[0, 0]) + 3
        return m
    return torch.randint(0, 9, (world, world), generator=g)


def check_all_to_all(rank, world, algo):
    case = 300_000
    for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.uint8, torch.bool):
        # even splits
        for rows in (0, 1, 333):
            case += 1
            inputs = [make_input(r, case, world * rows * 3, dtype).view(world * rows, 3) for r in range(world)]
            out = torch.empty(world * rows, 3, dtype=dtype)
            dist.all_to_all_single(out, inputs[rank])
            expected = torch.cat([inputs[s][rank * rows:(rank + 1) * rows] for s in range(world)])
            assert_close(out, expected, f"all_to_all_single even {dtype} rows={rows} algo={algo}")
        # uneven, zero and skewed splits
        for skew in ("uneven", "zero", "skewed", "mixed", "mixed-large"):
            case += 1
            m = split_matrix(world, case, skew)
            inputs = [make_input(r, case, int(m[r].sum()) * 2, dtype).view(-1, 2) for r in range(world)]
            out = torch.empty(int(m[:, rank].sum()), 2, dtype=dtype)
            dist.all_to_all_single(out, inputs[rank], output_split_sizes=m[:, rank].tolist(),
                                   input_split_sizes=m[rank].tolist())
            assert_close(out, all_to_all_reference(inputs, m, rank), f"all_to_all_single {skew} {dtype} algo={algo}")
            backend = dist.group.WORLD._get_backend(torch.device("cpu"))
            assert backend.last_algorithm() == f"alltoall/{algo}", backend.last_algorithm()
        # list version, sizes differ per peer
        case += 1
        m = split_matrix(world, case, "uneven")
        send = [make_input(rank, case * 100 + d, int(m[rank, d]), dtype) for d in range(world)]
        recv = [torch.empty(int(m[s, rank]), dtype=dtype) for s in range(world)]
        dist.all_to_all(recv, send)
        for s in range(world):
            assert_close(recv[s], make_input(s, case * 100 + rank, int(m[s, rank]), dtype),
                         f"all_to_all list from {s} {dtype} algo={algo}")
    return case


def check_aliased_buffers(rank, world):
    """Outputs that alias inputs, as users write them: all_to_all in place (gloo corrupts it),
    all_gather_into_tensor from the rank's own slice of the output (FSDP's pattern) and
    reduce_scatter_tensor into the rank's own slice of the input, gather / scatter whose root
    passes its own list slot. Sizes cover staged and direct-read paths."""
    case = 500_000
    for n in (7, 70_001, 300_000):
        case += 1
        inputs = [make_input(r, case, world * n, torch.float32) for r in range(world)]
        x = inputs[rank].clone()
        dist.all_to_all_single(x, x)
        expected = torch.cat([inputs[s][rank * n:(rank + 1) * n] for s in range(world)])
        assert_close(x, expected, f"all_to_all_single in place n={n}")

        blocks = [t.clone() for t in inputs[rank].chunk(world)]
        dist.all_to_all(blocks, blocks)
        assert_close(torch.cat(blocks), expected, f"all_to_all list in place n={n}")

        case += 1
        inputs = [make_input(r, case, n, torch.float32) for r in range(world)]
        big = torch.full((world * n,), float("nan"))
        big[rank * n:(rank + 1) * n] = inputs[rank]
        dist.all_gather_into_tensor(big, big[rank * n:(rank + 1) * n])
        assert_close(big, torch.cat(inputs), f"all_gather_into_tensor from own slice n={n}")
        outs = [torch.full((n,), float("nan")) for _ in range(world)]
        outs[rank].copy_(inputs[rank])
        dist.all_gather(outs, outs[rank])
        assert_close(torch.cat(outs), torch.cat(inputs), f"all_gather from own output n={n}")

        case += 1
        inputs = [make_input(r, case, world * n, torch.float32) for r in range(world)]
        x = inputs[rank].clone()
        dist.reduce_scatter_tensor(x[rank * n:(rank + 1) * n], x)
        expected = reference_reduce([t[rank * n:(rank + 1) * n] for t in inputs], "sum", world)
        assert_close(x[rank * n:(rank + 1) * n], expected, f"reduce_scatter_tensor into own slice n={n}")

        # gather whose root passes its own slot of gather_list as the input, scatter whose root
        # receives into its own slot of scatter_list; every root in turn.
        for root in range(world):
            case += 1
            inputs = [make_input(r, case, n, torch.float32) for r in range(world)]
            slots = [torch.full((n,), float("nan")) for _ in range(world)]
            slots[rank].copy_(inputs[rank])
            dist.gather(slots[rank], slots if rank == root else None, dst=root)
            if rank == root:
                assert_close(torch.cat(slots), torch.cat(inputs), f"gather into own slot n={n} root={root}")
            pieces = [make_input(root, case, n, torch.float32) + r for r in range(world)]
            src_list = [p.clone() for p in pieces] if rank == root else None
            out = src_list[root] if rank == root else torch.full((n,), float("nan"))
            dist.scatter(out, src_list, src=root)
            assert_close(out, pieces[rank], f"scatter from own slot n={n} root={root}")
    return True


def check_p2p_and_misc(rank, world):
    # send/recv ring, with messages larger than the ring buffers
    for n in (0, 5, 100_000):
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        payload = make_input(rank, 400_000 + n, n, torch.float32)
        reqs = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, payload, nxt),
            dist.P2POp(dist.irecv, got := torch.empty(n), prv),
        ])
        for r in reqs:
            r.wait()
        assert_close(got, make_input(prv, 400_000 + n, n, torch.float32), f"batch_isend_irecv n={n}")
        # plain isend/irecv, posted receive-first on odd ranks
        got2 = torch.empty(n)
        if rank % 2:
            rq = dist.irecv(got2, prv)
            sq = dist.isend(payload, nxt)
        else:
            sq = dist.isend(payload, nxt)
            rq = dist.irecv(got2, prv)
        sq.wait()
        rq.wait()
        assert_close(got2, make_input(prv, 400_000 + n, n, torch.float32), f"isend/irecv n={n}")
    # recv from any source
    if rank == 0:
        seen = set()
        for _ in range(world - 1):
            t = torch.empty(1, dtype=torch.int64)
            src = dist.recv(t)
            assert int(t) == src * 11, (src, t)
            seen.add(src)
        assert seen == set(range(1, world))
    else:
        dist.send(torch.tensor([rank * 11]), 0)
    dist.barrier()

    # async ops complete in issue order; futures carry the outputs
    ts = [torch.full((1000,), float(rank + i)) for i in range(8)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    futs = [w.get_future() for w in works]
    works[-1].wait()
    assert all(w.is_completed() for w in works), "earlier async ops must be complete"
    for i, f in enumerate(futs):
        val = f.wait()
        assert isinstance(val, list) and torch.equal(val[0], ts[i])
        assert torch.all(ts[i] == sum(r + i for r in range(world)))

    # non-contiguous tensors: handled (copied through a contiguous buffer)
    base = make_input(rank, 7, 40, torch.float32).view(8, 5)
    nc = base.t()
    assert not nc.is_contiguous()
    dist.all_reduce(nc)
    expected = reference_reduce([make_input(r, 7, 40, torch.float32).view(8, 5).t() for r in range(world)],
                                "sum", world)
    assert_close(nc, expected, "all_reduce non-contiguous")

    # coalesced variants
    xs = [make_input(rank, 900 + i, 10 * i + 1, torch.float32) for i in range(4)]
    ys = [x.clone() for x in xs]
    with dist._coalescing_manager(async_ops=True) as cm:
        for y in ys:
            dist.all_reduce(y)
    cm.wait()
    for i, y in enumerate(ys):
        ref = reference_reduce([make_input(r, 900 + i, 10 * i + 1, torch.float32) for r in range(world)], "sum", world)
        assert_close(y, ref, f"coalesced all_reduce {i}")
    outs = [torch.empty(world * x.numel()) for x in xs]
    with dist._coalescing_manager():
        for o, x in zip(outs, xs):
            dist.all_gather_into_tensor(o, x)
    for i, o in enumerate(outs):
        assert_close(o, torch.cat([make_input(r, 900 + i, 10 * i + 1, torch.float32) for r in range(world)]),
                     f"coalesced all_gather_into_tensor {i}")
    ins = [make_input(rank, 950 + i, world * (i + 1), torch.float32) for i in range(3)]
    rs = [torch.empty(i + 1) for i in range(3)]
    with dist._coalescing_manager():
        for o, x in zip(rs, ins):
            dist.reduce_scatter_tensor(o, x)
    for i, o in enumerate(rs):
        full = reference_reduce([make_input(r, 950 + i, world * (i + 1), torch.float32) for r in range(world)],
                                "sum", world)
        assert_close(o, full[rank * (i + 1):(rank + 1) * (i + 1)], f"coalesced reduce_scatter_tensor {i}")
    # functional collectives go through the *_coalesced entry points
    import torch.distributed._functional_collectives as funcol
    fr = funcol.all_reduce(make_input(rank, 33, 17, torch.float32), "sum", dist.group.WORLD)
    assert_close(fr, reference_reduce([make_input(r, 33, 17, torch.float32) for r in range(world)], "sum", world),
                 "functional all_reduce")
    return True


def check_subgroups(rank, world):
    evens = dist.new_group([r for r in range(world) if r % 2 == 0])
    odds = dist.new_group([r for r in range(world) if r % 2 == 1])
    pair = dist.new_group([0, world - 1])
    mine = evens if rank % 2 == 0 else odds
    members = [r for r in range(world) if r % 2 == rank % 2]
    for i in range(5):
        t = torch.full((3000,), float(rank * 10 + i))
        w1 = dist.all_reduce(t, group=mine, async_op=True)
        u = torch.full((5,), float(rank))
        w2 = dist.all_reduce(u, async_op=True)  # world group, interleaved
        w1.wait()
        w2.wait()
        assert torch.all(t == sum(r * 10 + i for r in members)), t[:3]
        assert torch.all(u == sum(range(world)))
    if rank in (0, world - 1):
        v = torch.tensor([float(rank + 1)])
        dist.all_reduce(v, group=pair)
        assert v.item() == 1 + world
        g = dist.get_group_rank(pair, rank)
        out = [torch.empty(1) for _ in range(2)]
        dist.all_gather(out, torch.tensor([float(g)]), group=pair)
        assert [o.item() for o in out] == [0.0, 1.0]
    dist.barrier()
    return True


def check_all_reduce_thresholds(rank, world):
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    seen = []
    for case, n in enumerate((65_536, 262_144, 1_048_576)):  # float32: 256 KiB, 1 MiB, 4 MiB
        inputs = [make_input(r, 7000 + case, n, torch.float32) for r in range(world)]
        t = inputs[rank].clone()
        dist.all_reduce(t)
        assert_close(t, reference_reduce(inputs, "sum", world), f"all_reduce n={n}")
        seen.append(backend.last_algorithm())
    return seen


def test_all_reduce_stages_below_its_direct_read_size():
    # Defaults: other ops read peers directly from 256 KiB, all_reduce stages below 4 MiB (in
    # one round of the slot) and reads directly from there.
    for seen in run_ranks(check_all_reduce_thresholds, 2):
        assert seen == ["allreduce/rs-ag", "allreduce/rs-ag", "all_reduce/direct-read"], seen


def check_late_peer(rank, world):
    cpu_seconds = []
    for i in range(3):
        if rank == 1:
            time.sleep(0.3)
        t = torch.full((1 << 18,), float(rank + i))
        start = time.process_time()
        dist.all_reduce(t)  # synchronous: runs on this thread, which spins before it sleeps
        cpu_seconds.append(time.process_time() - start)
        assert torch.equal(t, torch.full_like(t, float(2 * i + 1))), f"round {i}"
    return cpu_seconds


def test_a_synchronous_op_spins_then_sleeps_through_a_late_peer():
    # Rank 0 waits 0.3 s for rank 1 three times: it spins HOCCL_CALLER_SPIN_US (2 ms here, where
    # the ranks fit the cores), then sleeps. Spinning the whole wait would take 0.3 s of CPU.
    early, late = run_ranks(check_late_peer, 2, env={"HOCCL_CALLER_SPIN_US": "auto"})
    assert max(early) < 0.1, early


@pytest.mark.parametrize("world", [2, 3, 4])
def test_all_reduce(world):
    results = run_ranks(check_all_reduce, world, env=env_for(world), timeout=300)
    assert len(set(results)) == 1


@pytest.mark.parametrize("world", [2, 3, 4])
def test_gather_family(world):
    run_ranks(check_gathers, world, env=env_for(world), timeout=300)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_reduce_scatter_and_reduce(world):
    run_ranks(check_reduce_scatter_and_reduce, world, env=env_for(world), timeout=300)


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("algo", ["varipath", "direct", "pairwise"])
def test_all_to_all(world, algo):
    run_ranks(check_all_to_all, world, algo, env=env_for(world, HOCCL_ALLTOALL_ALGO=algo), timeout=300)


def test_all_to_all_on_a_topology_preset():
    # VarioPath with the 4-GPU direct-attached preset's channel catalog instead of the flat one.
    run_ranks(check_all_to_all, 4, "varipath", env=env_for(4, HOCCL_ALLTOALL_ALGO="varipath",
                                                           HOCCL_TOPOLOGY="direct4"), timeout=300)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_aliased_outputs(world):
    assert run_ranks(check_aliased_buffers, world, env=env_for(world), timeout=300) == [True] * world


@pytest.mark.parametrize("world", [2, 3, 4])
def test_p2p_async_coalesced(world):
    assert run_ranks(check_p2p_and_misc, world, env=env_for(world), timeout=300) == [True] * world


@pytest.mark.parametrize("world", [3, 4])
def test_subgroups(world):
    assert run_ranks(check_subgroups, world, timeout=300) == [True] * world
