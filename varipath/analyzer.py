"""Offline analyzer: contention-free channels and the topology's GPU symmetry group.

A *channel* is a set of (src, dst) transfers that can all run at their full rate (the rate each
gets alone: its path's narrowest link) without any directed link carrying more than its
bandwidth.  We enumerate the *maximal* channels (every subset of a channel is a channel too, and
the scheduler simply leaves idle pairs out of a phase), then keep one representative per orbit
of the symmetry group: GPU permutations that map the topology graph onto itself with equal
bandwidths and node kinds.
"""
from __future__ import annotations

from itertools import permutations
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

from .topology import Topology

Pair = Tuple[int, int]
Channel = FrozenSet[Pair]
EPS = 1e-6


class PairLinks:
    """Per-pair link usage (in bytes/s at full rate) over a chosen GPU subset."""

    def __init__(self, topo: Topology, pairs: Sequence[Pair]) -> None:
        self.topo = topo
        self.pairs = list(pairs)
        self.use: Dict[Pair, List[Tuple[Tuple[str, str], float]]] = {}
        for s, d in self.pairs:
            r = topo.pair_rate(s, d)
            self.use[(s, d)] = [(l, r) for l in topo.path(s, d)]

    def fits(self, load: Dict, pair: Pair) -> bool:
        """Whether ``pair`` at full rate fits on top of ``load`` (bytes/s per link)."""
        return all(load.get(l, 0.0) + r <= self.topo.bandwidth(l) * (1 + EPS) for l, r in self.use[pair])

    def add(self, load: Dict, pair: Pair, sign: float = 1.0) -> None:
        for l, r in self.use[pair]:
            load[l] = load.get(l, 0.0) + sign * r


def is_contention_free(topo: Topology, channel: Iterable[Pair]) -> bool:
    """Recompute link loads from ``topo.path`` and check every link is within bandwidth."""
    load: Dict = {}
    for s, d in channel:
        r = topo.pair_rate(s, d)
        for l in topo.path(s, d):
            load[l] = load.get(l, 0.0) + r
    return all(v <= topo.bandwidth(l) * (1 + EPS) for l, v in load.items())


def maximal_channels(topo: Topology, pairs: Optional[Sequence[Pair]] = None) -> List[Channel]:
    """All maximal contention-free subsets of ``pairs`` (default: all ordered GPU pairs).

    Depth-first include/exclude search; a leaf is kept only if no excluded pair still fits, and
    an exclude branch is cut as soon as an excluded pair can no longer be blocked by any pair
    still to be decided (then every completion would be non-maximal).
    """
    n = topo.num_gpus
    if pairs is None:
        pairs = [(s, d) for s in range(n) for d in range(n) if s != d]
    pl = PairLinks(topo, pairs)
    pairs = list(pairs)
    # blockers[i]: later pairs sharing a link with pair i (only they can make i unfittable)
    links_of = {p: {l for l, _ in pl.use[p]} for p in pairs}
    last_blocker = []
    for i, p in enumerate(pairs):
        later = [j for j in range(i + 1, len(pairs)) if links_of[p] & links_of[pairs[j]]]
        last_blocker.append(max(later) if later else -1)
    out: List[Channel] = []
    chosen: List[Pair] = []
    excluded: List[int] = []
    load: Dict = {}

    def rec(i: int) -> None:
        # prune: an excluded pair that fits now and has no undecided blocker left -> dead branch
        for e in excluded:
            if last_blocker[e] < i and pl.fits(load, pairs[e]):
                return
        if i == len(pairs):
            out.append(frozenset(chosen))
            return
        p = pairs[i]
        if pl.fits(load, p):
            pl.add(load, p)
            chosen.append(p)
            rec(i + 1)
            chosen.pop()
            pl.add(load, p, -1.0)
        excluded.append(i)
        rec(i + 1)
        excluded.pop()

    rec(0)
    return out


def gpu_automorphisms(topo: Topology, max_count: int = 200000) -> List[Tuple[int, ...]]:
    """GPU permutations induced by graph automorphisms (node kinds, hosts' roles and
    bandwidths preserved); computed with networkx's VF2 on the undirected link graph."""
    import networkx as nx
    from networkx.algorithms.isomorphism import GraphMatcher

    g = nx.Graph()
    for node, attrs in topo.nodes.items():
        g.add_node(node, kind=attrs["type"])
    for (u, v) in topo.links():
        if u < v:
            g.add_edge(u, v, bw=round(topo.bandwidth((u, v)) / 1e6), bw2=round(topo.bandwidth((v, u)) / 1e6))
    gm = GraphMatcher(g, g, node_match=lambda a, b: a["kind"] == b["kind"],
                      edge_match=lambda a, b: {a["bw"], a["bw2"]} == {b["bw"], b["bw2"]})
    index = {name: i for i, name in enumerate(topo.gpus)}
    perms = set()
    for m in gm.isomorphisms_iter():
        perms.add(tuple(index[m[name]] for name in topo.gpus))
        if len(perms) >= max_count:
            break
    return sorted(perms)


def apply_perm(channel: Iterable[Pair], perm: Sequence[int]) -> Channel:
    """Image of a channel under a GPU permutation."""
    return frozenset((perm[s], perm[d]) for s, d in channel)


def canonical(channel: Iterable[Pair], group: Sequence[Sequence[int]]) -> Tuple[Pair, ...]:
    """Lexicographically smallest sorted image of ``channel`` over ``group``."""
    return min(tuple(sorted(apply_perm(channel, g))) for g in group)


def orbit_representatives(channels: Sequence[Channel], group: Sequence[Sequence[int]]) -> List[Channel]:
    """One channel per orbit (the canonical image), in canonical order."""
    seen = set()
    reps = []
    for ch in channels:
        key = tuple(sorted(ch))
        if key in seen:
            continue
        orbit = {tuple(sorted(apply_perm(ch, g))) for g in group}
        seen |= orbit
        reps.append(frozenset(min(orbit)))
    return sorted(reps, key=lambda c: tuple(sorted(c)))


def expand(reps: Sequence[Channel], group: Sequence[Sequence[int]]) -> List[Channel]:
    """All distinct images of the representatives (sorted, deterministic)."""
    out = {tuple(sorted(apply_perm(r, g))) for r in reps for g in group}
    return [frozenset(c) for c in sorted(out)]


def brute_force_channels(topo: Topology) -> List[Channel]:
    """Reference enumeration over all subsets (tests only; tiny topologies)."""
    n = topo.num_gpus
    pairs = [(s, d) for s in range(n) for d in range(n) if s != d]
    if len(pairs) > 16:
        raise ValueError("brute force is for <= 16 pairs")
    feasible = []
    for mask in range(1 << len(pairs)):
        ch = [pairs[i] for i in range(len(pairs)) if mask >> i & 1]
        if is_contention_free(topo, ch):
            feasible.append(frozenset(ch))
    fs = set(feasible)
    return [c for c in feasible if not any(c | {p} in fs for p in pairs if p not in c)]


def all_permutations(n: int) -> List[Tuple[int, ...]]:
    """The full symmetric group (used for the flat topology)."""
    return list(permutations(range(n)))
