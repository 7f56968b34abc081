"""VarioPath plan cache in the backend: all_to_all_single calls whose split matrix repeats reuse
the plan of the same matrix (most recently used first, HOCCL_ALLTOALL_PLAN_CACHE entries).

Real ranks on the direct4 topology (where VarioPath plans with its C++ scheduler). Every call's
output is checked against the reference built from all ranks' known inputs, and the counts of
planned and reused matrices against an independent model of a least-recently-used cache."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from collective_checks import all_to_all_reference, assert_close, make_input
from dist_utils import run_ranks

WORLD = 4


def split_matrix(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    m = torch.randint(0, 50, (WORLD, WORLD), generator=g)
    m[:, seed % WORLD] += 3000  # one hot receiver, different per matrix
    return m


def expected_counts(sequence: list[int], capacity: int) -> tuple[int, int]:
    """(planned, reused) for `sequence` of matrix ids through an LRU cache of `capacity`."""
    cache: list[int] = []
    planned = reused = 0
    for key in sequence:
        if key in cache:
            reused += 1
            cache.remove(key)
        else:
            planned += 1
        if capacity > 0:
            cache.insert(0, key)
            del cache[capacity:]
    return planned, reused


def check_plan_cache(rank, world, sequence):
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    before = backend.alltoall_plan_counts()
    for call, key in enumerate(sequence):
        m = split_matrix(key)
        case = 1000 * call + key  # new contents every call, even when the splits repeat
        inputs = [make_input(r, case, int(m[r].sum()) * 3, torch.float32).view(-1, 3) for r in range(world)]
        out = torch.empty(int(m[:, rank].sum()), 3)
        dist.all_to_all_single(out, inputs[rank], output_split_sizes=m[:, rank].tolist(),
                               input_split_sizes=m[rank].tolist())
        assert_close(out, all_to_all_reference(inputs, m, rank), f"all_to_all_single call {call} (matrix {key})")
        assert backend.last_algorithm() == "alltoall/varipath", backend.last_algorithm()
    after = backend.alltoall_plan_counts()
    return after[0] - before[0], after[1] - before[1]


SEQUENCE = [0, 0, 1, 0, 2, 1, 1, 3, 0]


@pytest.mark.parametrize("capacity", [8, 1, 0])
def test_repeated_split_matrices_reuse_their_plan(capacity):
    env = {"HOCCL_TOPOLOGY": "direct4", "HOCCL_ALLTOALL_ALGO": "varipath",
           "HOCCL_ALLTOALL_PLAN_CACHE": str(capacity)}
    counts = run_ranks(check_plan_cache, WORLD, SEQUENCE, env=env, timeout=300)
    assert counts == [expected_counts(SEQUENCE, capacity)] * WORLD, counts
