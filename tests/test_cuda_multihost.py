"""CUDA tensors in a hoccl group spanning hosts: 4 ranks on the one GPU, told apart as 2 hosts x 2
ranks by HOCCL_HOSTNAME (so the group spans hosts: shared memory inside each, gloo
rails over loopback). Every op equals the same op on CPU tensors in the same group, bit for bit;
the caller's stream is ordered as on one host (an op sees a late kernel's writes, a kernel after
wait() sees the result, get_future completes after the copies); mismatched tensors raise naming
the op and the rank.

One spawn of the ranks serves every test (a module fixture), so the GPU check's stage stays short.
Skipped without a GPU. On a CPU-only machine `test_cpu_reference_runs_across_hosts` still runs
the same op list on CPU tensors, which keeps this file's harness honest.
"""
from __future__ import annotations

import os

import pytest
import torch

from cuda_test_utils import NO_CUDA_REASON, all_reduce_results, rank_data
from dist_utils import run_ranks

WORLD, PER_HOST = 4, 2
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA_REASON)


def _init(rank, world):
    """Joins the 2-host group: host identity per rank, gloo on loopback."""
    import torch.distributed as dist

    os.environ["HOCCL_HOSTNAME"] = f"mh-cuda-host{rank // PER_HOST}"
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    import hoccl_backend  # noqa: F401  (registers "hoccl")
    from hoccl_backend import _C

    dist.init_process_group("hoccl", rank=rank, world_size=world)
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    assert isinstance(backend, _C.ProcessGroupHOCCL) and backend.spans_hosts(), type(backend)


def _ops(rank, world, dev, dtype, n):
    """Every op a group spanning hosts supports, on tensors on `dev`, all_to_all's forms aside (they need
    other sizes and run in `_all_to_all`): name -> CPU results."""
    import torch.distributed as dist

    t, out = all_reduce_results(rank, dev, dtype, n)
    xs = [t(), t(rank + 7)]
    dist.all_reduce_coalesced(xs)
    out["all_reduce_coalesced"] = xs
    x = t()
    dist.reduce(x, dst=PER_HOST)  # the root on the second host
    out["reduce"] = [x]
    x = t()
    dist.broadcast(x, src=world - 1)
    out["broadcast"] = [x]
    outs = [torch.empty(n, dtype=dtype, device=dev) for _ in range(world)]
    dist.all_gather(outs, t())
    out["all_gather"] = outs
    flat = torch.empty(world * n, dtype=dtype, device=dev)
    dist.all_gather_into_tensor(flat, t())
    out["all_gather_into_tensor"] = [flat]
    inplace = torch.cat([rank_data(r, n, dtype).to(dev) if r == rank else torch.zeros(n, dtype=dtype, device=dev)
                         for r in range(world)])
    dist.all_gather_into_tensor(inplace, inplace.narrow(0, rank * n, n))
    out["all_gather_into_tensor_inplace"] = [inplace]
    rs = torch.empty(n, dtype=dtype, device=dev)
    dist.reduce_scatter(rs, [t(rank * world + r) for r in range(world)])
    out["reduce_scatter"] = [rs]
    rs = torch.empty(n, dtype=dtype, device=dev)
    dist.reduce_scatter_tensor(rs, rank_data(rank, world * n, dtype).to(dev))
    out["reduce_scatter_tensor"] = [rs]
    root = PER_HOST + 1
    gathered = [torch.empty(n, dtype=dtype, device=dev) for _ in range(world)] if rank == root else None
    dist.gather(t(), gathered, dst=root)
    out["gather"] = gathered or []
    got = torch.empty(n, dtype=dtype, device=dev)
    dist.scatter(got, [t(100 + r) for r in range(world)] if rank == 0 else None, src=0)
    out["scatter"] = [got]
    # A ring: each rank's successor is on the other host for odd ranks, on its own for even ones.
    mine, theirs = t(), torch.empty(n, dtype=dtype, device=dev)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, (rank + 1) % world),
                                    dist.P2POp(dist.irecv, theirs, (rank - 1) % world)])
    for w in works:
        w.wait()
    out["isend_irecv_ring"] = [theirs.clone()]
    x = t()
    if rank == 1:
        dist.send(x, dst=PER_HOST)
    elif rank == PER_HOST:
        dist.recv(x)  # from any source
    out["send_recv_anysource"] = [x]
    dist.barrier()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return {k: [v.cpu() for v in vs] for k, vs in out.items()}


def _compare(rank, world, dev):
    bad = []
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        # The large size (several staging chunks) once: the GPU check gives this file 35 s.
        for n in (1, 4097) + (((1 << 18) + 3,) if dtype == torch.float32 else ()):
            got = _ops(rank, world, dev, dtype, n)
            ref = _ops(rank, world, torch.device("cpu"), dtype, n)
            for name in ref:
                if len(got[name]) != len(ref[name]) or not all(
                        torch.equal(a, b) for a, b in zip(got[name], ref[name])):
                    bad.append((name, str(dtype), n))
    return bad


