"""Baseline alltoallv schedules, built from their published descriptions.

* ``direct``   — every pair at once, one phase.
* ``pairwise`` — NCCL-style peer rounds: in round k every rank s sends to (s + k) mod N.
* ``fast``     — FAST (arXiv 2505.09764), as its paper describes it: intra-server balancing
  (moved data keeps its final GPU index), server-level Birkhoff-von Neumann decomposition of
  the padded server matrix, one rail-aligned step per permutation (GPU g of server s sends to
  GPU g of server pi(s)), and a restore copy to the true destination GPU that runs with the
  next step.  On one host FAST has no server level and reduces to ``direct``.

Baselines may relay data (FAST does), so their phases need not cover the demand pair by pair;
they are valid input for :func:`varipath.simulate`.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
from scipy.optimize import linear_sum_assignment

from .simulate import check_demand
from .topology import Topology, gpu_index_list

Phases = List[List[Tuple[int, int, int]]]


def direct(demand, topo: Topology) -> Phases:
    """All pairs in one phase (source-major order)."""
    dem = check_demand(demand, topo.num_gpus)
    n = topo.num_gpus
    ph = [(s, d, int(dem[s, d])) for s in range(n) for d in range(n) if s != d and dem[s, d] > 0]
    return [ph] if ph else []


def pairwise(demand, topo: Topology) -> Phases:
    """N-1 peer rounds: round k pairs s with (s + k) mod N."""
    dem = check_demand(demand, topo.num_gpus)
    n = topo.num_gpus
    out = []
    for k in range(1, n):
        ph = [(s, (s + k) % n, int(dem[s, (s + k) % n])) for s in range(n) if dem[s, (s + k) % n] > 0]
        if ph:
            out.append(ph)
    return out


def bvn(matrix: np.ndarray) -> List[Tuple[np.ndarray, float]]:
    """Birkhoff-von Neumann: (permutation, weight) pairs summing to ``matrix`` after padding it
    to equal line sums.  Each step takes a perfect matching on the positive support (Hungarian
    algorithm, preferring large entries) and its smallest entry as weight."""
    m = np.asarray(matrix, dtype=float).copy()
    h = m.shape[0]
    target = max(m.sum(0).max(), m.sum(1).max())
    _pad(m, target)
    out = []
    for _ in range(h * h + 1):
        if m.max() <= target * 1e-12:
            break
        support = m > target * 1e-12
        cost = np.where(support, -m / target, 1e6)
        rows, cols = linear_sum_assignment(cost)
        if not support[rows, cols].all():
            break  # numerical leftovers only
        w = m[rows, cols].min()
        m[rows, cols] -= w
        out.append((cols.copy(), float(w)))
    return out


def _pad(m: np.ndarray, target: float) -> None:
    """Add dummy traffic so every row and column sums to ``target`` (greedy; keeps m >= 0)."""
    rows = target - m.sum(1)
    cols = target - m.sum(0)
    for i in range(len(rows)):
        for j in range(len(cols)):
            add = min(rows[i], cols[j])
            if add > 0:
                m[i, j] += add
                rows[i] -= add
                cols[j] -= add


def _rail_split(block: np.ndarray) -> Dict[Tuple[int, int], np.ndarray]:
    """For one (source server, destination server) block M[i, j], decide how much of each
    source GPU i's data for destination GPU j rides rail g, so every rail carries sum(M)/m.
    Data stays on rail j (its final GPU index) as far as the rail's share allows; the excess
    goes on the least-filled rails and needs a restore copy at the destination."""
    m = block.shape[0]
    share = block.sum() / m
    rail_load = np.zeros(m)
    plan: Dict[Tuple[int, int], np.ndarray] = {}
    for j in range(m):
        for i in range(m):
            amount = float(block[i, j])
            if amount <= 0:
                continue
            alloc = np.zeros(m)
            take = min(amount, max(0.0, share - rail_load[j]))
            alloc[j] += take
            rail_load[j] += take
            amount -= take
            while amount > 1e-9:
                g = int(np.argmin(rail_load))
                room = share - rail_load[g]
                take = amount if room <= 1e-9 else min(amount, room)
                alloc[g] += take
                rail_load[g] += take
                amount -= take
            plan[(i, j)] = alloc
    return plan


def fast(demand, topo: Topology) -> Phases:
    """FAST-style schedule (see module docstring)."""
    dem = check_demand(demand, topo.num_gpus)
    hosts = topo.num_hosts
    if hosts == 1:
        return direct(dem, topo)
    gpus = [gpu_index_list(topo, h) for h in range(hosts)]
    m = len(gpus[0])
    if any(len(g) != m for g in gpus):
        raise ValueError("fast baseline needs the same number of GPUs on every host")
    balance: Dict[Tuple[int, int], float] = {}
    rail: Dict[Tuple[int, int, int], float] = {}  # (a, b, g) -> bytes on rail g from a to b
    restore: Dict[Tuple[int, int, int], Dict[Tuple[int, int], float]] = {}
    server = np.zeros((hosts, hosts))
    for a in range(hosts):
        for b in range(hosts):
            block = dem[np.ix_(gpus[a], gpus[b])].astype(float)
            if a == b:
                continue
            server[a, b] = block.sum()
            for (i, j), alloc in _rail_split(block).items():
                for g in np.flatnonzero(alloc > 0):
                    amt = float(alloc[g])
                    if g != i:
                        k = (gpus[a][i], gpus[a][g])
                        balance[k] = balance.get(k, 0.0) + amt
                    rail[(a, b, g)] = rail.get((a, b, g), 0.0) + amt
                    if g != j:
                        r = restore.setdefault((a, b, g), {})
                        key = (gpus[b][g], gpus[b][j])
                        r[key] = r.get(key, 0.0) + amt
    first = [(s, d, int(round(v))) for (s, d), v in sorted(balance.items()) if v >= 1]
    for h in range(hosts):  # intra-server demand goes directly, alongside the balancing
        for s in gpus[h]:
            first += [(s, d, int(dem[s, d])) for d in gpus[h] if d != s and dem[s, d] > 0]
    phases: Phases = [first] if first else []
    left = dict(rail)
    pending: List[Tuple[int, int, int]] = []
    for perm, w in bvn(server):
        step: List[Tuple[int, int, int]] = list(pending)
        pending = []
        for a in range(hosts):
            b = int(perm[a])
            if b == a or server[a, b] <= 0:
                continue
            frac = min(1.0, w / server[a, b])
            for g in range(m):
                amt = min(left.get((a, b, g), 0.0), rail.get((a, b, g), 0.0) * frac)
                if amt < 1:
                    continue
                left[(a, b, g)] -= amt
                step.append((gpus[a][g], gpus[b][g], int(round(amt))))
                total = rail[(a, b, g)]
                for (s, d), v in restore.get((a, b, g), {}).items():
                    pending.append((s, d, int(round(v * amt / total))))
        if step:
            phases.append(step)
    if pending:
        phases.append(pending)
    return phases


BASELINES = {"direct": direct, "pairwise": pairwise, "fast": fast}
