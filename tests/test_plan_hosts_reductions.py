"""The reduction family across hosts (cuda/plan/allreduce_hosts.cpp, reduce_hosts.cpp,
reduce_scatter_hosts.cpp, barrier_hosts.cpp), every rank's plan run at once by the plan
simulator (tests/plan_simulator.py): results against the references of
tests/collective_checks.py, no race, deadlock or stray access, every all_reduce result bitwise the
same on every rank, non-roots of reduce untouched, the choice rule of docs/multihost.md, and the
bytes that cross hosts: the rails form sends each shard across each host boundary the minimum
number of times. Tiny staging slots so that every size runs in many chunks. No processes: the
file runs in seconds."""
from __future__ import annotations

import itertools

import pytest
import torch

from collective_checks import assert_close, make_input
from plan_simulator import (BIG_HOST_LAYOUTS, HOST_LAYOUTS, Simulator, build_plans, expected_outputs, make_blocks,
                            net_steps, run_layout)

LAYOUTS = dict(HOST_LAYOUTS, **{"4x4-interleaved": BIG_HOST_LAYOUTS["4x4-interleaved"]})
EVEN = {name for name, h in LAYOUTS.items() if len(set(h)) > 1 and len({h.count(x) for x in set(h)}) == 1}
DTYPES = [torch.float32, torch.bfloat16, torch.int32]
OPS = ["sum", "avg", "max", "premul", "product"]
SLOT = 96  # bytes: every size below runs in several chunks
BIG = 1 << 40


def elem(dtype):
    return torch.empty(0, dtype=dtype).element_size()


def hosts(host_of):
    return len(set(host_of))


def local_size(host_of):
    return max(host_of.count(h) for h in set(host_of))


