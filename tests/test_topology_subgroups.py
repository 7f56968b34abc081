"""HOCCL_TOPOLOGY with subgroups: a group over some of the world's ranks plans its all_to_all on
the part of the machine its ranks occupy (Topology.induced), or flat with an INFO note when that
cannot be derived; creating it never fails.

The sub-topology is checked against the whole topology it came from: every pair's route, rate
and latency, and the link-congestion bound of any demand, must be those of the same GPUs in the
whole machine. On real ranks (HOCCL_TOPOLOGY=direct4, world 4), subgroups from new_group (sorted
and not) and init_device_mesh run all_to_all_single with uneven splits and all_reduce, checked
against references built from every member's known inputs, and the 3-rank group's backend runs
exactly the plans varipath.schedule() makes on its sub-topology."""
from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import pytest
import torch
import torch.distributed as dist

import varipath
from collective_checks import all_to_all_reference, assert_close, make_input, reference_reduce
from dist_utils import run_ranks
from varipath.topology import Topology

SELECTIONS = [
    ("direct4", 1, [0, 1]), ("direct4", 1, [1, 3]), ("direct4", 1, [3, 0]), ("direct4", 1, [0, 1, 3]),
    ("gen4-4sw-2skt", 1, [0, 2, 7]), ("gen4-4sw-2skt", 1, [5, 4, 1, 0]), ("gen5-2sw", 1, [6, 1, 2]),
    ("direct4", 2, [4, 5, 6, 7]), ("direct4", 2, [0, 5]), ("gen4-4sw-2skt", 2, [15, 0, 3]),
]


def pairs(n):
    return [(i, j) for i in range(n) for j in range(n) if i != j]


@pytest.mark.parametrize("preset,hosts,ranks", SELECTIONS)
def test_sub_topology_keeps_every_route_of_its_gpus(preset, hosts, ranks):
    whole = Topology.preset(preset, hosts)
    sub = whole.induced(ranks)
    assert sub.gpus == [whole.gpus[r] for r in ranks]
    for i, j in pairs(len(ranks)):
        s, d = ranks[i], ranks[j]
        assert sub.path(i, j) == whole.path(s, d), (i, j)
        assert sub.pair_rate(i, j) == whole.pair_rate(s, d)
        assert sub.path_latency(i, j) == whole.path_latency(s, d)
        assert sub.host_of(i) == whole.host_of(s)
    routed = {link for i, j in pairs(len(ranks)) for link in sub.path(i, j)}
    assert set(sub.links()) == routed  # a link no route of the group uses cannot limit it
    for link in routed:
        assert sub.bandwidth(link) == whole.bandwidth(link) and sub.latency(link) == whole.latency(link)


@pytest.mark.parametrize("preset,hosts,ranks", SELECTIONS)
def test_congestion_bound_equals_the_same_demand_on_the_whole_machine(preset, hosts, ranks):
    whole = Topology.preset(preset, hosts)
    sub = whole.induced(ranks)
    rng = np.random.default_rng(len(ranks) * 31 + hosts)
    for _ in range(3):
        demand = rng.integers(0, 1 << 20, size=(len(ranks), len(ranks)))
        embedded = np.zeros((whole.num_gpus, whole.num_gpus), dtype=np.int64)
        for i, j in pairs(len(ranks)):
            embedded[ranks[i], ranks[j]] = demand[i, j]
        assert varipath.lower_bound(sub, demand) == pytest.approx(varipath.lower_bound(whole, embedded), rel=1e-12)


def test_direct4_by_hand():
    whole = Topology.preset("direct4")  # GPUs 0, 1 on root complex 0; 2, 3 on root complex 1
    across = whole.induced([1, 3])
    assert across.path(0, 1) == [("h0.gpu1", "h0.rc0"), ("h0.rc0", "h0.rc1"), ("h0.rc1", "h0.gpu3")]
    assert across.pair_rate(0, 1) == 20e9  # the socket link
    same_socket = whole.induced([0, 1])
    assert same_socket.path(1, 0) == [("h0.gpu1", "h0.rc0"), ("h0.rc0", "h0.gpu0")]
    assert ("h0.rc0", "h0.rc1") not in same_socket.links() and same_socket.pair_rate(0, 1) == 25e9
    assert same_socket.name == "direct4[0,1]"


def chain_topology():
    """gpu0 - gpu1 - gpu2 - sw - gpu3: the route from gpu0 to gpu2 runs through gpu1."""
    nodes = [{"id": f"gpu{i}", "type": "gpu"} for i in range(4)] + [{"id": "sw", "type": "switch"}]
    links = [{"a": "gpu0", "b": "gpu1", "bw_GBps": 50}, {"a": "gpu1", "b": "gpu2", "bw_GBps": 50},
             {"a": "gpu2", "b": "sw", "bw_GBps": 25}, {"a": "gpu3", "b": "sw", "bw_GBps": 25}]
    return {"name": "chain4", "nodes": nodes, "links": links, "gpus": [f"gpu{i}" for i in range(4)]}


