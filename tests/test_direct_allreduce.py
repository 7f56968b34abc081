"""torch.ops.hoccl.all_reduce_, the direct in-place all_reduce for inference code, on real ranks.

Its results are checked against an independent reference (every rank's input rebuilt from its
seed and reduced in rank order, accumulating 16-bit types in float as hoccl documents) and must
equal ``dist.all_reduce`` on the same group bit for bit: worlds 2 and 3, fp32/bf16/fp16/int32,
sum/avg/max, sizes on both sides of the inline, one-shot, staged-round and direct-read
thresholds, shared and non-contiguous tensors, behind a queued asynchronous op, and inside a
``torch.compile``d function; the same on a group spanning namespaced hosts. Bad input raises
naming the op and the rank.
"""
import pytest
import torch

from dist_utils import run_ranks

SIZES = [1, 7, 1024, 16384 + 3, 65536 // 4 + 1, 131072 + 5, (2 << 20) // 4 + 9]
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32]


def _input(rank, n, dtype, seed):
    g = torch.Generator().manual_seed(seed * 31 + rank)
    if dtype.is_floating_point:
        return torch.randn(n, generator=g).to(dtype)
    return torch.randint(-1000, 1000, (n,), generator=g, dtype=dtype)


def _reference(world, n, dtype, seed, op):
    parts = [_input(r, n, dtype, seed) for r in range(world)]
    acc = parts[0].float() if dtype in (torch.bfloat16, torch.float16) else parts[0].clone()
    for p in parts[1:]:
        p = p.float() if acc.dtype != p.dtype else p
        acc = torch.maximum(acc, p) if op == "max" else acc + p
    if op == "avg":
        acc = acc / world if dtype.is_floating_point else acc // world
    return acc.to(dtype)


