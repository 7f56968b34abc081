"""Collective checks run inside the ranks of a multi-host job, on any c10d Backend object (the
hoccl backend of the default group, or one built over a permuted placement). Every rank builds
every rank's input from known seeds (collective_checks.make_input), so each expected result is
computed locally with plain torch ops; a mismatch raises naming the op, dtype and size."""
from __future__ import annotations

import zlib

import torch
import torch.distributed as dist

from collective_checks import (ALL_DTYPES, SIZES, all_to_all_reference, assert_close, make_input,
                               ops_for, redop, reference_reduce)

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int16, torch.uint8,
          torch.bool]
assert set(DTYPES) <= set(ALL_DTYPES)


def _opts(cls, **fields):
    o = cls()
    for k, v in fields.items():
        setattr(o, k, v)
    return o


def check_reductions(pg, rank: int, world: int) -> int:
    done = 0
    for dtype in DTYPES:
        for numel in SIZES:
            for op in ops_for(dtype):
                case = zlib.crc32(repr((dtype, numel, op)).encode()) % 100000  # same on every rank
                small = op == "product"
                inputs = [make_input(r, case, numel, dtype, small) for r in range(world)]
                what = f"all_reduce {op} {dtype} x{numel} on rank {rank}"
                t = inputs[rank].clone()
                pg.allreduce([t], _opts(dist.AllreduceOptions, reduceOp=redop(op))).wait()
                assert_close(t, reference_reduce(inputs, op, world), what)
                done += 1
        numel = 1001
        blocks = [[make_input(r, 31 * d + 1, numel, dtype) for d in range(world)] for r in range(world)]
        expected = reference_reduce([blocks[r][rank] for r in range(world)], "sum", world)
        out = torch.empty(numel, dtype=dtype)
        pg.reduce_scatter([out], [blocks[rank]], _opts(dist.ReduceScatterOptions, reduceOp=redop("sum"))).wait()
        assert_close(out, expected, f"reduce_scatter sum {dtype} x{numel} on rank {rank}")
        flat = torch.cat(blocks[rank])
        out2 = torch.empty(numel, dtype=dtype)
        pg._reduce_scatter_base(out2, flat, _opts(dist.ReduceScatterOptions, reduceOp=redop("sum"))).wait()
        assert_close(out2, expected, f"reduce_scatter_tensor {dtype} x{numel} on rank {rank}")
        done += 2
    for numel in (0, 7, 70_001):
        blocks = [[make_input(r, 7 * d + numel, numel, torch.float32) for d in range(world)]
                  for r in range(world)]
        for op in ("avg", "max", "premul"):
            expected = reference_reduce([blocks[r][rank] for r in range(world)], op, world)
            out = torch.empty(numel)
            pg._reduce_scatter_base(out, torch.cat(blocks[rank]),
                                    _opts(dist.ReduceScatterOptions, reduceOp=redop(op))).wait()
            assert_close(out, expected, f"reduce_scatter_tensor {op} x{numel} on rank {rank}")
            done += 1
    for root in sorted({0, world - 1, world // 2}):
        inputs = [make_input(r, 77 + root, 70_001, torch.float32) for r in range(world)]
        t = inputs[rank].clone()
        pg.reduce([t], _opts(dist.ReduceOptions, reduceOp=redop("sum"), rootRank=root)).wait()
        if rank == root:
            assert_close(t, reference_reduce(inputs, "sum", world), f"reduce to {root} on rank {rank}")
        done += 1
    return done


def check_data_movement(pg, rank: int, world: int) -> int:
    done = 0
    for dtype in (torch.float32, torch.bfloat16, torch.int16, torch.bool):
        for numel in SIZES:
            inputs = [make_input(r, numel + 3, numel, dtype) for r in range(world)]
            outs = [torch.empty(numel, dtype=dtype) for _ in range(world)]
            pg.allgather([outs], [inputs[rank]]).wait()
            for r in range(world):
                assert_close(outs[r], inputs[r], f"all_gather {dtype} x{numel} block {r} on rank {rank}")
            out = torch.empty(world * numel, dtype=dtype)
            pg._allgather_base(out, inputs[rank]).wait()
            assert_close(out, torch.cat(inputs), f"all_gather_into_tensor {dtype} x{numel} on rank {rank}")
            for root in sorted({0, world - 1}):
                t = inputs[rank].clone()
                pg.broadcast([t], _opts(dist.BroadcastOptions, rootRank=root)).wait()
                assert_close(t, inputs[root], f"broadcast from {root} {dtype} x{numel} on rank {rank}")
            done += 4
    # the coalesced form: output_lists[r][i] receives rank r's inputs[i] (gloo's layout)
    shapes = [(33, torch.float32), (7, torch.int16)]
    mine = [make_input(rank, 40 + i, n, dt) for i, (n, dt) in enumerate(shapes)]
    lists = [[torch.empty(n, dtype=dt) for n, dt in shapes] for _ in range(world)]
    pg.allgather_coalesced(lists, mine).wait()
    for r in range(world):
        for i, (n, dt) in enumerate(shapes):
            assert_close(lists[r][i], make_input(r, 40 + i, n, dt), f"allgather_coalesced {i} from {r} on rank {rank}")
    done += 1
    root = world - 1
    inputs = [make_input(r, 5, 1001, torch.int64) for r in range(world)]
    gathered = [torch.empty(1001, dtype=torch.int64) for _ in range(world)] if rank == root else []
    pg.gather([gathered] if rank == root else [], [inputs[rank]], _opts(dist.GatherOptions, rootRank=root)).wait()
    if rank == root:
        for r in range(world):
            assert_close(gathered[r], inputs[r], f"gather block {r} on rank {rank}")
    pieces = [make_input(d, 9, 1001, torch.float32) for d in range(world)]
    out = torch.empty(1001)
    pg.scatter([out], [pieces] if rank == root else [], _opts(dist.ScatterOptions, rootRank=root)).wait()
    assert_close(out, pieces[rank], f"scatter on rank {rank}")
    pg.barrier(dist.BarrierOptions()).wait()
    return done + 3


def _split_matrix(world: int, kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(kind.encode()))
    if kind == "equal":
        return torch.full((world, world), 3, dtype=torch.int64)
    if kind == "zero":
        return torch.zeros((world, world), dtype=torch.int64)
    if kind == "skewed":  # one hot destination receives most rows, some pairs send nothing
        m = torch.randint(0, 3, (world, world), generator=g)
        m[:, world - 1] += 5000
        return m
    return torch.randint(0, 40, (world, world), generator=g)  # uneven


def expected_phases(hosts: list, matrix: list, form: str) -> list:
    """The phases a form across hosts moves (docs/multihost.md), from the host table and the
    bytes each rank sends each rank: own blocks; then direct: every other pair; rail: the host
    legs (same-host pairs, and each cross-host block to its sender host's relay for the
    destination, unless the sender is that relay), then one message per (relay, destination)
    with every block of the relay's host for that destination."""
    world = len(matrix)
    host_of = {r: h for h, ranks in enumerate(hosts) for r in ranks}
    local = {r: ranks.index(r) for ranks in hosts for r in ranks}

    def relay(h, d):
        return hosts[h][local[d] % len(hosts[h])]

    own = [(r, r, matrix[r][r]) for r in range(world) if matrix[r][r]]
    legs = []
    for s in range(world):
        for d in range(world):
            if s == d or not matrix[s][d]:
                continue
            to = relay(host_of[s], d) if form == "rail" and host_of[s] != host_of[d] else d
            if to != s:
                legs.append((s, to, matrix[s][d]))
    if form != "rail":
        return [own, legs]
    crossing = []
    for d in range(world):
        for h, ranks in enumerate(hosts):
            total = sum(matrix[s][d] for s in ranks) if h != host_of[d] else 0
            if total:
                crossing.append((relay(h, d), d, total))
    return [own, legs, crossing]


def check_all_to_all(pg, rank: int, world: int, form: str | None = None) -> int:
    """Every split kind in all_to_all_single (several dtypes) and list all_to_all; with `form`,
    each op must have run in that form (last_algorithm names it). last_alltoall_phases() must
    list the form's transfers for the split matrix (none where the legs gathered no matrix)."""
    import os

    # Without the check across hosts the direct form plans from each rank's own splits and its
    # host's: no split matrix is gathered.
    no_matrix = form != "rail" and os.environ.get("HOCCL_CHECK_ACROSS_HOSTS") == "0"

    def ran(what, splits=None, dtype=None):
        if form is not None:
            assert pg.last_algorithm() == f"multihost_{form}", f"{what}: ran {pg.last_algorithm()}, not {form}"
        if splits is None:
            return
        got = [[tuple(t) for t in phase] for phase in pg.last_alltoall_phases()]
        if no_matrix:
            assert got == [], f"{what}: phases {got} without a split matrix"
            return
        size = torch.empty(0, dtype=dtype).element_size()
        matrix = (splits * 3 * size).tolist()
        ran_form = pg.last_algorithm().removeprefix("multihost_")
        assert got == expected_phases(pg.hosts(), matrix, ran_form), f"{what}: phases {got}"

    done = 0
    for kind in ("equal", "zero", "uneven", "skewed"):
        splits = _split_matrix(world, kind)
        for dtype in (torch.float32, torch.int16, torch.bfloat16, torch.bool):
            inputs = [make_input(r, 11, int(splits[r].sum()) * 3, dtype).view(-1, 3) for r in range(world)]
            expected = all_to_all_reference(inputs, splits, rank)
            out = torch.empty(int(splits[:, rank].sum()), 3, dtype=dtype)
            pg.alltoall_base(out, inputs[rank], splits[:, rank].tolist(), splits[rank].tolist(),
                             dist.AllToAllOptions()).wait()
            assert_close(out, expected, f"all_to_all_single {kind} {dtype} on rank {rank}")
            ran(f"all_to_all_single {kind} {dtype} on rank {rank}", splits, dtype)
            done += 1
        ins = list(inputs[rank].split(splits[rank].tolist()))
        outs = [torch.empty(int(splits[s, rank]), 3, dtype=dtype) for s in range(world)]
        pg.alltoall(outs, ins, dist.AllToAllOptions()).wait()
        assert_close(torch.cat(outs), expected, f"all_to_all {kind} on rank {rank}")
        ran(f"all_to_all {kind} on rank {rank}", splits, dtype)
        done += 1
    return done


def check_auto_form(pg, rank: int, world: int, hosts: list) -> int:
    """HOCCL_MULTIHOST_ALLTOALL=auto on the default cost model: a tiny even all_to_all is
    latency-bound, so where some host has two ranks the rail form's fewer messages win; 1 MiB
    blocks are copy-bound, so the direct form wins. Every rank must pick the same."""
    widest = max(len(h) for h in hosts)
    for numel, expected in ((world * 4, "rail" if widest > 1 else "direct"), (world << 18, "direct")):
        t = make_input(rank, 3, numel, torch.float32)
        out = torch.empty(numel)
        pg.alltoall_base(out, t, [], [], dist.AllToAllOptions()).wait()
        inputs = [make_input(r, 3, numel, torch.float32).view(world, -1) for r in range(world)]
        assert_close(out, torch.cat([inputs[r][rank] for r in range(world)]), f"auto all_to_all x{numel}")
        assert pg.last_algorithm() == f"multihost_{expected}", \
            f"auto all_to_all x{numel} on rank {rank}: ran {pg.last_algorithm()}, expected {expected}"
    return 2


def check_all_to_all_forms(make_group, rank: int, world: int) -> int:
    """Both forms forced (HOCCL_MULTIHOST_ALLTOALL is read when a group is created) on a group
    of the same placement that make_group() builds."""
    import os

    done = 0
    for form in ("direct", "rail"):
        os.environ["HOCCL_MULTIHOST_ALLTOALL"] = form
        try:
            pg = make_group(form)
        finally:
            del os.environ["HOCCL_MULTIHOST_ALLTOALL"]
        done += check_all_to_all(pg, rank, world, form)
        pg.shutdown()
    return done


def check_send_recv(pg, rank: int, world: int) -> int:
    """Every pair exchanges in both directions; receives are posted before the sends on even
    ranks and after them on odd ranks; then a ring with recv from any source."""
    works, received = [], {}
    def payload(src, dst):
        return make_input(src, 1000 + dst, 70_001, torch.float32)
    peers = [p for p in range(world) if p != rank]
    recvs = [(p, torch.empty(70_001)) for p in peers]
    sends = [(p, payload(rank, p)) for p in peers]
    if rank % 2 == 0:
        works += [pg.recv([t], p, 7) for p, t in recvs] + [pg.send([t], p, 7) for p, t in sends]
    else:
        works += [pg.send([t], p, 7) for p, t in sends] + [pg.recv([t], p, 7) for p, t in recvs]
    for w in works:
        w.wait()
    for p, t in recvs:
        assert_close(t, payload(p, rank), f"recv from {p} on rank {rank}")
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    send = pg.send([torch.full((5,), float(rank))], nxt, 9)
    got = torch.empty(5)
    w = pg.recv_anysource([got], 9)
    w.wait()
    send.wait()
    assert w._source_rank() == prv and torch.equal(got, torch.full((5,), float(prv))), \
        f"any-source recv on rank {rank}: from {w._source_rank()} {got.tolist()}"
    return len(works) + 1 + check_any_source_fan_in(pg, rank, world)


def check_any_source_fan_in(pg, rank: int, world: int) -> int:
    """Every other rank sends one message to the last rank, which takes them all with recvs from
    any source posted at once: senders on its own host and on others race, and each message
    lands in exactly one recv."""
    sink = world - 1
    if rank != sink:
        pg.send([torch.full((33,), float(rank))], sink, 11).wait()
        return 0
    bufs = [torch.empty(33) for _ in range(world - 1)]
    works = [pg.recv_anysource([b], 11) for b in bufs]
    sources = []
    for w, b in zip(works, bufs):
        w.wait()
        src = w._source_rank()
        assert torch.equal(b, torch.full((33,), float(src))), f"any-source recv from {src}: {b.tolist()}"
        sources.append(src)
    assert sorted(sources) == list(range(world - 1)), f"any-source recvs on rank {rank} got {sources}"
    return len(works)


def check_pipelined(pg, rank: int, world: int) -> int:
    """Sizes the pipelined forms cut into several chunks (chunks are at least 1 MiB), with a
    ragged last one; bf16 crosses hosts as float."""
    done = 0
    for dtype, numel in ((torch.float32, 2_400_007), (torch.bfloat16, 1_100_001)):
        inputs = [make_input(r, 5, numel, dtype) for r in range(world)]
        t = inputs[rank].clone()
        pg.allreduce([t], _opts(dist.AllreduceOptions, reduceOp=redop("sum"))).wait()
        assert_close(t, reference_reduce(inputs, "sum", world), f"all_reduce {dtype} x{numel} on rank {rank}")
        block = numel // world + 1
        blocks = [[make_input(r, 11 * d + 3, block, dtype) for d in range(world)] for r in range(world)]
        out = torch.empty(block, dtype=dtype)
        pg._reduce_scatter_base(out, torch.cat(blocks[rank]),
                                _opts(dist.ReduceScatterOptions, reduceOp=redop("avg"))).wait()
        expected = reference_reduce([blocks[r][rank] for r in range(world)], "avg", world)
        assert_close(out, expected, f"reduce_scatter_tensor avg {dtype} x{block} on rank {rank}")
        gathered = torch.empty(world * block, dtype=dtype)
        pg._allgather_base(gathered, blocks[rank][0]).wait()
        assert_close(gathered, torch.cat([blocks[r][0] for r in range(world)]),
                      f"all_gather_into_tensor {dtype} x{block} on rank {rank}")
        done += 3
    return done


def every_op(pg, rank: int, world: int) -> dict:
    counts = {
        "pipelined": check_pipelined(pg, rank, world),
        "reductions": check_reductions(pg, rank, world),
        "data_movement": check_data_movement(pg, rank, world),
        "all_to_all": check_all_to_all(pg, rank, world),
        "send_recv": check_send_recv(pg, rank, world),
    }
    return counts
