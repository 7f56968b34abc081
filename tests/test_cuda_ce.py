"""GPU tests of the cuda-ce primitives, driven directly (no ProcessGroup): the bounded reduction
kernel and the reference CeGroup collectives, with 2 (and 4: HOCCL_TEST_WORLDS=2,4) ranks sharing
the GPU, on whichever path HOCCL_CE_PATH selects. Skipped, with the reason, without a GPU."""
from __future__ import annotations

import os

import pytest
import torch

from cuda_test_utils import NO_CUDA_REASON, device_for, exact_reduce, rank_data, worlds
from dist_utils import run_ranks

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA_REASON)

FLOAT_OPS = ["sum", "avg", "product", "min", "max", "premul_sum"]
INT_OPS = ["sum", "avg", "product", "min", "max"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64,
          torch.int8, torch.uint8]


def _mod():
    from hoccl_backend import cuda_ext

    return cuda_ext.cuda_module()


def _kernel_or_skip():
    info = _mod().reduce_kernel_info()
    if not info["available"]:
        pytest.skip("this build has no GPU reduction kernel (nvcc absent at build time, or setup.py "
                    "lacks the embed step)")
    return info


@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_kernel_matches_host_semantics(dtype):
    _kernel_or_skip()
    m = _mod()
    n = 100_003  # not a multiple of the CTA width: tail handling
    ops = FLOAT_OPS if dtype.is_floating_point else INT_OPS
    for op in ops:
        for nsrc in (1, 3, 17):  # 17 > HOCCL_REDUCE_MAX_SRCS: chained launches
            srcs = [rank_data(r, n, dtype, op) for r in range(nsrc)]
            dst = torch.empty(n, dtype=dtype, device="cuda")
            gpu_srcs = [s.cuda() for s in srcs]
            m._ce_reduce(dst, gpu_srcs, op, 0.25, nsrc, torch.cuda.current_stream().cuda_stream, 4)
            torch.cuda.synchronize()
            expected = exact_reduce(srcs, op, 0.25)
            assert torch.equal(dst.cpu(), expected), (dtype, op, nsrc)


def test_reduce_kernel_in_place_and_stream_ordered():
    _kernel_or_skip()
    m = _mod()
    a = torch.zeros(1 << 20, device="cuda")
    b = torch.ones(1 << 20, device="cuda")
    torch.cuda._sleep(50_000_000)  # the writes below land late: the kernel must wait for them
    a.fill_(2.0)
    m._ce_reduce(a, [a, b], "sum", 1.0, 2, torch.cuda.current_stream().cuda_stream, 2)
    c = a * 10  # consumer right after, same stream
    torch.cuda.synchronize()
    assert torch.all(c == 30.0)


def _group(rank, world, slot_bytes):
    import torch.distributed as dist

    dev = device_for(rank)
    torch.cuda.set_device(dev)
    store = dist.distributed_c10d._get_default_store()
    return _mod()._CeGroup(store, "cetest", rank, world, dev.index, slot_bytes), dev


def _rank_all_gather(rank, world):
    g, dev = _group(rank, world, 64 << 10)
    stream = torch.cuda.current_stream()
    results = []
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        for n in (1, 1000, 40_000):  # 40_000 floats: several 64 KiB staging chunks
            x = torch.empty(n, dtype=dtype, device=dev)
            out = torch.full((world * n,), -1, dtype=dtype, device=dev)
            torch.cuda._sleep(20_000_000)  # the producer runs late...
            x.copy_(rank_data(rank, n, dtype).to(dev, non_blocking=True))
            g.all_gather(out, x, stream.cuda_stream)
            y = out.clone()  # ...and the consumer runs right after, same stream
            g.synchronize(30)  # a hang in the group raises naming its unsatisfied waits
            torch.cuda.synchronize()
            expected = torch.cat([rank_data(r, n, dtype) for r in range(world)])
            results.append(bool(torch.equal(y.cpu(), expected)))
    return g.paths(), results


def _rank_all_to_all_broadcast(rank, world):
    g, dev = _group(rank, world, 64 << 10)
    stream = torch.cuda.current_stream()
    ok = []
    for n in (1, 3000, 50_000):  # per block; 50_000 floats span several staging rounds
        inp = rank_data(rank, world * n, torch.float32).to(dev)
        out = torch.full((world * n,), -1.0, device=dev)
        torch.cuda._sleep(10_000_000)
        inp.mul_(1.0)  # producer kernel just before
        g.all_to_all(out, inp, stream.cuda_stream)
        y = out.clone()
        g.synchronize(30)  # a hang in the group raises naming its unsatisfied waits
        torch.cuda.synchronize()
        expected = torch.cat([rank_data(r, world * n, torch.float32)[rank * n:(rank + 1) * n] for r in range(world)])
        ok.append(bool(torch.equal(y.cpu(), expected)))
        for root in range(world):
            t = rank_data(rank, n, torch.bfloat16).to(dev)
            g.broadcast(t, root, stream.cuda_stream)
            z = t.clone()
            g.synchronize(30)  # a hang in the group raises naming its unsatisfied waits
            torch.cuda.synchronize()
            ok.append(bool(torch.equal(z.cpu(), rank_data(root, n, torch.bfloat16))))
    return g.paths(), ok


@pytest.mark.parametrize("world", worlds())
def test_ce_group_all_to_all_and_broadcast(world):
    res = run_ranks(_rank_all_to_all_broadcast, world, backend="gloo", timeout=180)
    for paths, ok in res:
        assert all(ok), (paths, ok)


@pytest.mark.parametrize("world", worlds())
def test_ce_group_all_gather(world):
    res = run_ranks(_rank_all_gather, world, backend="gloo", timeout=180)
    for paths, ok in res:
        assert all(ok), (paths, ok)


def _rank_all_reduce(rank, world):
    g, dev = _group(rank, world, 64 << 10)
    stream = torch.cuda.current_stream()
    bad = []
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32):
        ops = FLOAT_OPS if dtype.is_floating_point else INT_OPS
        for op in ops:
            for n in (7, 50_000):
                t = rank_data(rank, n, dtype, op).to(dev)
                torch.cuda._sleep(10_000_000)
                t.add_(0)  # a kernel writes the input just before the collective
                g.all_reduce(t, op, 0.5, stream.cuda_stream)
                y = t.clone()
                g.synchronize(30)  # a hang in the group raises naming its unsatisfied waits
                torch.cuda.synchronize()
                expected = exact_reduce([rank_data(r, n, dtype, op) for r in range(world)], op, 0.5)
                if not torch.equal(y.cpu(), expected):
                    bad.append((str(dtype), op, n))
    return bad


@pytest.mark.parametrize("reduce_on", ["host", "gpu"])
@pytest.mark.parametrize("world", worlds())
def test_ce_group_all_reduce(world, reduce_on):
    if reduce_on == "gpu":
        _kernel_or_skip()
    res = run_ranks(_rank_all_reduce, world, backend="gloo", timeout=300, env={"HOCCL_REDUCE_ON": reduce_on})
    assert all(not bad for bad in res), res


def _rank_capture(rank, world):
    g, dev = _group(rank, world, 1 << 20)
    x = torch.full((256,), float(rank), device=dev)
    out = torch.empty(256 * world, device=dev)
    side = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, stream=side):
            g.all_gather(out, x, side.cuda_stream)
    except RuntimeError as e:
        return str(e)
    return "captured"


def test_ce_group_refuses_graph_capture_clearly():
    res = run_ranks(_rank_capture, 2, backend="gloo", timeout=120)
    for msg in res:
        assert "graph capture is not supported" in msg, msg