def sizes(host_of, dtype, kind):
    """Element counts around the thresholds: fewer than and exactly L, a slot region, a slot, one
    more, several chunks."""
    L, W, e = local_size(host_of), len(host_of), elem(dtype)
    if kind == "reduce_scatter":  # chunks of a slot's region per block
        region = rs_slot(host_of) // W // e
        return [0, 1, region - 1, region, region + 1, 3 * region + 1]
    slot = SLOT // e
    base = {0, 1, L - 1, L, L + 1, slot // L, slot - 1, slot, slot + 1, 3 * slot + 5}
    return sorted(x for x in base if x >= 0)


def rs_slot(host_of):
    """reduce_scatter's slot holds a region per block: 8 bytes each (2 float32, 4 bfloat16)."""
    return 8 * len(host_of)


def cases(host_of, kind):
    """(dtype, op, numel) combinations: every dtype with every op, the sizes spread over them."""
    combos = list(itertools.product(DTYPES, OPS))
    out = []
    for i, (dtype, op) in enumerate(combos):
        ns = sizes(host_of, dtype, kind)
        for j, n in enumerate(ns):
            if (i + j) % 2 == 0 or n in (0, 1):
                out.append((dtype, op, n))
    return out


def inputs_for(kind, host_of, dtype, op, n, case):
    W = len(host_of)
    small = op == "product"
    if kind == "reduce_scatter":
        return [[make_input(r, case * 64 + b, n, dtype, small) for b in range(W)] for r in range(W)]
    return [make_input(r, case, n, dtype, small) for r in range(W)]


def check(kind, outs, inputs, op, root, what, dtype):
    expected = expected_outputs(kind, inputs, op, root)
    for r, exp in enumerate(expected):
        if exp is None:  # a non-root of reduce: its tensor is untouched
            assert torch.equal(outs[r][0].view(torch.uint8), inputs[r].view(torch.uint8)), f"{what}: rank {r} changed"
            continue
        got, want = outs[r][0], exp[0]
        if dtype.is_floating_point and op != "max":
            assert_close(got, want, f"{what} rank {r}")
        else:
            assert torch.equal(got, want), f"{what} rank {r}: {got[:8].tolist()} != {want[:8].tolist()}"


def crossed_bytes(plans, host_of):
    """Bytes every Send moves from one host to another, summed over all ranks' plans."""
    total = 0
    for r, plan in enumerate(plans):
        for s in plan["steps"]:
            if s["kind"] == "send":
                assert host_of[s["peer"]] != host_of[r], f"rank {r} sends to rank {s['peer']} on its own host"
                total += s["bytes"]
    return total


def request(kind, form, **kw):
    req = {"kind": kind, "slot_bytes": SLOT, "leader_max_bytes": BIG if form == "leaders" else 0}
    req.update(kw)
    return req


REDUCTION_CASES = [(kind, name, form) for kind in ("all_reduce", "reduce") for name in LAYOUTS
                   for form in ("leaders", "rails") if form == "leaders" or name in EVEN]


@pytest.mark.parametrize("kind,layout,form", REDUCTION_CASES)
def test_all_reduce_and_reduce(kind, layout, form):
    host_of = LAYOUTS[layout]
    W, H, L = len(host_of), hosts(host_of), local_size(host_of)
    for case, (dtype, op, n) in enumerate(cases(host_of, kind)):
        root = (case * 3 + 1) % W
        inputs = inputs_for(kind, host_of, dtype, op, n, case)
        net = 0 if case % 3 else 2 * elem(dtype)  # sometimes messages of at most two elements
        req = request(kind, form, root=root, elem_size=elem(dtype), bytes=n * elem(dtype), net_chunk_bytes=net)
        what = f"{kind} {layout} {form} {dtype} {op} n={n} root={root} net={net}"
        outs, plans, _ = run_layout(req, host_of, inputs, dtype=dtype, op=op,
                                    order="random" if case % 4 == 1 else "round_robin", seed=case)
        check(kind, outs, inputs, op, root, what, dtype)
        algo = plans[0]["algo"]
        if H == 1:
            assert "/leaders" not in algo and "/rails" not in algo, what
            continue
        rails = form == "rails" and n >= L and n > 0
        assert algo == kind.replace("all_reduce", "allreduce") + ("/rails" if rails else "/leaders"), f"{what}: {algo}"
        if kind == "all_reduce":  # one rank computes each value (or all from the same partials): same bits
            for r in range(1, W):
                assert torch.equal(outs[r][0].view(torch.uint8), outs[0][0].view(torch.uint8)), f"{what}: rank {r}"
        crossed = crossed_bytes(plans, host_of)
        nbytes = n * elem(dtype)
        if kind == "reduce":
            assert crossed == (H - 1) * nbytes, f"{what}: {crossed} bytes crossed"
        elif rails:
            # The hierarchical minimum: each host sends and receives 2(H-1)/H of the payload.
            assert crossed == 2 * (H - 1) * nbytes, f"{what}: {crossed} bytes crossed"
        else:
            assert crossed == H * (H - 1) * nbytes, f"{what}: {crossed} bytes crossed"


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_reduce_scatter(layout):
    host_of = LAYOUTS[layout]
    W, H = len(host_of), hosts(host_of)
    for case, (dtype, op, n) in enumerate(cases(host_of, "reduce_scatter")):
        inputs = inputs_for("reduce_scatter", host_of, dtype, op, n, case)
        net = 0 if case % 3 else 2 * elem(dtype)
        req = request("reduce_scatter", "rails", elem_size=elem(dtype), bytes=n * elem(dtype), net_chunk_bytes=net,
                      slot_bytes=rs_slot(host_of))
        what = f"reduce_scatter {layout} {dtype} {op} n={n} net={net}"
        outs, plans, _ = run_layout(req, host_of, inputs, dtype=dtype, op=op,
                                    order="random" if case % 4 == 1 else "round_robin", seed=case)
        check("reduce_scatter", outs, inputs, op, 0, what, dtype)
        if H > 1:
            assert plans[0]["algo"] == "reduce_scatter/hosts", what
            # Each block's host partial crosses once from every other host to its owner.
            assert crossed_bytes(plans, host_of) == W * (H - 1) * n * elem(dtype), what


@pytest.mark.parametrize("layout", [name for name in LAYOUTS if name != "1host"])
def test_barrier(layout):
    host_of = LAYOUTS[layout]
    W, H = len(host_of), hosts(host_of)
    outs, plans, _ = run_layout({"kind": "barrier"}, host_of, [torch.empty(0)] * W)
    leaders = [min(r for r in range(W) if host_of[r] == h) for h in range(H)]
    for r, plan in enumerate(plans):
        assert plan["algo"] == "barrier/hosts"
        kinds = [s["kind"] for s in plan["steps"]]
        assert kinds[0] == kinds[-1] == "barrier" and kinds.count("barrier") == 2
        assert all(s["scope"] == "host" for s in plan["steps"] if s["kind"] == "barrier")
        sends = [s["peer"] for s in plan["steps"] if s["kind"] == "send"]
        assert sends == ([x for x in leaders if x != r] if r in leaders else []), f"rank {r}: {sends}"
    assert crossed_bytes(plans, host_of) == 0


@pytest.mark.parametrize("layout", ["2x2", "2-1-2", "interleaved", "3x2", "2x4"])
def test_ops_back_to_back(layout):
    """Consecutive ops share the host's staging buffers (double-buffered by a cursor): every
    plan writes only its first buffer before its first barrier and reads only its last after its
    last, so a later op never overwrites what a peer may still read."""
    host_of = LAYOUTS[layout]
    W = len(host_of)
    sim = Simulator(W, SLOT, host_of)
    dtype = torch.float32
    seq = [("all_reduce", "rails", 37), ("reduce_scatter", "rails", 9), ("all_reduce", "leaders", 50),
           ("reduce", "rails", 24), ("barrier", "leaders", 0), ("all_reduce", "leaders", 1),
           ("reduce", "leaders", 61), ("all_reduce", "rails", 24), ("reduce_scatter", "rails", 1)]
    for i, (kind, form, n) in enumerate(seq):
        if kind == "barrier":
            run_layout({"kind": "barrier"}, host_of, [torch.empty(0)] * W, sim=sim)
            continue
        inputs = inputs_for(kind, host_of, dtype, "sum", n, i)
        req = request(kind, form, root=i % W, elem_size=4, bytes=4 * n)
        outs, _, _ = run_layout(req, host_of, inputs, dtype=dtype, op="sum", sim=sim, order="random", seed=i)
        check(kind, outs, inputs, "sum", i % W, f"{kind} #{i}", dtype)


def test_pipeline_keeps_transfers_in_flight():
    """Chunk j's transfers are posted before the host stages and reduces chunk j+1 and waited
    after: between a chunk's sends and their waits there is local work of the next chunk, and
    there is one host barrier per chunk plus two."""
    host_of = LAYOUTS["2x2"]
    n = 3 * SLOT  # float32: 12 chunks of two 12-element shares
    plans = build_plans(request("all_reduce", "rails", elem_size=4, bytes=4 * n, world=4, host_of=host_of))
    steps = plans[0]["steps"]
    chunks = (n + SLOT // 4 - 1) // (SLOT // 4)
    assert sum(s["kind"] == "barrier" for s in steps) == chunks + 2
    first_send = next(i for i, s in enumerate(steps) if s["kind"] == "send")
    first_wait = next(i for i, s in enumerate(steps) if s["kind"] == "wait")
    between = [s["kind"] for s in steps[first_send:first_wait]]
    assert "barrier" in between and "reduce" in between and "send" in between[1:], between


@pytest.mark.parametrize("kind", ["all_reduce", "reduce", "reduce_scatter"])
def test_net_chunk_bytes_bounds_every_message(kind):
    host_of = LAYOUTS["3x2"]
    for form, net in itertools.product(("leaders", "rails"), (8, 20, 64)):
        plans = build_plans(request(kind, form, elem_size=4, bytes=4 * 101, world=6, host_of=host_of,
                                    net_chunk_bytes=net))
        sizes = [s["bytes"] for p in plans for s in p["steps"] if s["kind"] in ("send", "recv")]
        assert sizes and max(sizes) <= net, (kind, form, net, max(sizes))


def test_ops_without_a_builder_across_hosts_throw():
    """buildPlanAcrossHosts names the op it has no builder for (none of these may fall through to
    a single-host plan, whose group barriers the executor refuses across hosts)."""
    from hoccl_backend import _C
    for kind in ("all_gather", "gather", "broadcast", "scatter"):
        try:
            _C.build_plan({"kind": kind, "rank": 0, "world": 4, "host_of": [0, 0, 1, 1], "bytes": 8, "elem_size": 4,
                           "slot_bytes": SLOT})
        except Exception as e:  # noqa: BLE001 - the message is what matters
            assert "no plan across hosts" in str(e), str(e)


@pytest.mark.parametrize("layout", sorted(EVEN))
def test_all_reduce_rails_reading_peers_directly(layout):
    """Large all_reduce on rails where a host's ranks read each other's buffers (host_reads_peers):
    owners reduce their shares from the host's inputs in place and the host copies each share from
    its owner's output; nothing is staged. Same results and bits on every rank, and the same
    messages as the staged plan, so hosts may choose differently: one host direct, the others
    staged, in the same run."""
    host_of = LAYOUTS[layout]
    W = len(host_of)
    for case, (dtype, op, n) in enumerate(cases(host_of, "all_reduce")):
        if n < local_size(host_of):
            continue
        inputs = inputs_for("all_reduce", host_of, dtype, op, n, case)
        net = 0 if case % 3 else 2 * elem(dtype)
        base = request("all_reduce", "rails", elem_size=elem(dtype), bytes=n * elem(dtype), net_chunk_bytes=net,
                       world=W, host_of=host_of)
        direct = build_plans(dict(base, host_reads_peers=True, cross_memory_min_bytes=0))
        staged = build_plans(base)
        what = f"all_reduce direct {layout} {dtype} {op} n={n} net={net}"
        for r in range(W):
            assert net_steps(direct[r]) == net_steps(staged[r]), f"{what}: rank {r}'s messages differ"
            assert direct[r]["buffers_used"] == staged[r]["buffers_used"], what
            locs = [l for s in direct[r]["steps"] for l in [s.get("src"), s.get("dst"), *s.get("srcs", [])] if l]
            assert not any(l["space"] == "slot" for l in locs), f"{what}: rank {r} stages"
        mixed = [direct[r] if host_of[r] == 0 else staged[r] for r in range(W)]
        for plans, how in ((direct, "every host direct"), (mixed, "host 0 direct")):
            ins, outs = make_blocks("all_reduce", W, inputs)
            Simulator(W, SLOT, host_of).run(plans, ins, outs, dtype=dtype, op=op,
                                           order="random" if case % 2 else "round_robin", seed=case)
            check("all_reduce", outs, inputs, op, 0, f"{what} {how}", dtype)
            for r in range(1, W):
                assert torch.equal(outs[r][0].view(torch.uint8), outs[0][0].view(torch.uint8)), f"{what} {how}: rank {r}"
