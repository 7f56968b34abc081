"""Channel catalog: offline enumeration, symmetry compression, disk cache, working sets.

One host: all maximal contention-free channels, one representative per orbit of the host's
GPU automorphism group.  Several hosts: the catalog stays per host and per host pair, because
the multi-host symmetry group is ``Aut(host) wr S_H`` (each host can be relabelled on its own
and hosts permuted freely).  It stores

* intra representatives (channels inside one host), and
* cross representatives: maximal contention-free sets of transfers from one host to another
  (NIC-limited), up to ``Aut(host) x Aut(host)``.

A multi-host channel composes a host-level permutation (here the cyclic shifts ``h -> h+k``,
which cover every host pair) with one cross pattern per host pair, plus intra transfers on the
GPU ports that the cross pattern leaves idle.  The *working set* handed to the C++ scheduler
is a small deterministic cover built from the representatives, so its size grows like
``(H - 1) * |cover|`` instead of exponentially in H.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import time
from collections import deque
from typing import Dict, List, Sequence, Tuple

from . import analyzer as an
from .topology import Topology, gpu_index_list

CACHE_VERSION = 7
Pair = Tuple[int, int]


def cache_dir() -> str:
    """``$HOCCL_CACHE_DIR`` or ``~/.cache/hoccl`` (created on demand; never the repository)."""
    d = os.environ.get("HOCCL_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "hoccl")
    os.makedirs(d, exist_ok=True)
    return d


def _key(topo: Topology, what: str) -> str:
    blob = json.dumps({"v": CACHE_VERSION, "what": what, "topo": topo.to_dict()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _read(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None  # absent, or corrupt: rebuild


def _cached(topo: Topology, what: str, build) -> dict:
    path = os.path.join(cache_dir(), f"varipath-{what}-{_key(topo, what)}.json")
    data = _read(path)
    if data is not None:
        return data
    # Every rank of a fresh job on one machine misses the cache at once; without the lock each
    # would build the same catalog (8 ranks of gen5-2sw on 2 cores: 8.8 s alone, ~80 s
    # together). One builds, the others wait for its file. The lock file stays, as a cache
    # entry's companion: removing it under a waiter would let a third process build beside it.
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = _read(path)
        if data is None:
            text = json.dumps(build())
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, path)  # atomic: a reader without the lock never sees a partial file
            data = json.loads(text)  # what every other process reads: lists, not the build's tuples
    return data


# ------------------------------------------------------------------------- orbits
def _orbits(channels: Sequence[an.Channel], generators: Sequence[Sequence[int]]) -> List[an.Channel]:
    """Orbit representatives (lexicographically smallest member) by closure under generators."""
    pool = {tuple(sorted(c)) for c in channels}
    reps = []
    while pool:
        start = min(pool)
        orbit = {start}
        todo = deque([start])
        while todo:
            c = todo.popleft()
            for g in generators:
                img = tuple(sorted((g[s], g[d]) for s, d in c))
                if img not in orbit:
                    orbit.add(img)
                    todo.append(img)
        pool -= orbit
        reps.append(frozenset(min(orbit)))
    return reps


def _host_topology(topo: Topology) -> Topology:
    """The single-host topology a multi-host preset was built from (host 0's subgraph)."""
    if topo.num_hosts == 1:
        return topo
    base, _, hosts = topo.name.rpartition("x")
    # the multi-host catalog is rebuilt from the preset's name; anything else (a sub-topology,
    # a hand-written JSON) would silently get another machine's channels
    if hosts != str(topo.num_hosts) or Topology.preset(base, topo.num_hosts).gpus != topo.gpus:
        raise ValueError(f"varipath plans several hosts only for a preset replicated over whole "
                         f"hosts (name 'PRESETxHOSTS'); topology {topo.name} is not one")
    return Topology.preset(base, 1)


def _two_host(topo: Topology) -> Topology:
    return Topology.preset(topo.name.rsplit("x", 1)[0], 2)


# ------------------------------------------------------------------------- building
def build_host_catalog(host: Topology) -> dict:
    """Enumerate one host's maximal channels and compress them by its symmetry group."""
    t0 = time.perf_counter()
    chans = an.maximal_channels(host)
    t1 = time.perf_counter()
    group = an.gpu_automorphisms(host)
    reps = an.orbit_representatives(chans, group)
    t2 = time.perf_counter()
    return {"n": host.num_gpus, "intra_all": len(chans), "intra_reps": [sorted(r) for r in reps],
            "group_order": len(group), "group": [list(g) for g in group],
            "enumerate_s": t1 - t0, "symmetry_s": t2 - t1}


def build_cross_catalog(host: Topology, two: Topology) -> dict:
    """Maximal contention-free transfer sets from host 0 to host 1, up to Aut(host)^2."""
    n = host.num_gpus
    t0 = time.perf_counter()
    pairs = [(s, d) for s in range(n) for d in range(n, 2 * n)]
    chans = an.maximal_channels(two, pairs)
    t1 = time.perf_counter()
    group = an.gpu_automorphisms(host)
    ident = list(range(n))
    gens = [list(g) + [n + x for x in ident] for g in group] + [ident + [n + x for x in g] for g in group]
    reps = _orbits(chans, gens)
    t2 = time.perf_counter()
    return {"cross_all": len(chans), "cross_reps": [sorted(r) for r in reps],
            "cross_cover": [list(c) for c in _greedy_cover(sorted(tuple(sorted(c)) for c in chans))],
            "enumerate_s": t1 - t0, "symmetry_s": t2 - t1}


def _derangements(m: int) -> int:
    d = [1, 0]
    for k in range(2, m + 1):
        d.append((k - 1) * (d[-1] + d[-2]))
    return d[m]


def family_size(hosts: int, intra: int, cross: int) -> int:
    """Channels of the multi-host family: every host either runs an intra channel or sends to
    a distinct other host (a derangement of the moved hosts) with a cross pattern."""
    if hosts == 1:
        return intra
    return sum(math.comb(hosts, f) * _derangements(hosts - f) * intra ** f * cross ** (hosts - f)
               for f in range(hosts + 1))


def catalog(topo: Topology) -> dict:
    """The (cached) catalog of ``topo``: representatives, sizes and build times."""
    if topo.name.startswith("flat"):
        n = topo.num_gpus
        return {"kind": "flat", "n": n, "all": 1, "reps": 1, "build_s": 0.0}
    host = _host_topology(topo)
    hc = _cached(host, "host", lambda: build_host_catalog(host))
    out = {"kind": "pcie", "n_host": hc["n"], "hosts": topo.num_hosts, "host": hc,
           "intra_all": hc["intra_all"], "intra_reps": len(hc["intra_reps"]),
           "build_s": hc["enumerate_s"] + hc["symmetry_s"]}
    if topo.num_hosts > 1:
        two = _two_host(topo)
        cc = _cached(two, "cross", lambda: build_cross_catalog(host, two))
        out.update(cross=cc, cross_all=cc["cross_all"], cross_reps=len(cc["cross_reps"]))
        out["build_s"] += cc["enumerate_s"] + cc["symmetry_s"]
        out["all"] = family_size(topo.num_hosts, hc["intra_all"], cc["cross_all"])
        out["reps"] = len(hc["intra_reps"]) + len(cc["cross_reps"])
    else:
        out["all"] = hc["intra_all"]
        out["reps"] = len(hc["intra_reps"])
    return out


# ------------------------------------------------------------------------- working sets
def _expand(reps: Sequence[Sequence[Pair]], group: Sequence[Sequence[int]], offset_dst: int = 0) -> List[Tuple[Pair, ...]]:
    """All images of ``reps`` under ``group`` (applied on both ends; ``offset_dst`` shifts the
    destination host for cross patterns)."""
    out = set()
    for r in reps:
        for g in group:
            out.add(tuple(sorted((g[s], offset_dst + g[d - offset_dst]) for s, d in r)))
    return sorted(out)


def _greedy_cover(chans: Sequence[Tuple[Pair, ...]], rounds: int = 1) -> List[Tuple[Pair, ...]]:
    """Deterministic greedy cover: channels covering the most not-yet-covered pairs, until
    every pair is covered ``rounds`` times."""
    need: Dict[Pair, int] = {}
    for c in chans:
        for p in c:
            need[p] = rounds
    chosen: List[Tuple[Pair, ...]] = []
    remaining = list(chans)
    while any(v > 0 for v in need.values()):
        best = max(remaining, key=lambda c: (sum(1 for p in c if need[p] > 0), len(c)))
        if not any(need[p] > 0 for p in best):
            break
        chosen.append(best)
        remaining.remove(best)
        for p in best:
            need[p] -= 1
    return chosen


def working_set(topo: Topology, max_intra: int = 400) -> List[List[Pair]]:
    """Channels (global GPU ids) handed to the C++ scheduler for ``topo`` (cached)."""
    if topo.name.startswith("flat"):
        n = topo.num_gpus
        return [[(s, d) for s in range(n) for d in range(n) if s != d]]
    n = topo.num_gpus
    # stored as pair ids s*n+d: compact JSON, fast to load at process-group creation
    data = _cached(topo, f"work{max_intra}",
                   lambda: {"channels": [[s * n + d for s, d in c] for c in _build_working_set(topo, max_intra)]})
    return [[divmod(p, n) for p in c] for c in data["channels"]]


def _build_working_set(topo: Topology, max_intra: int) -> List[List[Pair]]:
    cat = catalog(topo)
    hc = cat["host"]
    group = hc["group"]
    intra = _expand(hc["intra_reps"], group)
    if topo.num_hosts > 1:  # cross phases carry most intra traffic in their fills
        max_intra = min(max_intra, MULTI_HOST_INTRA)
    if len(intra) > max_intra:  # keep a cover with multiplicity, not every image
        intra = _greedy_cover(intra, rounds=max(1, max_intra // max(1, len(_greedy_cover(intra)))))
    hosts = topo.num_hosts
    if hosts == 1:
        return [list(c) for c in intra]
    m = hc["n"]
    host = _host_topology(topo)
    cross = [tuple(tuple(p) for p in c) for c in cat["cross"]["cross_cover"]]
    out: List[List[Pair]] = []
    for c in intra:  # the same intra channel in every host at once
        out.append([(h * m + s, h * m + d) for h in range(hosts) for s, d in c])
    for k in range(1, hosts):
        for pat in cross:
            for fill in _intra_fills(host, pat, m, FILL_VARIANTS):
                ch = []
                for h in range(hosts):
                    dst = (h + k) % hosts
                    ch += [(h * m + s, dst * m + d - m) for s, d in pat]
                    ch += [(h * m + s, h * m + d) for s, d in fill]
                out.append(sorted(ch))
    return out


FILL_VARIANTS = 2  # intra fills per cross pattern: lets the scheduler drain intra traffic
MULTI_HOST_INTRA = 48  # intra-only channels kept when there are several hosts


def _intra_fills(host: Topology, pattern: Sequence[Pair], m: int, variants: int) -> List[List[Pair]]:
    """Distinct intra transfer sets that fit beside a cross pattern (the host both sends
    ``pattern`` and, under a shift, receives the same pattern): they use only GPU ports it
    leaves idle.  Variant r is first-fit over the candidates rotated by r/variants, so the
    variants favour different (e.g. cross-socket) pairs."""
    busy_src = {s for s, _ in pattern}
    busy_dst = {d - m for _, d in pattern}
    cand = [(s, d) for s in range(m) for d in range(m) if s != d and s not in busy_src and d not in busy_dst]
    fills: List[List[Pair]] = []
    links = an.PairLinks(host, cand)
    for r in range(variants):
        cut = (r * len(cand)) // variants
        chosen: List[Pair] = []
        load: Dict = {}
        for p in cand[cut:] + cand[:cut]:  # first-fit: deterministic and maximal
            if links.fits(load, p):
                links.add(load, p)
                chosen.append(p)
        if sorted(chosen) not in fills:
            fills.append(sorted(chosen))
    return fills


def catalog_report(presets: Sequence[str], host_counts: Sequence[int] = (1, 2, 4, 32)) -> List[dict]:
    """Rows ``{preset, hosts, channels_all, channels_reps, working_set, build_s}``."""
    rows = []
    for name in presets:
        for h in host_counts:
            topo = Topology.preset(name, h)
            t0 = time.perf_counter()
            cat = catalog(topo)
            ws = working_set(topo)
            rows.append({"preset": name, "hosts": h, "channels_all": cat["all"], "channels_reps": cat["reps"],
                         "working_set": len(ws), "build_s": cat["build_s"],
                         "load_s": time.perf_counter() - t0})
    return rows


def gpu_hosts(topo: Topology) -> Dict[int, List[int]]:
    """Host -> global GPU indices."""
    return {h: gpu_index_list(topo, h) for h in range(topo.num_hosts)}
