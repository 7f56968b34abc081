"""The backend's all_to_all runs exactly the plans varipath.schedule() returns.

Real ranks call dist.all_to_all_single with skewed split matrices on several topologies
(HOCCL_TOPOLOGY) and cost models (HOCCL_VARIPATH_MODEL, unset = the default); each rank records
the phases its backend ran (last_alltoall_phases()). The test process plans the same byte
matrices independently with varipath.schedule() on the same topology and model, and the
backend's VarioPath phases (after its self-copy phase) must be identical, transfer for transfer
and in order, on every rank. Every call's output is also checked against the reference built
from all ranks' known inputs."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import varipath
from collective_checks import all_to_all_reference, assert_close, make_input
from dist_utils import run_ranks
from varipath.traffic import make

# (traffic, bytes per rank): skewed demands, small (one phase) and bandwidth-bound (several)
MATRICES = [("zipf1.2", 256 << 10), ("zipf1.2", 4 << 20), ("hot4-80", 4 << 20), ("moe-top2", 4 << 20)]


def byte_matrix(world: int, case: int) -> torch.Tensor:
    traffic, size = MATRICES[case]
    m = torch.from_numpy(make(traffic, world, size, seed=case)).to(torch.int64)
    m[case % world, (case + 1) % world] = 0  # an empty pair: no transfer may name it
    return m


def run_and_record(rank, world):
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    ran = []
    for case in range(len(MATRICES)):
        m = byte_matrix(world, case)
        inputs = [make_input(r, case, int(m[r].sum()), torch.uint8) for r in range(world)]
        out = torch.empty(int(m[:, rank].sum()), dtype=torch.uint8)
        dist.all_to_all_single(out, inputs[rank], output_split_sizes=m[:, rank].tolist(),
                               input_split_sizes=m[rank].tolist())
        assert_close(out, all_to_all_reference(inputs, m, rank), f"all_to_all_single case {case}")
        assert backend.last_algorithm() == "alltoall/varipath", backend.last_algorithm()
        ran.append(backend.last_alltoall_phases())
    return ran


def as_lists(phases):
    return [[tuple(int(x) for x in t) for t in ph] for ph in phases]


# (HOCCL_TOPOLOGY, world, HOCCL_VARIPATH_MODEL); None = unset
CASES = [
    (None, 4, None),                 # flat: one phase of every pair, as without VarioPath
    ("direct4", 4, "contention"),
    ("gen5-2sw", 8, None),           # two PCIe switches, the default model
    ("direct4:2", 8, "dma"),         # two hosts: host-aware channels, copy-engine queues
]


@pytest.mark.parametrize("spec,world,model", CASES)
def test_backend_runs_the_plans_of_varipath_schedule(spec, world, model):
    env = {"HOCCL_ALLTOALL_ALGO": "varipath"}
    if spec is not None:
        env["HOCCL_TOPOLOGY"] = spec
    if model is not None:
        env["HOCCL_VARIPATH_MODEL"] = model
    recorded = run_ranks(run_and_record, world, env=env, timeout=600)
    topo = varipath.backend_topology(spec, world)
    planned_any = False
    for case in range(len(MATRICES)):
        m = byte_matrix(world, case).numpy()
        want = varipath.schedule(m, topo) if model is None else varipath.schedule(m, topo, model)
        if spec is None:  # flat: no links to schedule for, every pair in one phase
            want = [[(s, d, int(m[s, d])) for s in range(world) for d in range(world) if s != d]]
        planned_any = planned_any or len(want) > 1
        for rank in range(world):
            phases = as_lists(recorded[rank][case])
            assert phases[0] == [(r, r, int(m[r, r])) for r in range(world)], (case, rank, phases[0])
            assert phases[1:] == as_lists(want), (spec, model, case, rank)
    assert planned_any or spec in (None, "direct4:2"), "no matrix got a multi-phase plan: the comparison is weak"


def create_group_only(rank, world):
    return None


def test_bad_varipath_model_names_the_variable():
    env = {"HOCCL_TOPOLOGY": "direct4", "HOCCL_VARIPATH_MODEL": "bogus"}
    results = run_ranks(create_group_only, 4, env=env, expect_errors=True, timeout=300)
    for rank, res in enumerate(results):
        assert res[0] == "error", res
        assert "HOCCL_VARIPATH_MODEL=bogus" in res[1] and f"rank {rank}" in res[1], res[1]
        assert "contention" in res[1], res[1]
