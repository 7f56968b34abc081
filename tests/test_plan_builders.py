"""Every plan builder, run for all ranks at once by the plan simulator (tests/plan_simulator.py):
the plans `_C.build_plan` returns must deliver the independent references of
tests/collective_checks.py on every rank, with no race, deadlock or stray access. Staging slots
are tiny (64 .. 4096 bytes) so that every size runs in many chunks; the sizes sit on either side
of each chunking threshold. Then hand-made plans show that the simulator rejects each kind of
broken plan (missing barrier, early overwrite, size mismatch, unwaited transfer, deadlock, ...),
and a hand-made plan across two hosts shows Send/Recv/Wait, Scratch and host barriers running.
No processes: the whole file runs in seconds."""
from __future__ import annotations

import copy
import random

import pytest
import torch

from collective_checks import assert_close, make_input
from plan_simulator import (SimulationError, Simulator, build_plans, expected_outputs, make_blocks, run_layout,
                            simulate)

WORLDS = [1, 2, 3, 4, 5, 8]
DTYPES = [torch.float32, torch.bfloat16, torch.int32]
SLOTS = [64, 4096]
BIG = 1 << 40
FLOAT_OPS = ["sum", "avg", "premul", "product", "min", "max"]
INT_OPS = FLOAT_OPS + ["band", "bor", "bxor"]
# Reductions a float result of which is exact (the same bits as the reference's).
EXACT_OPS = {"min", "max"}


def elem(dtype):
    return torch.empty(0, dtype=dtype).element_size()