def test_route_through_a_left_out_gpu_is_not_inducible():
    whole = Topology.from_dict(chain_topology())
    assert whole.induced([1, 2, 3]).path(0, 2) == whole.path(1, 3)
    with pytest.raises(varipath.NotInducible, match="pass through GPU gpu1"):
        whole.induced([0, 2])


@pytest.mark.parametrize("ranks,message", [([2], "at least two GPUs"), ([0, 4], r"out of range 0\.\.3"),
                                           ([1, 1], "names a GPU twice")])
def test_bad_gpu_selection_names_the_problem(ranks, message):
    with pytest.raises(ValueError, match=message):
        Topology.preset("direct4").induced(ranks)


def test_group_topology_for_the_whole_world_is_the_topology_itself():
    assert varipath.group_topology("direct4", 4, [0, 1, 2, 3]).name == "direct4"
    assert varipath.group_topology("direct4:2", 8, range(8)).name == "direct4x2"
    assert varipath.group_topology("direct4", 4, [2, 0]).gpus == ["h0.gpu2", "h0.gpu0"]


@pytest.mark.parametrize("spec,world,ranks,message", [
    ("direct4", 2, [0, 1], "describes 4 GPUs but the world has 2 ranks"),
    ("direct4:2", 8, [0, 5], "span 2 hosts"),
])
def test_group_topology_that_cannot_be_derived_says_why(spec, world, ranks, message):
    with pytest.raises(varipath.NotInducible, match=message):
        varipath.group_topology(spec, world, ranks)


def test_bad_topology_name_is_still_an_error_for_a_subgroup():
    with pytest.raises(ValueError, match="unknown topology preset 'direct5'") as e:
        varipath.group_topology("direct5", 4, [0, 1])
    assert not isinstance(e.value, varipath.NotInducible)


def test_multi_host_sub_topology_is_refused_by_the_multi_host_planner():
    sub = Topology.preset("direct4", 2).induced([0, 5])
    with pytest.raises(ValueError, match=r"direct4x2\[0,5\] is not one"):
        varipath.schedule(np.ones((2, 2), dtype=np.int64), sub)


@pytest.mark.parametrize("preset,hosts,ranks", [("direct4", 1, [0, 1, 3]), ("direct4", 2, [4, 5, 6, 7]),
                                                ("gen4-4sw-2skt", 1, [5, 4, 1, 0])])
def test_plans_on_a_sub_topology_deliver_the_demand(preset, hosts, ranks):
    sub = Topology.preset(preset, hosts).induced(ranks)
    demand = np.random.default_rng(7).integers(1, 4 << 20, size=(len(ranks), len(ranks)))
    np.fill_diagonal(demand, 0)
    phases = varipath.schedule(demand, sub)
    assert (varipath.coverage(phases, len(ranks)) == demand).all()


# ------------------------------------------------------------------ real ranks
GROUPS = [[0, 1], [2, 3], [1, 3], [3, 0], [0, 1, 3]]  # [3, 0] keeps that order (sort_ranks=False)
PLANNED_GROUP = [0, 1, 3]  # three ranks, two across the socket link: plans of several phases
ALLTOALL_BYTES = 4 << 20


def split_matrix(members, case):
    """Uneven rows per (source, destination) in group rank order, one pair empty."""
    k = len(members)
    m = torch.tensor([[1 + (7 * members[i] + 3 * j + case) % 5 for j in range(k)] for i in range(k)])
    m[0, k - 1] = 0
    return m


