"""Baselines: an EPLB-style balancer and "no balancing".

The EPLB-style baseline follows DeepSeek EPLB's published description (implemented here from
that description, not from its code): with ``num_groups`` divisible by the number of nodes it is
hierarchical - (1) pack expert groups to nodes by balanced packing (equal number of groups per
node, heaviest group to the currently lightest node that still has room), (2) inside each node
replicate by repeatedly adding a replica to the expert with the largest load per replica,
(3) pack the node's replicas to its GPUs by balanced packing (equal count per GPU); otherwise
the same with one group and one node (global policy). Each expert's load splits evenly over its
replicas. Unlike TopoEP it may move every expert (it re-places all of them), but it can only
split a hot expert evenly.

Baselines are host-side reference code (numpy), used by the bench and tests.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class BaselineResult:
    gpu_load: np.ndarray          # [R] float, tokens per GPU
    replicas: list                # per GPU: list of (expert, share of that expert's load)
    cross_host_fraction: float

    @property
    def imbalance(self) -> float:
        mean = float(self.gpu_load.mean())
        return float(self.gpu_load.max()) / mean if mean > 0 else 1.0

    @property
    def balancedness(self) -> float:
        return 1.0 / self.imbalance

    def share(self, experts: int) -> np.ndarray:
        """[E, R]: fraction of expert e's tokens that GPU g processes under this placement
        (each expert's load splits evenly over its replicas), to replay it on other counts."""
        n = np.zeros((experts, len(self.replicas)))
        for g, reps in enumerate(self.replicas):
            for e, _ in reps:
                n[e, g] += 1
        return n / n.sum(1, keepdims=True)

    def experts_on(self) -> list:
        """Per GPU: the multiset (sorted list) of experts it holds."""
        return [sorted(e for e, _ in reps) for reps in self.replicas]


def _balanced_packing(weights: np.ndarray, npacks: int) -> np.ndarray:
    """Pack items into npacks packs of equal item count: heaviest item first, each to the
    lightest pack with room (ties: lowest pack index). Returns pack id per item."""
    n = len(weights)
    if n % npacks:
        raise ValueError(f"balanced packing: {n} items do not divide into {npacks} packs")
    per = n // npacks
    load = np.zeros(npacks)
    cnt = np.zeros(npacks, dtype=np.int64)
    pack = np.empty(n, dtype=np.int64)
    for i in np.argsort(-weights, kind="stable"):
        cand = np.where(cnt < per, load, np.inf)
        p = int(np.argmin(cand))
        pack[i] = p
        load[p] += weights[i]
        cnt[p] += 1
    return pack


def _replicate(weights: np.ndarray, total: int) -> np.ndarray:
    """Replica counts: start at one each, add one at a time to the max load-per-replica."""
    n = np.ones(len(weights), dtype=np.int64)
    for _ in range(total - len(weights)):
        n[int(np.argmax(weights / n))] += 1
    return n


def eplb_balance(counts: np.ndarray, hosts: int, gpus_per_host: int, slots_per_gpu: int,
                 num_groups: int | None = None) -> BaselineResult:
    """EPLB-style plan on the same budget as TopoEP: E + R * slots_per_gpu physical experts.

    counts: [R, E] tokens per (source rank, expert). num_groups defaults to E (each expert
    its own group, the most flexible hierarchical packing)."""
    counts = np.asarray(counts, dtype=np.float64)
    r, e = counts.shape
    if r != hosts * gpus_per_host:
        raise ValueError(f"eplb: counts has {r} ranks, expected {hosts * gpus_per_host}")
    w = counts.sum(0)
    num_replicas = e + r * slots_per_gpu
    groups = e if num_groups is None else num_groups
    nodes = hosts
    if groups % nodes or e % groups:
        groups, nodes = 1, 1
    gpn = r // nodes  # GPUs per (logical) node
    per_group = e // groups
    gload = w.reshape(groups, per_group).sum(1)
    gnode = _balanced_packing(gload, nodes)
    phys_per_node = num_replicas // nodes
    gpu_load = np.zeros(r)
    replicas: list = [[] for _ in range(r)]
    expert_gpu_share = np.zeros((e, r))
    for node in range(nodes):
        experts = np.concatenate([np.arange(g * per_group, (g + 1) * per_group)
                                  for g in range(groups) if gnode[g] == node])
        nrep = _replicate(w[experts], phys_per_node)
        items = np.repeat(experts, nrep)
        share = np.repeat(w[experts] / nrep, nrep)
        pack = _balanced_packing(share, gpn)
        for it, sh, p in zip(items, share, pack):
            g = node * gpn + int(p)
            gpu_load[g] += sh
            replicas[g].append((int(it), float(sh)))
            if w[it] > 0:
                expert_gpu_share[it, g] += sh / w[it]
    # tokens of source rank s for expert x go to x's replicas in proportion to their share
    host = np.arange(r) // gpus_per_host
    cross = host[:, None] != host[None, :]  # [src, dst]
    moved = np.einsum("se,eg,sg->", counts, expert_gpu_share, cross)
    total = counts.sum()
    return BaselineResult(gpu_load, replicas, float(moved / total) if total else 0.0)


def no_balance(counts: np.ndarray, hosts: int, gpus_per_host: int,
               placement: np.ndarray | None = None) -> BaselineResult:
    """Every token goes to its expert's home GPU (contiguous placement by default)."""
    counts = np.asarray(counts, dtype=np.float64)
    r, e = counts.shape
    home = np.arange(e) // (e // r) if placement is None else np.asarray(placement)
    load = np.zeros(r)
    np.add.at(load, home, counts.sum(0))
    host = np.arange(r) // gpus_per_host
    cross = host[:, None] != host[home][None, :]  # [src, expert]
    total = counts.sum()
    frac = float((counts * cross).sum() / total) if total else 0.0
    return BaselineResult(load, [[(int(x), 1.0) for x in np.where(home == g)[0]]
                                 for g in range(r)], frac)