def direct_job(rank, world, across_hosts=False):
    """across_hosts: a mismatch breaks the group, so it comes last; float sums follow the hosts
    (each host's partial, then across), so the fp32 cases below expect dist.all_reduce's bits
    (close to the rank-order reference) instead of the rank-order sum's; 16-bit partials are
    rounded to their dtype before they cross, on both multi-host paths: two roundings of up to
    half an ulp of values below 16 each (atol 0.125) against the float-accumulated reference."""
    import torch.distributed as dist

    atol16 = 0.125 if across_hosts else 1e-2

    def summed(n, seed):  # what the fp32 cases below must equal
        ref = _reference(world, n, torch.float32, seed, "sum")
        if not across_hosts:
            return ref
        got = _input(rank, n, torch.float32, seed)
        dist.all_reduce(got)
        assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5), (n, seed)
        return got

    import hoccl_backend
    handle = hoccl_backend.direct_handle()
    assert handle == hoccl_backend.direct_handle()  # stable per group
    mismatches = []
    seed = 0
    for dtype in DTYPES:
        for n in SIZES:
            for op in ("sum", "avg", "max"):
                if op == "avg" and not dtype.is_floating_point:
                    continue
                seed += 1
                x = _input(rank, n, dtype, seed)
                y = x.clone()
                torch.ops.hoccl.all_reduce_(x, handle, op)
                dist.all_reduce(y, op={"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG,
                                       "max": dist.ReduceOp.MAX}[op])
                ref = _reference(world, n, dtype, seed, op)
                same = torch.equal(x, y)
                close = torch.allclose(x.double(), ref.double(), rtol=2e-2 if dtype in (
                    torch.bfloat16, torch.float16) else 1e-5, atol=atol16)
                if not (same and close):
                    mismatches.append((str(dtype), n, op, same, close))
    # a shared tensor and a strided view
    s = hoccl_backend.empty(5000)
    s.copy_(_input(rank, 5000, torch.float32, 999))
    torch.ops.hoccl.all_reduce_(s, handle)
    shared_ok = torch.equal(s, summed(5000, 999))
    base = _input(rank, 2000, torch.float32, 998)
    view = base[::2]
    torch.ops.hoccl.all_reduce_(view, handle)
    strided_ok = torch.equal(view, summed(2000, 998)[::2]) \
        and torch.equal(base[1::2], _input(rank, 2000, torch.float32, 998)[1::2])
    # behind an asynchronous op still queued or running: the direct op waits its turn
    big = _input(rank, (2 << 20) // 4, torch.float32, 996)
    work = dist.all_reduce(big, async_op=True)
    small = _input(rank, 1000, torch.float32, 995)
    torch.ops.hoccl.all_reduce_(small, handle)
    work.wait()
    queued_ok = torch.equal(small, summed(1000, 995)) and torch.equal(big, summed((2 << 20) // 4, 996))
    # traced by torch.compile as an op that mutates its argument
    compiled = torch.compile(lambda t: torch.ops.hoccl.all_reduce_(t, handle) or t * 2,
                             backend="aot_eager", fullgraph=True)
    c = _input(rank, 300, torch.float32, 997)
    out = compiled(c)
    ref = summed(300, 997)
    compile_ok = torch.equal(c, ref) and torch.equal(out, ref * 2)
    return {"mismatches": mismatches, "shared": shared_ok, "strided": strided_ok, "queued": queued_ok,
            "compile": compile_ok, "errors": _errors(rank, world, handle, across_hosts)}


def _errors(rank, world, handle, mismatch_breaks_group):
    """Each error raises; a group spanning hosts stays broken after a mismatch (docs/multihost.md),
    so there the mismatch comes last."""
    import torch.distributed as dist

    import hoccl_backend
    out = {}

    def attempt(name, fn):
        try:
            fn()
            out[name] = None
        except (RuntimeError, ValueError) as exc:
            out[name] = str(exc)
    attempt("bad_handle", lambda: torch.ops.hoccl.all_reduce_(torch.ones(3), 10 ** 9))
    attempt("bad_op", lambda: torch.ops.hoccl.all_reduce_(torch.ones(3), handle, "median"))
    if not mismatch_breaks_group:
        attempt("sizes", lambda: torch.ops.hoccl.all_reduce_(torch.ones(10 + rank), handle))
        dist.barrier()
    gloo = dist.new_group(backend="gloo")
    attempt("gloo_group", lambda: hoccl_backend.direct_handle(gloo))
    sub = dist.new_group(list(range(world)))
    h = hoccl_backend.direct_handle(sub)
    dist.destroy_process_group(sub)
    del sub
    attempt("destroyed", lambda: torch.ops.hoccl.all_reduce_(torch.ones(3), h))
    if mismatch_breaks_group:
        attempt("sizes", lambda: torch.ops.hoccl.all_reduce_(torch.ones(10 + rank), handle))
    return out


def _check(rank, res, refused_group):
    """One rank's results of direct_job; refused_group: what direct_handle says of a gloo group."""
    assert res["mismatches"] == [], (rank, res["mismatches"][:5])
    assert res["shared"] and res["strided"] and res["queued"] and res["compile"], res
    e = res["errors"]
    assert "no hoccl group has handle" in e["bad_handle"]
    assert "unknown op 'median'" in e["bad_op"]
    assert "all_reduce" in e["sizes"] and f"rank {rank}" in e["sizes"], e["sizes"]
    assert refused_group in e["gloo_group"]
    assert e["destroyed"] is not None and ("destroyed" in e["destroyed"]
                                           or "shut down" in e["destroyed"]), e["destroyed"]
    return e


@pytest.mark.parametrize("world", [2, 3])
def test_direct_all_reduce_matches_dist_all_reduce_and_reference(world):
    for rank, res in enumerate(run_ranks(direct_job, world, timeout=240)):
        _check(rank, res, "not a single-host hoccl group")


def test_direct_all_reduce_across_hosts():
    """The same job on 2x2 namespaced hosts: the default group is a multi-host one, whose handle
    runs its all_reduce; every check as on one host, with the references a sum across hosts
    follows (direct_job says how)."""
    from hoccl_backend.testbed.hosts import Hosts

    with Hosts(count=2, ranks=[2, 2]) as hosts:
        for rank, res in enumerate(hosts.run_ranks(direct_job, True, backend="hoccl", pg_timeout=60, timeout=400)):
            e = _check(rank, res, "not a single-host hoccl group nor one spanning hosts")
            assert "disagree across hosts" in e["sizes"], e["sizes"]