def chunk_elems(kind: str, slot: int, world: int, dtype) -> int:
    """Elements per staging round: a slot, or for scatter / reduce_scatter a slot's part per rank."""
    e = max(1, slot // elem(dtype))
    return max(1, e // world) if kind in ("scatter", "reduce_scatter") else e


def sizes_for(kind: str, slot: int, world: int, dtype) -> list[int]:
    """Element counts around the thresholds: a staging round (one less, exactly, one more, two
    and a bit), and the world size (all_reduce's balanced parts: some empty below it)."""
    c = chunk_elems(kind, slot, world, dtype)
    return sorted({0, 1, world - 1, world + 1, c - 1, c, c + 1, 2 * c + 3} - {-1})


def check_outputs(kind, outs, inputs, op, root, what, dtype):
    expected = expected_outputs(kind, inputs, op, root)
    reduces = kind in ("all_reduce", "reduce", "reduce_scatter")
    for r, exp in enumerate(expected):
        if exp is None:
            continue
        assert len(outs[r]) == len(exp), f"{what}: rank {r} has {len(outs[r])} blocks"
        for b, (got, want) in enumerate(zip(outs[r], exp)):
            label = f"{what} rank {r} block {b}"
            if reduces and dtype.is_floating_point and op not in EXACT_OPS:
                assert_close(got, want, label)  # tolerance of collective_checks.TOL
            else:
                assert torch.equal(got, want), f"{label}: {got[:8].tolist()} != {want[:8].tolist()}"
    if kind == "all_reduce":  # every rank computes the same bits (rank-order reduction)
        for r in range(1, len(outs)):
            assert torch.equal(outs[r][0].view(torch.uint8), outs[0][0].view(torch.uint8)), f"{what}: rank {r} differs"


def inputs_for(kind, world, n, dtype, case, small=False, root=0):
    if kind in ("scatter", "reduce_scatter"):
        return [[make_input(r, case * 64 + b, n, dtype, small) for b in range(world)]
                if kind == "reduce_scatter" or r == root else None for r in range(world)]
    return [make_input(r, case, n, dtype, small) for r in range(world)]


# Request variants: (name, op kind, extra request fields, expected algo prefix or None).
STAGED = dict(cross_memory=False)
DIRECT = dict(cross_memory=True, cross_memory_min_bytes=0, all_reduce_direct_read_max_bytes=BIG)
VARIANTS = [
    ("all_reduce/one-shot", "all_reduce", dict(STAGED, one_shot_max_bytes=BIG), "allreduce/one-shot"),
    ("all_reduce/rs-ag", "all_reduce", dict(STAGED, one_shot_max_bytes=0), None),  # world 1: one-shot
    ("all_reduce/threshold", "all_reduce", dict(STAGED, one_shot_max_bytes=100), None),
    ("all_gather", "all_gather", STAGED, "allgather/staged"),
    ("gather", "gather", STAGED, "gather/staged"),
    ("broadcast", "broadcast", STAGED, "broadcast/staged"),
    ("scatter", "scatter", STAGED, "scatter/staged"),
    ("reduce", "reduce", STAGED, "reduce/staged"),
    ("reduce_scatter", "reduce_scatter", STAGED, "reduce_scatter/staged"),
    # Direct reads of peers' blocks (cross-memory), with their own address-publishing barrier...
    ("all_reduce/direct", "all_reduce", DIRECT, "all_reduce/direct-read"),
    ("all_gather/direct", "all_gather", DIRECT, "all_gather/direct-read"),
    ("gather/direct", "gather", DIRECT, "gather/direct-read"),
    ("broadcast/direct", "broadcast", DIRECT, "broadcast/direct-read"),
    ("scatter/direct", "scatter", DIRECT, "scatter/direct-read"),
    ("reduce/direct", "reduce", DIRECT, "reduce/direct-read"),
    ("reduce_scatter/direct", "reduce_scatter", DIRECT, "reduce_scatter/direct-read"),
    # ... or after a barrier plan that published them (all_reduce past the direct-read limit on
    # shared tensors; the backend runs that barrier plan first).
    ("all_reduce/published-shared", "all_reduce",
     dict(cross_memory=True, cross_memory_min_bytes=0, all_reduce_direct_read_max_bytes=0,
          every_tensor_shared=True, addresses_published=True), "all_reduce/direct-read"),
    ("all_reduce/published-staged", "all_reduce",
     dict(cross_memory=True, cross_memory_min_bytes=0, all_reduce_direct_read_max_bytes=0,
          every_tensor_shared=False, addresses_published=True, one_shot_max_bytes=0), None),
    # Cross-memory on, but below its threshold: staged.
    ("reduce_scatter/below-min", "reduce_scatter", dict(cross_memory=True, cross_memory_min_bytes=BIG),
     "reduce_scatter/staged"),
]
ROOTED = ("gather", "broadcast", "scatter", "reduce")


def roots_for(kind, world):
    return sorted({0, world - 1, world // 2}) if kind in ROOTED else [0]


def run_case(kind, extra, expect_algo, world, dtype, slot, n, op, root, case, order="round_robin", seed=0):
    small = op == "product"
    inputs = inputs_for(kind, world, n, dtype, case, small, root)
    req = dict(extra, kind=kind, bytes=n * elem(dtype), elem_size=elem(dtype), slot_bytes=slot, root=root)
    what = f"{kind} {extra} world={world} {dtype} slot={slot} n={n} op={op} root={root} order={order}"
    try:
        outs, plans, _ = run_layout(req, None, inputs, dtype=dtype, op=op, order=order, seed=seed)
    except SimulationError as e:
        raise AssertionError(f"{what}: {e}") from None
    if expect_algo and world > 1:
        algo = (plans[0][-1] if isinstance(plans[0], list) else plans[0])["algo"]
        assert algo == expect_algo, f"{what}: built {algo}, expected {expect_algo}"
    check_outputs(kind, outs, inputs, op, root, what, dtype)


def cases_for(kind, world):
    """(dtype, slot, elements, op, root) to run: float32 through every size around the
    thresholds of both slot sizes (the rooted ops cycling through first, middle and last root);
    bfloat16 and int32 through a few sizes; every reduce op of each dtype at a size of two chunks
    and a bit."""
    reduces = kind in ("all_reduce", "reduce", "reduce_scatter")
    roots = roots_for(kind, world)
    cases = []
    for dtype in DTYPES:
        for slot in SLOTS:
            sizes = sizes_for(kind, slot, world, dtype)
            if dtype != torch.float32 or slot != SLOTS[0]:
                sizes = sizes[1::3] if slot == SLOTS[0] else sizes[-2:-1]
            cases += [(dtype, slot, n, "sum", roots[i % len(roots)]) for i, n in enumerate(sizes)]
        if reduces:
            ops = FLOAT_OPS if dtype.is_floating_point else INT_OPS
            c = chunk_elems(kind, SLOTS[0], world, dtype)
            cases += [(dtype, SLOTS[0], 2 * c + 3, op, roots[-1]) for op in ops[1:]]
    return cases


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("variant", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_builder_delivers_references(variant, world):
    """The variant's plans for every case of cases_for, against the references."""
    _, kind, extra, expect_algo = variant
    for case, (dtype, slot, n, op, root) in enumerate(cases_for(kind, world)):
        run_case(kind, extra, expect_algo, world, dtype, slot, n, op, root, case)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v[0] in ("all_reduce/rs-ag", "scatter",
                                                                        "reduce_scatter", "all_gather/direct")],
                         ids=lambda v: v[0])
def test_builder_in_random_orders(variant):
    """The same results however the ranks interleave (seeded random schedules)."""
    _, kind, extra, expect_algo = variant
    for seed in range(6):
        world = [2, 3, 5][seed % 3]
        run_case(kind, extra, expect_algo, world, torch.float32, 64, 53, "sum", world - 1, 900 + seed,
                 order="random", seed=seed)


# ---------------------------------------------------------------------------------------------
# all_to_all: schedules of phases


def schedule(name: str, m: list[list[int]]) -> list[list[tuple[int, int, int]]]:
    """Phases (src, dst, bytes) for split matrix m (bytes): "direct" (self copies, then every
    pair at once, as the backend's default), "pairwise" (self, then s -> s+k), "split" (every
    pair in two parts, the second half in reverse pairwise order: a pair continues where its
    first part stopped), "one" (everything in one phase, self copies included)."""
    W = len(m)
    if name == "one":
        return [[(s, d, m[s][d]) for s in range(W) for d in range(W)]]
    self_phase = [(r, r, m[r][r]) for r in range(W)]
    if name == "direct":
        return [self_phase, [(s, d, m[s][d]) for s in range(W) for d in range(W) if s != d]]
    if name == "pairwise":
        return [self_phase] + [[(s, (s + k) % W, m[s][(s + k) % W]) for s in range(W)] for k in range(1, W)]
    if name == "split":
        first = [[(s, (s + k) % W, m[s][(s + k) % W] // 2) for s in range(W)] for k in range(1, W)]
        second = [[(s, (s + k) % W, m[s][(s + k) % W] - m[s][(s + k) % W] // 2) for s in range(W)]
                  for k in reversed(range(1, W))]
        return [self_phase] + first + second
    raise ValueError(name)


def split_matrix(shape: str, world: int, unit: int, rng: random.Random) -> list[list[int]]:
    if shape == "even":
        return [[3 * unit] * world for _ in range(world)]
    if shape == "zeros":
        return [[0 if (s + d) % 3 == 0 else 5 * unit for d in range(world)] for s in range(world)]
    return [[rng.randrange(0, 40) * unit for _ in range(world)] for _ in range(world)]  # uneven


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("direct", [False, True], ids=["staged", "direct-read"])
def test_all_to_all_phases(world, direct):
    """Every schedule x split shape in float32 through 64-byte slots (a pair's bytes spread
    over many rounds and phases), and the other dtypes on a few; staged and direct-read."""
    rng = random.Random(world)
    combos = [(torch.float32, sched, shape, 64) for sched in ("direct", "pairwise", "split", "one")
              for shape in ("even", "zeros", "uneven")]
    combos += [(dtype, "direct", "uneven", 4096) for dtype in DTYPES]
    combos += [(torch.bfloat16, "split", "uneven", 64), (torch.int32, "pairwise", "zeros", 64)]
    for case, (dtype, sched, shape, slot) in enumerate(combos, 5000):
        es = elem(dtype)
        m = split_matrix(shape, world, es, rng)
        inputs = [[make_input(s, case * 64 + d, m[s][d] // es, dtype) for d in range(world)] for s in range(world)]
        total = sum(map(sum, m))
        req = dict(kind="all_to_all", elem_size=1, bytes=total // world, slot_bytes=slot,
                   phases=schedule(sched, m), cross_memory=direct, cross_memory_min_bytes=0)
        what = f"all_to_all world={world} {dtype} {sched} {shape} slot={slot}"
        try:
            outs, plans, _ = run_layout(req, None, inputs, dtype=dtype)
        except SimulationError as e:
            raise AssertionError(f"{what}: {e}") from None
        if world > 1:
            assert plans[0]["algo"] == ("alltoall/direct-read" if direct else "alltoall/phased"), what
        check_outputs("all_to_all", outs, inputs, "sum", 0, what, dtype)


# ---------------------------------------------------------------------------------------------
# Layouts the backend also runs: outputs that alias inputs, and several ops in a row


def test_outputs_aliasing_inputs():
    """all_gather / gather from the own slice of the output, reduce_scatter into the own slice
    of the input, scatter into the root's own input block: the plans stay correct and race-free
    when the blocks share memory."""
    for world in (1, 2, 3, 5):
        for extra in (STAGED, DIRECT):
            for slot in (64, 4096):
                n = 37
                dtype = torch.float32
                base = dict(extra, elem_size=4, bytes=n * 4, slot_bytes=slot)
                for kind in ("all_gather", "gather"):
                    inputs = [make_input(r, 77, n, dtype) for r in range(world)]
                    ins, outs = make_blocks(kind, world, inputs, root=0)
                    for r in range(world):
                        if outs[r][r] is not None:
                            outs[r][r].copy_(ins[r][0])
                            ins[r][0] = outs[r][r]
                    plans = build_plans(dict(base, kind=kind, world=world))
                    simulate(plans, ins, outs, slot_bytes=slot, dtype=dtype)
                    check_outputs(kind, outs, inputs, "sum", 0, f"{kind} aliased world={world}", dtype)
                inputs = inputs_for("reduce_scatter", world, n, dtype, 78)
                ins, outs = make_blocks("reduce_scatter", world, inputs)
                for r in range(world):
                    outs[r][0] = ins[r][r]
                plans = build_plans(dict(base, kind="reduce_scatter", world=world))
                simulate(plans, ins, outs, slot_bytes=slot, dtype=dtype)
                check_outputs("reduce_scatter", outs, inputs, "sum", 0, f"reduce_scatter aliased world={world}", dtype)
                inputs = inputs_for("scatter", world, n, dtype, 79, root=0)
                ins, outs = make_blocks("scatter", world, inputs, root=0)
                outs[0][0] = ins[0][0]
                plans = build_plans(dict(base, kind="scatter", world=world))
                simulate(plans, ins, outs, slot_bytes=slot, dtype=dtype)
                check_outputs("scatter", outs, inputs, "sum", 0, f"scatter aliased world={world}", dtype)


def test_ops_in_a_row_share_the_slots():
    """One Simulator, many ops: the slot cursor carries over (an odd buffers_used flips the
    parity), and no op overwrites a slot an earlier op's reader may still read."""
    world, slot, dtype = 4, 64, torch.int32
    sim = Simulator(world, slot)
    case = 0
    for n in (5, 16, 17, 40, 3):
        for kind in ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "scatter", "reduce", "gather"):
            case += 1
            inputs = inputs_for(kind, world, n, dtype, 3000 + case, root=1)
            req = dict(STAGED, kind=kind, bytes=n * 4, elem_size=4, slot_bytes=slot, root=1, one_shot_max_bytes=32)
            outs, _, _ = run_layout(req, None, inputs, sim=sim)
            check_outputs(kind, outs, inputs, "sum", 1, f"{kind} n={n} in a row", dtype)
    assert sim.cursors[0] > 0


@pytest.mark.parametrize("host_of", [[0, 0, 1, 2, 2], [0, 0, 0, 1]], ids=["2-1-2", "3-1"])
def test_ops_across_hosts_in_a_row_share_each_hosts_slots(host_of):
    """The same across hosts: each host's slots have their own cursor, advanced by what that
    host's plans used (hosts hand off different numbers of pieces), and no op overwrites a slot
    an earlier op's reader on that host may still read."""
    world, slot, dtype = len(host_of), 64, torch.int32
    sim = Simulator(world, slot, host_of)
    case = 0
    for n in (5, 17, 40):
        for kind in CROSS_HOST_KINDS:
            for root in (0, world - 1):
                case += 1
                inputs = inputs_for(kind, world, n, dtype, 5000 + case, root=root)
                req = dict(kind=kind, bytes=n * 4, elem_size=4, slot_bytes=slot, root=root, net_chunk_bytes=24)
                outs, _, _ = run_layout(req, host_of, inputs, sim=sim, order="random", seed=case)
                check_outputs(kind, outs, inputs, "sum", root, f"{kind} n={n} root={root} {host_of}", dtype)
    assert len(set(sim.cursors)) > 1, sim.cursors


# ---------------------------------------------------------------------------------------------
# The binding


def test_build_plan_binding():
    from hoccl_backend import _C

    p = _C.build_plan({"kind": "all_reduce", "rank": 1, "world": 3, "elem_size": 4, "bytes": 40, "slot_bytes": 16})
    assert set(p) == {"algo", "buffers_used", "scratch_bytes", "transfers", "steps"}
    assert p["algo"] == "allreduce/rs-ag" and p["buffers_used"] == 3 and p["transfers"] == 0
    # Chunks of 4 floats; rank 1 reduces element 1 of each, so it stages elements 0 and 2-3 only.
    assert p["steps"][0] == {"kind": "copy", "bytes": 4, "dst": {"space": "slot", "index": 1, "buf": 0, "offset": 0},
                             "src": {"space": "in", "index": 0, "buf": 0, "offset": 0}}
    assert p["steps"][1] == {"kind": "copy", "bytes": 8, "dst": {"space": "slot", "index": 1, "buf": 0, "offset": 8},
                             "src": {"space": "in", "index": 0, "buf": 0, "offset": 8}}
    assert p["steps"][2] == {"kind": "barrier", "scope": "group"}
    red = p["steps"][3]
    assert red["kind"] == "reduce" and red["count"] == 1 and red["finalize"] is True and len(red["srcs"]) == 3
    assert red["srcs"][1] == {"space": "in", "index": 0, "buf": 0, "offset": 4}
    with pytest.raises(ValueError, match="bogus"):
        _C.build_plan({"kind": "all_reduce", "bogus": 1})
    with pytest.raises(ValueError, match="kind"):
        _C.build_plan({"kind": "all_reduce_x"})
    with pytest.raises(ValueError, match="host_of"):
        _C.build_plan({"kind": "all_reduce", "world": 2, "host_of": [0]})
    a2a = _C.build_plan({"kind": "all_to_all", "world": 2, "rank": 0, "slot_bytes": 8,
                         "phases": [[(0, 1, 4), (1, 0, 4)]], "cross_memory": True, "cross_memory_min_bytes": 0})
    assert a2a["algo"] == "alltoall/direct-read"
    assert {"space": "peer_in", "index": 0, "buf": 1, "offset": 0} in [s.get("src") for s in a2a["steps"]]
    text = _C.describe_plan("all_reduce", 0, 2, 100)  # the older binding still works
    assert text.startswith("plan allreduce/one-shot")
    assert _C.describe_plan_request({"kind": "all_reduce", "world": 2, "bytes": 100, "elem_size": 4,
                                     "slot_bytes": 4 << 20, "one_shot_max_bytes": 64 << 10}) == text


# ---------------------------------------------------------------------------------------------
# Cross-host: a hand-made plan, and the real builders once they exist


def L(space, index=0, buf=0, offset=0):
    return {"space": space, "index": index, "buf": buf, "offset": offset}


class HandPlan:
    """Builds plan dicts the way Plan does (transfer and message numbering)."""

    def __init__(self, algo="hand"):
        self.p = {"algo": algo, "buffers_used": 0, "scratch_bytes": 0, "transfers": 0, "steps": []}
        self.sent, self.received = {}, {}

    def copy(self, dst, src, n):
        self.p["steps"].append({"kind": "copy", "dst": dst, "src": src, "bytes": n})

    def reduce(self, dst, srcs, count, finalize=True):
        self.p["steps"].append({"kind": "reduce", "dst": dst, "srcs": srcs, "count": count, "finalize": finalize})

    def barrier(self, scope="group"):
        self.p["steps"].append({"kind": "barrier", "scope": scope})

    def _post(self, kind, peer, loc, n, counts):
        t = self.p["transfers"]
        self.p["transfers"] += 1
        m = counts.get(peer, 0)
        counts[peer] = m + 1
        self.p["steps"].append({"kind": kind, "peer": peer, "bytes": n, "transfer": t, "message": m,
                                ("src" if kind == "send" else "dst"): loc})
        return t

    def send(self, peer, src, n):
        return self._post("send", peer, src, n, self.sent)

    def recv(self, peer, dst, n):
        return self._post("recv", peer, dst, n, self.received)

    def wait(self, t):
        self.p["steps"].append({"kind": "wait", "transfer": t})

    def scratch(self, n):
        at = (self.p["scratch_bytes"] + 7) // 8 * 8
        self.p["scratch_bytes"] = at + n
        return at


def hier_all_reduce(rank, host_of, n, es, order_sends_first=True):
    """A two-level all_reduce across hosts: the host's ranks stage into slots, the leader (lowest
    rank of a host) reduces them, leaders exchange their partial sums (sends posted before recvs,
    each into its own Scratch), every leader reduces the partials in host order, stages the
    result, a host barrier, everyone copies it out."""
    hosts = max(host_of) + 1
    mine = [r for r in range(len(host_of)) if host_of[r] == host_of[rank]]
    leaders = [min(r for r in range(len(host_of)) if host_of[r] == h) for h in range(hosts)]
    nb = n * es
    h = HandPlan("allreduce/hier-hand")
    h.p["buffers_used"] = 2
    h.copy(L("slot", rank, 0), L("in"), nb)
    h.barrier("host")
    if rank == mine[0]:
        part = h.scratch(nb)
        h.reduce(L("scratch", offset=part), [L("slot", r, 0) for r in mine], n, finalize=False)
        got = {host_of[rank]: part}
        ts = []
        posts = []
        for other in leaders:
            if other != rank:
                posts.append(("send", other))
        for other in leaders:
            if other != rank:
                posts.append(("recv", other))
        if not order_sends_first:
            posts.reverse()
        for kind, other in posts:
            if kind == "send":
                ts.append(h.send(other, L("scratch", offset=part), nb))
            else:
                got[host_of[other]] = h.scratch(nb)
                ts.append(h.recv(other, L("scratch", offset=got[host_of[other]]), nb))
        for t in ts:
            h.wait(t)
        h.reduce(L("slot", rank, 1), [L("scratch", offset=got[x]) for x in range(hosts)], n, finalize=True)
    h.barrier("host")
    h.copy(L("out"), L("slot", mine[0], 1), nb)
    h.barrier("host")  # nobody reuses the leader's slot before every reader is done
    return h.p


@pytest.mark.parametrize("host_of", [[0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 0, 1, 2, 2], [0, 1]])
def test_hand_made_plan_across_hosts(host_of):
    world = len(host_of)
    for dtype in DTYPES:
        for op in ("sum", "avg", "max"):
            n = 13
            inputs = [make_input(r, 4242, n, dtype) for r in range(world)]
            plans = [hier_all_reduce(r, host_of, n, elem(dtype)) for r in range(world)]
            ins, outs = make_blocks("all_reduce", world, inputs)
            for order, seed in (("round_robin", 0), ("random", 1), ("random", 2)):
                ins, outs = make_blocks("all_reduce", world, inputs)
                stats = simulate(plans, ins, outs, slot_bytes=64, host_of=host_of, dtype=dtype, op=op, order=order,
                                 seed=seed)
                assert stats["messages"] > 0
                # Partial sums per host, then across hosts: not rank order, so compare with tolerance.
                for r in range(world):
                    assert_close(outs[r][0], expected_outputs("all_reduce", inputs, op)[r][0],
                                 f"hier all_reduce {host_of} {dtype} {op} rank {r}")


def test_rendezvous_send_wait_deadlocks_when_every_leader_waits_its_send_first():
    """Each leader posts and waits its send before posting its recv: with a transport that does
    not buffer (rendezvous), nobody's send completes. The simulator treats sends as rendezvous."""
    host_of = [0, 1]
    plans = []
    for r in range(2):
        h = HandPlan()
        t = h.send(1 - r, L("in"), 4)
        h.wait(t)
        t = h.recv(1 - r, L("out"), 4)
        h.wait(t)
        plans.append(h.p)
    ins, outs = make_blocks("all_gather", 2, [torch.ones(1), torch.ones(1)])
    outs = [[o[0]] for o in outs]
    with pytest.raises(SimulationError, match=r"deadlock(.|\n)*rank 0: plan hand, step 1 wait #0: the matching recv"):
        simulate(plans, ins, outs, slot_bytes=64, host_of=host_of)


CROSS_HOST_LAYOUTS = [[0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 0, 1, 1], [0, 1, 2], [0, 0, 1, 1, 2, 2, 3, 3]]
CROSS_HOST_KINDS = ["all_reduce", "all_gather", "gather", "broadcast", "scatter", "reduce", "reduce_scatter"]


@pytest.mark.parametrize("host_of", CROSS_HOST_LAYOUTS, ids=lambda h: "".join(map(str, h)))
@pytest.mark.parametrize("kind", CROSS_HOST_KINDS)
def test_cross_host_builders(kind, host_of):
    """buildPlan with a host_of of several hosts, checked like the single-host builders. Skipped
    for an op whose builder does not plan across hosts yet (its plans use group barriers only)."""
    world = len(host_of)
    probe = build_plans(dict(kind=kind, world=world, host_of=host_of, bytes=64, elem_size=4, slot_bytes=64))
    if all(s["kind"] != "send" and s.get("scope", "group") == "group" for p in probe for s in p["steps"]):
        pytest.skip(f"no builder across hosts for {kind} yet")
    for dtype in (torch.float32, torch.int32):
        for n in (0, 1, 7, 16, 17, 45):
            for root in roots_for(kind, world):
                for extra in (dict(leader_max_bytes=0, net_chunk_bytes=0), dict(leader_max_bytes=BIG, net_chunk_bytes=24)):
                    inputs = inputs_for(kind, world, n, dtype, 7000 + n, root=root)
                    req = dict(extra, kind=kind, bytes=n * 4, elem_size=4, slot_bytes=64, root=root)
                    what = f"{kind} host_of={host_of} {dtype} n={n} root={root} {extra}"
                    try:
                        outs, _, _ = run_layout(req, host_of, inputs, dtype=dtype)
                    except SimulationError as e:
                        raise AssertionError(f"{what}: {e}") from None
                    check_outputs(kind, outs, inputs, "sum", root, what, dtype)


# ---------------------------------------------------------------------------------------------
# The simulator rejects broken plans


@pytest.mark.parametrize("world", [2, 3])
def test_every_barrier_of_every_builder_is_needed(world):
    """Removing any one barrier (on every rank) from any builder's plan is caught: each barrier
    orders some slot or block access, and the simulator sees which."""
    for name, kind, extra, _ in VARIANTS:
        n = 2 * chunk_elems(kind, 64, world, torch.float32) + 3
        inputs = inputs_for(kind, world, n, torch.float32, 1, root=1)
        plans = build_plans(dict(extra, kind=kind, bytes=n * 4, elem_size=4, slot_bytes=64, root=1, world=world))
        publish = build_plans({"kind": "barrier", "world": world}) if extra.get("addresses_published") else None
        barriers = [i for i, s in enumerate(plans[0]["steps"]) if s["kind"] == "barrier"]
        # Every rank has as many barriers (the k-th meets the k-th; rs-ag stages a different
        # number of pieces per rank before each, so their step indices may differ).
        assert all(sum(s["kind"] == "barrier" for s in p["steps"]) == len(barriers) or kind in ROOTED
                   for p in plans)
        for k in range(len(barriers)):
            broken = copy.deepcopy(plans)
            for p in broken:
                del p["steps"][[i for i, s in enumerate(p["steps"]) if s["kind"] == "barrier"][k]]
            ins, outs = make_blocks(kind, world, inputs, root=1)
            with pytest.raises(SimulationError):
                simulate([[b, p] for b, p in zip(publish, broken)] if publish else broken, ins, outs, slot_bytes=64,
                         dtype=torch.float32)
                pytest.fail(f"{name} world={world}: its plans run without barrier {k}")



def staged_broadcast(world=3, n=10, slot=16):
    inputs = [make_input(r, 1, n, torch.float32) for r in range(world)]
    plans = build_plans(dict(kind="broadcast", world=world, bytes=n * 4, elem_size=4, slot_bytes=slot))
    return plans, inputs


def run_broken(kind, plans, inputs, orders=(("round_robin", 0), ("random", 1), ("random", 2), ("random", 3)),
               host_of=None, slot=16, match=None):
    """The broken plans must fail in every order."""
    for order, seed in orders:
        ins, outs = make_blocks(kind, len(plans), inputs)
        with pytest.raises(SimulationError, match=match):
            simulate(copy.deepcopy(plans), ins, outs, slot_bytes=slot, host_of=host_of, dtype=torch.float32,
                     order=order, seed=seed)


def test_rejects_missing_barrier():
    plans, inputs = staged_broadcast()
    for p in plans:
        steps = p["steps"]
        del steps[[s["kind"] for s in steps].index("barrier", 2)]  # the second chunk's barrier
    run_broken("broadcast", plans, inputs, match="no barrier or message ordering that write before this read|"
                                                 "holds no data of this op|may still be reading")


def test_rejects_reading_a_slot_before_its_barrier():
    plans, inputs = staged_broadcast()
    for r, p in enumerate(plans):
        if r != 0:  # readers copy out before the barrier; the root still stages first
            steps = p["steps"]
            i = [s["kind"] for s in steps].index("barrier")
            steps[i], steps[i + 1] = steps[i + 1], steps[i]
    run_broken("broadcast", plans, inputs, match="no barrier or message ordering|holds no data")


def test_rejects_overwriting_a_slot_peers_may_still_read():
    """Both chunks through slot buffer 0: the root restages before the readers passed a barrier
    after reading the first chunk."""
    plans, inputs = staged_broadcast(n=8, slot=16)
    for p in plans:
        for s in p["steps"]:
            for key in ("src", "dst"):
                if s.get(key, {}).get("space") == "slot":
                    s[key]["buf"] = 0
    run_broken("broadcast", plans, inputs, match="may still be reading|no barrier or message ordering")


def test_rejects_a_slot_buffer_reused_by_the_next_op_too_early():
    """Op 1 stages through one buffer; op 2 claims two and writes its second (the physical buffer
    op 1's readers may still read) before any barrier."""
    world, n, slot = 2, 4, 16
    inputs = [make_input(r, 1, n, torch.float32) for r in range(world)]
    sim = Simulator(world, slot)
    plans = build_plans(dict(kind="broadcast", world=world, bytes=n * 4, elem_size=4, slot_bytes=slot))
    ins, outs = make_blocks("broadcast", world, inputs)
    sim.run(plans, ins, outs, dtype=torch.float32)
    bad = []
    for r in range(world):
        h = HandPlan()
        h.p["buffers_used"] = 2
        if r == 0:
            h.copy(L("slot", 0, 1), L("in"), 16)
        h.barrier()
        bad.append(h.p)
    ins, outs = make_blocks("broadcast", world, inputs)
    # Rank 1 read rank 0's slot in op 1 after op 1's only barrier; nothing since orders its read
    # before this write.
    with pytest.raises(SimulationError, match="rank 1 read .* may still be reading"):
        sim.run(bad, ins, outs, dtype=torch.float32)


def test_rejects_reading_what_an_earlier_op_left_in_a_slot():
    world, n, slot = 2, 4, 16
    inputs = [make_input(r, 1, n, torch.float32) for r in range(world)]
    sim = Simulator(world, slot)
    plans = build_plans(dict(kind="broadcast", world=world, bytes=n * 4, elem_size=4, slot_bytes=slot))
    ins, outs = make_blocks("broadcast", world, inputs)
    sim.run(plans, ins, outs, dtype=torch.float32)  # leaves rank 0's data in its slot, buffer 0
    stale = []
    for r in range(world):
        h = HandPlan()
        h.p["buffers_used"] = 2
        h.barrier()
        if r == 1:
            h.copy(L("out"), L("slot", 0, 1), 16)  # cursor 1 + buffer 1: physical buffer 0
        stale.append(h.p)
    ins, outs = make_blocks("broadcast", world, inputs)
    with pytest.raises(SimulationError, match="slot of rank 0 .*holds no data of this op"):
        sim.run(stale, ins, outs, dtype=torch.float32)


def test_rejects_a_direct_read_plan_without_its_final_barrier():
    world, n = 3, 6
    inputs = [make_input(r, 1, n, torch.float32) for r in range(world)]
    plans = build_plans(dict(DIRECT, kind="all_gather", world=world, bytes=n * 4, elem_size=4, slot_bytes=64))
    for p in plans:
        assert p["steps"][-1]["kind"] == "barrier"
        p["steps"].pop()
    run_broken("all_gather", plans, inputs, match="returning from the op: .* may still be reading|returned from the op")


def test_rejects_a_direct_read_plan_without_its_publishing_barrier():
    world, n = 3, 6
    inputs = [make_input(r, 1, n, torch.float32) for r in range(world)]
    plans = build_plans(dict(DIRECT, kind="all_gather", world=world, bytes=n * 4, elem_size=4, slot_bytes=64,
                             addresses_published=True))
    run_broken("all_gather", plans, inputs, match="joined the op")


def two_host_plans(build):
    """Plans for world 2 on two hosts from build(rank, HandPlan)."""
    plans = []
    for r in range(2):
        h = HandPlan()
        build(r, h)
        plans.append(h.p)
    return plans


def run_two_hosts(plans, match, n=2, outs_blocks=1):
    inputs = [make_input(r, 5, n, torch.float32) for r in range(2)]
    for order, seed in (("round_robin", 0), ("random", 4), ("random", 5)):
        ins = [[x.clone()] for x in inputs]
        outs = [[torch.zeros(n) for _ in range(outs_blocks)] for _ in range(2)]
        with pytest.raises(SimulationError, match=match):
            simulate(copy.deepcopy(plans), ins, outs, slot_bytes=64, host_of=[0, 1], dtype=torch.float32,
                     order=order, seed=seed)


def exchange(r, h, send_bytes=8, recv_bytes=8, wait=True):
    ts = [h.send(1 - r, L("in"), send_bytes), h.recv(1 - r, L("out"), recv_bytes)]
    if wait:
        for t in ts:
            h.wait(t)


def test_a_correct_exchange_passes():
    plans = two_host_plans(exchange)
    inputs = [make_input(r, 5, 2, torch.float32) for r in range(2)]
    ins = [[x.clone()] for x in inputs]
    outs = [[torch.zeros(2)] for _ in range(2)]
    simulate(plans, ins, outs, slot_bytes=64, host_of=[0, 1], dtype=torch.float32)
    assert torch.equal(outs[0][0], inputs[1]) and torch.equal(outs[1][0], inputs[0])


def test_rejects_mismatched_sizes():
    plans = two_host_plans(lambda r, h: exchange(r, h, send_bytes=8, recv_bytes=8 if r == 0 else 4))
    run_two_hosts(plans, match="the send .* has 8 bytes, the recv .* 4")


def test_rejects_an_unwaited_transfer():
    def build(r, h):
        exchange(r, h)
        h.send(1 - r, L("in"), 4)
        if r == 1:
            h.recv(0, L("out"), 4)
    run_two_hosts(two_host_plans(build), match=r"never waited")


def test_rejects_deadlocks():
    # Both ranks wait for their recv before posting their send.
    def recv_first(r, h):
        t = h.recv(1 - r, L("out"), 8)
        h.wait(t)
        t = h.send(1 - r, L("in"), 8)
        h.wait(t)
    run_two_hosts(two_host_plans(recv_first), match=r"deadlock(.|\n)*rank 0: .*send of rank 1 is not posted")
    # One host has one more barrier than the other ranks of its host.
    plans, inputs = staged_broadcast()
    plans[1]["steps"].append({"kind": "barrier", "scope": "group"})
    run_broken("broadcast", plans, inputs, match=r"deadlock(.|\n)*rank 1: .*barrier #\d+ \(group\)"
                                                 r".*waiting for rank\(s\) \[0, 2\](.|\n)*rank 2: finished")


def test_rejects_transfers_on_one_host_and_slots_of_another():
    plans = two_host_plans(exchange)
    inputs = [make_input(r, 5, 2, torch.float32) for r in range(2)]
    with pytest.raises(SimulationError, match="on the same host 0"):
        simulate(plans, [[x.clone()] for x in inputs], [[torch.zeros(2)] for _ in range(2)], slot_bytes=64,
                 host_of=[0, 0], dtype=torch.float32)
    # A slot of rank 1 (another host) read by rank 0.
    plans = two_host_plans(lambda r, h: (h.p.update(buffers_used=1), h.copy(L("slot", r, 0), L("in"), 8),
                                         h.barrier("host"), h.copy(L("out"), L("slot", 1, 0), 8)))
    run_two_hosts(plans, match="slot of rank 1, on host 1")
    # A peer block of another host.
    plans = two_host_plans(lambda r, h: h.copy(L("out"), L("peer_in", 0, 1 - r), 8))
    run_two_hosts(plans, match=r"block of rank \d, on host \d, not this rank's host")
    # A group barrier in a plan across hosts.
    plans = two_host_plans(lambda r, h: h.barrier("group"))
    run_two_hosts(plans, match="group barrier in a plan across hosts")


def test_rejects_touching_transfer_buffers_before_the_wait():
    # The sender writes its send's source before the Wait.
    def write_source(r, h):
        t = h.send(1 - r, L("in"), 8)
        u = h.recv(1 - r, L("out"), 8)
        h.copy(L("in"), L("out", 0, 0, 0), 0)  # zero bytes: allowed
        h.copy(L("in"), L("in", offset=4), 4)
        h.wait(t)
        h.wait(u)
    run_two_hosts(two_host_plans(write_source), match="writes bytes of rank \\d's in\\[0\\] that send #0", n=3)
    # The receiver reads its recv's destination before the Wait.
    def read_destination(r, h):
        t = h.send(1 - r, L("in"), 8)
        u = h.recv(1 - r, L("scratch"), 8)
        h.p["scratch_bytes"] = 8
        h.copy(L("out"), L("scratch"), 8)
        h.wait(t)
        h.wait(u)
    run_two_hosts(two_host_plans(read_destination), match="reads bytes of scratch of rank \\d that recv #1")


def test_rejects_stray_accesses():
    plans, inputs = staged_broadcast()
    bad = copy.deepcopy(plans)
    bad[1]["steps"][-1]["bytes"] += 4  # reads past the slot's 16 bytes... and past out[0]
    run_broken("broadcast", bad, inputs, match="out of bounds")
    bad = copy.deepcopy(plans)
    bad[2]["steps"][-1]["src"]["buf"] = 5
    run_broken("broadcast", bad, inputs, match="outside the plan's buffers_used")
    bad = copy.deepcopy(plans)
    bad[0]["buffers_used"] += 1
    run_broken("broadcast", bad, inputs, match="disagree on buffers_used")
    # Reads a slot nobody wrote in this op (stale data of an earlier op).
    bad = copy.deepcopy(plans)
    for s in bad[0]["steps"]:
        if s["kind"] == "copy":
            s["dst"]["index"] = 1  # the root stages into rank 1's slot ... races, or readers find nothing
    run_broken("broadcast", bad, inputs, match="holds no data of this op|no barrier|ordering")


def test_rejects_partly_overlapping_copies():
    world = 1
    h = HandPlan()
    h.copy(L("out", offset=4), L("in"), 8)  # out is in (in place): overlapping by 4 bytes
    h.barrier()
    inputs = [make_input(0, 1, 4, torch.float32)]
    ins, outs = make_blocks("all_reduce", world, inputs)
    with pytest.raises(SimulationError, match="overlap partly"):
        simulate([h.p], ins, outs, slot_bytes=16, dtype=torch.float32)


@pytest.mark.xfail(strict=True, raises=SimulationError,
                   reason="builder bug: scatter / reduce_scatter give each rank a part of at least one element, so "
                          "a round whose slot_bytes < world x elem_size writes past the root's slot (plan/gather.cpp, "
                          "plan/reduce.cpp; reachable at the 4 KiB minimum round from world 513 with 8-byte elements)")
@pytest.mark.parametrize("kind", ["scatter", "reduce_scatter"])
def test_parts_smaller_than_an_element(kind):
    world, n, dtype = 8, 5, torch.float64
    inputs = inputs_for(kind, world, n, dtype, 11, root=0)
    outs, _, _ = run_layout(dict(kind=kind, bytes=n * 8, elem_size=8, slot_bytes=60), None, inputs, dtype=dtype)
    check_outputs(kind, outs, inputs, "sum", 0, f"{kind} slot 60 world 8", dtype)