def planned_bytes(members):
    k = len(members)
    g = torch.Generator().manual_seed(sum(members))
    m = torch.randint(ALLTOALL_BYTES // 4, ALLTOALL_BYTES, (k, k), generator=g)
    m[:, 2] *= 2  # rank 3's socket link is the bottleneck
    return m


def check_group(group, members, case):
    me = members.index(dist.get_rank())
    m = split_matrix(members, case)
    inputs = [make_input(r, case, int(m[i].sum()) * 3, torch.float32).view(-1, 3) for i, r in enumerate(members)]
    out = torch.empty(int(m[:, me].sum()), 3)
    dist.all_to_all_single(out, inputs[me], output_split_sizes=m[:, me].tolist(),
                           input_split_sizes=m[me].tolist(), group=group)
    assert_close(out, all_to_all_reference(inputs, m, me), f"all_to_all_single group {members}")
    backend = group._get_backend(torch.device("cpu"))
    assert backend.last_algorithm() == "alltoall/varipath", (members, backend.last_algorithm())
    summands = [make_input(r, case, 37, torch.float32) for r in members]
    total = summands[me].clone()
    dist.all_reduce(total, group=group)
    assert_close(total, reference_reduce(summands, "sum", len(members)), f"all_reduce group {members}")


def run_planned(group, members):
    me = members.index(dist.get_rank())
    m = planned_bytes(members)
    inputs = [make_input(r, 99, int(m[i].sum()), torch.uint8) for i, r in enumerate(members)]
    out = torch.empty(int(m[:, me].sum()), dtype=torch.uint8)
    dist.all_to_all_single(out, inputs[me], output_split_sizes=m[:, me].tolist(),
                           input_split_sizes=m[me].tolist(), group=group)
    assert_close(out, all_to_all_reference(inputs, m, me), f"all_to_all_single group {members}")
    return group._get_backend(torch.device("cpu")).last_alltoall_phases()


def with_stderr_captured(fn):
    """Runs fn() with file descriptor 2 (where hoccl's notes go) in a file; returns both."""
    saved = os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            result = fn()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        log.seek(0)
        return result, log.read().decode()


def subgroups_on_direct4(rank, world):
    from torch.distributed.device_mesh import init_device_mesh

    def create():
        made = [(members, dist.new_group(members, sort_ranks=False)) for members in GROUPS]
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        made += [(dist.get_process_group_ranks(g), g) for g in (mesh.get_group("dp"), mesh.get_group("tp"))]
        return made

    made, log = with_stderr_captured(create)
    mine = [(members, g) for members, g in made if rank in members]
    for case, (members, group) in enumerate(made):  # every member must use the group's case
        if rank in members:
            check_group(group, members, case)
    planned = None
    if rank in PLANNED_GROUP:
        planned = run_planned(next(g for members, g in mine if members == PLANNED_GROUP), PLANNED_GROUP)
    return [members for members, _ in mine], planned, log


def as_lists(phases):
    return [[tuple(int(x) for x in t) for t in ph] for ph in phases]


def test_subgroups_plan_on_their_part_of_the_topology():
    env = {"HOCCL_TOPOLOGY": "direct4", "HOCCL_ALLTOALL_ALGO": "varipath", "HOCCL_DEBUG": "INFO"}
    results = run_ranks(subgroups_on_direct4, 4, env=env, timeout=300)
    mesh_groups = [[0, 2], [1, 3], [0, 1], [2, 3]]
    for rank, (checked, _, _) in enumerate(results):
        want = [g for g in GROUPS if rank in g] + [g for g in mesh_groups if rank in g]
        assert checked == want, (rank, checked)
    for members in GROUPS + mesh_groups:  # the note comes from each group's rank 0
        name = f"direct4[{','.join(map(str, members))}]"
        assert f"all_to_all plans on {name}" in results[members[0]][2], (members, results[members[0]][2])
    m = planned_bytes(PLANNED_GROUP).numpy()
    want = varipath.schedule(m, Topology.preset("direct4").induced(PLANNED_GROUP))
    assert len(want) > 1, "flat plans every pair in one phase: such a plan would not tell them apart"
    k = len(PLANNED_GROUP)
    for rank in PLANNED_GROUP:
        phases = as_lists(results[rank][1])
        assert phases[0] == [(i, i, int(m[i, i])) for i in range(k)], phases[0]
        assert phases[1:] == as_lists(want), rank


def hoccl_group_beside_gloo(rank, world):
    group, log = with_stderr_captured(lambda: dist.new_group([0, 1], backend="hoccl"))
    check_group(group, [0, 1], 0)
    return log


def test_subgroup_of_a_world_the_topology_does_not_describe_plans_flat_with_a_note():
    env = {"HOCCL_TOPOLOGY": "direct4", "HOCCL_ALLTOALL_ALGO": "varipath", "HOCCL_DEBUG": "INFO"}
    logs = run_ranks(hoccl_group_beside_gloo, 2, backend="gloo", env=env)
    assert "group of world ranks [0, 1]: all_to_all plans flat" in logs[0], logs[0]
    assert "describes 4 GPUs but the world has 2 ranks" in logs[0], logs[0]
    assert "all_to_all plans" not in logs[1], logs[1]  # one note per group, from its rank 0


def create_world_only(rank, world):
    return None


def test_world_group_the_topology_does_not_describe_is_still_an_error():
    results = run_ranks(create_world_only, 2, env={"HOCCL_TOPOLOGY": "direct4"}, expect_errors=True)
    for rank, (status, text) in enumerate(results):
        assert status == "error", text
        assert f"creation on rank {rank}: HOCCL_TOPOLOGY='direct4' describes 4 GPUs but the process group " \
               "has world_size=2" in text, text