def _ordering(rank, world, dev):
    """The caller's stream, as on one host: late producer kernels, consumers after wait()."""
    import torch.distributed as dist

    ok = {}
    n = 1 << 20
    x = torch.zeros(n, device=dev)
    for it in range(3):
        torch.cuda._sleep(50_000_000)  # the producer below starts late
        x.fill_(float(rank + it))
        dist.all_reduce(x)
        y = x * 1  # a consumer right after: sees the sum
        out = torch.empty(world * n, device=dev)
        w = dist.all_gather_into_tensor(out, torch.full((n,), float(rank), device=dev), async_op=True)
        w.wait()  # the current stream waits for the op
        z = out.view(world, n)[:, 0].clone()
        torch.cuda.synchronize()
        ok[f"all_reduce_after_late_kernel_{it}"] = bool(torch.all(y == sum(r + it for r in range(world))))
        ok[f"wait_orders_stream_{it}"] = bool(torch.equal(z.cpu(), torch.arange(world, dtype=torch.float32)))
    fut = dist.all_reduce(torch.ones(4, device=dev), async_op=True).get_future()
    ok["get_future"] = bool(torch.all(fut.wait()[0].cpu() == world))
    # A recv's wait() orders the stream after its H2D; a send sees a late producer.
    src = torch.zeros(n, device=dev)
    dst = torch.zeros(n, device=dev)
    peer = (rank + PER_HOST) % world  # the same local rank on the other host
    torch.cuda._sleep(50_000_000)
    src.fill_(float(rank + 1))
    if rank < PER_HOST:
        dist.isend(src, peer).wait()
        dist.irecv(dst, peer).wait()
    else:
        dist.irecv(dst, peer).wait()
        dist.isend(src, peer).wait()
    consumed = dst * 2
    torch.cuda.synchronize()
    ok["send_recv_stream"] = bool(torch.all(consumed == 2.0 * (peer + 1)))
    return ok


def _errors(rank, world, dev):
    """Local argument errors raise on the caller's thread, on every rank alike (no traffic)."""
    import torch.distributed as dist

    errs = {}

    def expect(name, fn):
        try:
            fn()
            errs[name] = "no error"
        except (RuntimeError, ValueError) as e:
            errs[name] = str(e).splitlines()[0]

    n = 16
    expect("mixed", lambda: dist.all_gather([torch.empty(n) for _ in range(world)], torch.ones(n, device=dev)))
    expect("mixed_reduce_scatter", lambda: dist.reduce_scatter(
        torch.empty(n, device=dev), [torch.ones(n) for _ in range(world)]))
    expect("bad_op", lambda: dist.all_reduce(torch.ones(n, device=dev), op=dist.ReduceOp.BAND))
    if torch.cuda.device_count() > 1:
        other = torch.device("cuda", (dev.index + 1) % torch.cuda.device_count())
        expect("two_devices", lambda: dist.all_gather_into_tensor(
            torch.empty(world * n, device=dev), torch.ones(n, device=other)))
    # The group still works after the refusals.
    x = torch.ones(n, device=dev)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    errs["after"] = bool(torch.all(x.cpu() == world))
    return errs


def _all_to_all(rank, world, dev):
    import torch.distributed as dist

    n = 1024
    # uneven splits: rank s sends s + d + 1 rows of 3 to rank d
    send = [rank + d + 1 for d in range(world)]
    recv = [s + rank + 1 for s in range(world)]
    outs = []
    for d in (dev, torch.device("cpu")):
        o = torch.empty(world * n, device=d)
        dist.all_to_all_single(o, rank_data(rank, world * n, torch.float32).to(d))
        u = torch.empty(sum(recv), 3, device=d)
        dist.all_to_all_single(u, rank_data(rank, sum(send) * 3, torch.float32).view(-1, 3).to(d), recv, send)
        lst = [torch.empty(n, device=d) for _ in range(world)]
        dist.all_to_all(lst, [rank_data(rank * world + k, n, torch.float32).to(d) for k in range(world)])
        outs.append(torch.cat([o.cpu(), u.cpu().flatten()] + [t.cpu() for t in lst]))
    return "equal" if torch.equal(outs[0], outs[1]) else "differs"


def _rank_all(rank, world):
    import torch.distributed as dist

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    _init(rank, world)
    res = {"compare": _compare(rank, world, dev), "ordering": _ordering(rank, world, dev),
           "errors": _errors(rank, world, dev)}
    dist.barrier()
    res["all_to_all"] = _all_to_all(rank, world, dev)
    dist.destroy_process_group()
    return res


@pytest.fixture(scope="module")
def results():
    return run_ranks(_rank_all, WORLD, backend=None, timeout=90)


@needs_cuda
def test_every_op_equals_cpu(results):
    assert all(not r["compare"] for r in results), [r["compare"] for r in results]


@needs_cuda
def test_caller_stream_ordering(results):
    assert all(all(r["ordering"].values()) for r in results), [r["ordering"] for r in results]


@needs_cuda
def test_mismatched_tensors_name_op_and_rank(results):
    for rank, r in enumerate(results):
        e = r["errors"]
        assert f"all_gather on rank {rank}" in e["mixed"] and "mixes CUDA and cpu" in e["mixed"], e
        assert f"reduce_scatter on rank {rank}" in e["mixed_reduce_scatter"], e
        assert "mixes CUDA and cpu" in e["mixed_reduce_scatter"], e
        assert f"all_reduce on rank {rank}" in e["bad_op"], e
        if "two_devices" in e:
            assert f"all_gather_into_tensor on rank {rank}" in e["two_devices"], e
            assert "tensors on cuda:" in e["two_devices"], e
        assert e["after"] is True, e


@needs_cuda
def test_all_to_all(results):
    states = [r["all_to_all"] for r in results]
    assert states == ["equal"] * WORLD, states


def _rank_cpu(rank, world):
    import torch.distributed as dist

    _init(rank, world)
    got = _ops(rank, world, torch.device("cpu"), torch.float32, 4097)
    a2a = _all_to_all(rank, world, torch.device("cpu"))
    dist.destroy_process_group()
    return sorted(got) + [a2a]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CUDA tests above cover this")
def test_cpu_reference_runs_across_hosts():
    res = run_ranks(_rank_cpu, WORLD, backend=None, timeout=120)
    assert all(r == res[0] for r in res) and "isend_irecv_ring" in res[0] and res[0][-1] == "equal", res
