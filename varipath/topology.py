"""Topology model: GPUs, PCIe switches, root complexes, socket links, NICs, network.

A topology is a graph of named nodes (``gpu``, ``switch``, ``rc``, ``nic``, ``net``) whose
links are bidirectional with a bandwidth per direction (bytes/s) and a latency (s).  A link id
is the directed pair ``(u, v)`` of node names.  Routing is fixed: inside a host the unique
shortest path through the PCIe tree (lowest common switch, else the root complex, across the
socket link when needed); across hosts GPU -> nearest NIC -> network switch -> the NIC nearest
the destination GPU -> destination GPU.
"""
from __future__ import annotations

import json
from collections import deque
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

Link = Tuple[str, str]
NODE_TYPES = ("gpu", "switch", "rc", "nic", "net")
GB = 1e9

# Effective per-direction figures (vendor figures and published P2P measurements): Gen4 x16 ~25 GB/s, Gen5 x16 ~56 GB/s,
# a 200 Gb NIC ~25 GB/s, 400 Gb ~50 GB/s.  Cross-socket P2P is modelled slower than one GPU
# link (UPI/xGMI P2P forwarding rarely reaches PCIe line rate).
PRESETS: Dict[str, dict] = {
    "gen4-4sw-2skt": dict(gpus_per_switch=2, switches_per_socket=2, sockets=2,
                         gpu_bw=25 * GB, uplink_bw=25 * GB, socket_bw=20 * GB, nic_bw=25 * GB),
    "gen5-2sw": dict(gpus_per_switch=4, switches_per_socket=1, sockets=2,
                     gpu_bw=56 * GB, uplink_bw=56 * GB, socket_bw=48 * GB, nic_bw=50 * GB),
    "direct4": dict(gpus_per_switch=0, switches_per_socket=0, sockets=2, gpus_per_rc=2,
                    gpu_bw=25 * GB, uplink_bw=0, socket_bw=20 * GB, nic_bw=25 * GB),
}
PCIE_LAT = 0.5e-6
SOCKET_LAT = 1.0e-6
NET_LAT = 1.5e-6
PHASE_LATENCY_S = 5e-6  # signal round trip + DMA launch per synchronized phase


class NotInducible(ValueError):
    """The part of a topology some of its GPUs occupy cannot stand on its own with the routes
    those GPUs have in the whole topology (the reason is the message)."""


class Topology:
    """Directed-link graph with fixed routing between GPUs.  See module docstring."""

    def __init__(self, name: str, nodes: Dict[str, dict], links: Sequence[dict],
                 gpus: Sequence[str], phase_latency_s: float = PHASE_LATENCY_S,
                 pair_bw: Optional[float] = None) -> None:
        self.name = name
        self.pair_bw = pair_bw  # optional cap on one transfer's rate (e.g. an ideal switch)
        self.nodes = {k: dict(v) for k, v in nodes.items()}
        self.gpus = list(gpus)
        self.phase_latency_s = float(phase_latency_s)
        self._bw: Dict[Link, float] = {}
        self._lat: Dict[Link, float] = {}
        self._adj: Dict[str, List[str]] = {k: [] for k in self.nodes}
        self._raw_links = [dict(l) for l in links]
        self._validate_nodes()
        for l in self._raw_links:
            self._add_link(l["a"], l["b"], float(l["bw"]), float(l.get("latency", PCIE_LAT)))
        for k in self._adj:
            self._adj[k].sort()
        self._paths: Dict[Tuple[int, int], List[Link]] = {}
        self._host_cache: Dict[Tuple[int, bool], set] = {}
        self._intra_parent: Dict[int, Dict[str, Optional[str]]] = {}
        self._nic_route: Dict[int, List[str]] = {}
        self._check_connected()

    # ---------------------------------------------------------------- construction helpers
    def _validate_nodes(self) -> None:
        for n, attrs in self.nodes.items():
            if attrs.get("type") not in NODE_TYPES:
                raise ValueError(f"topology {self.name}: node {n!r} has unknown type "
                                 f"{attrs.get('type')!r} (expected one of {NODE_TYPES})")
        for g in self.gpus:
            if g not in self.nodes or self.nodes[g]["type"] != "gpu":
                raise ValueError(f"topology {self.name}: GPU list names unknown or non-GPU node {g!r}")
        if len(set(self.gpus)) != len(self.gpus) or not self.gpus:
            raise ValueError(f"topology {self.name}: GPU list is empty or has duplicates")
        extra = [n for n, a in self.nodes.items() if a["type"] == "gpu" and n not in self.gpus]
        if extra:
            raise ValueError(f"topology {self.name}: GPU nodes missing from the GPU order: {extra}")

    def _add_link(self, a: str, b: str, bw: float, lat: float) -> None:
        for n in (a, b):
            if n not in self.nodes:
                raise ValueError(f"topology {self.name}: link {a}<->{b} names unknown node {n!r}")
        if a == b or bw <= 0 or lat < 0:
            raise ValueError(f"topology {self.name}: bad link {a}<->{b} (bw={bw}, latency={lat})")
        for u, v in ((a, b), (b, a)):
            if (u, v) in self._bw:
                raise ValueError(f"topology {self.name}: duplicate link {u}<->{v}")
            self._bw[(u, v)] = bw
            self._lat[(u, v)] = lat
            self._adj[u].append(v)

    def _check_connected(self) -> None:
        for n in self.nodes:
            if not self._adj[n]:
                raise ValueError(f"topology {self.name}: node {n!r} is disconnected (no links)")
        hosts = sorted({self.host_of(i) for i in range(self.num_gpus)})
        for i in range(self.num_gpus):
            parent = self._intra(i)
            for j in range(self.num_gpus):
                if j != i and self.host_of(j) == self.host_of(i) and self.gpus[j] not in parent:
                    raise ValueError(f"topology {self.name}: GPUs {self.gpus[i]} and {self.gpus[j]} "
                                     f"are disconnected inside host {self.host_of(i)}")
            if len(hosts) > 1:
                self._gpu_to_nic(i)
        if len(hosts) > 1:
            self._net_hop()

    # ---------------------------------------------------------------- public API
    @property
    def num_gpus(self) -> int:
        """Number of GPUs (ranks)."""
        return len(self.gpus)

    @property
    def num_hosts(self) -> int:
        """Number of distinct hosts the GPUs live on."""
        return len({self.host_of(i) for i in range(self.num_gpus)})

    def host_of(self, gpu: int) -> int:
        """Host index of GPU ``gpu``."""
        return int(self.nodes[self.gpus[gpu]].get("host", 0))

    def links(self) -> List[Link]:
        """All directed link ids, sorted."""
        return sorted(self._bw)

    def bandwidth(self, link: Link) -> float:
        """Bandwidth of a directed link in bytes/s."""
        return self._bw[tuple(link)]

    def latency(self, link: Link) -> float:
        """Latency of a directed link in seconds."""
        return self._lat[tuple(link)]

    def path(self, src: int, dst: int) -> List[Link]:
        """Directed links from GPU ``src`` to GPU ``dst`` under the fixed routing."""
        key = (src, dst)
        if key not in self._paths:
            self._paths[key] = self._route(src, dst)
        return list(self._paths[key])

    def pair_rate(self, src: int, dst: int) -> float:
        """Full rate of a transfer running alone: its path's narrowest link (or ``pair_bw``)."""
        r = min(self._bw[l] for l in self.path(src, dst))
        return min(r, self.pair_bw) if self.pair_bw else r

    def path_latency(self, src: int, dst: int) -> float:
        """Sum of link latencies on the path."""
        return sum(self._lat[l] for l in self.path(src, dst))

    def phase_start_s(self) -> float:
        """Start cost charged per phase by the scheduler's cost model: the fixed phase latency
        plus the longest GPU-to-GPU path latency (what the simulator charges a phase at most)."""
        if getattr(self, "_phase_start", None) is None:
            n = self.num_gpus
            hosts = {}
            for i in range(n):  # one GPU per host suffices for the cross-host maximum
                hosts.setdefault(self.host_of(i), []).append(i)
            reps = [g for gs in hosts.values() for g in gs[:1]] if len(hosts) > 2 else list(range(n))
            worst = max((self.path_latency(s, d) for s in reps for d in range(n) if s != d), default=0.0)
            self._phase_start = self.phase_latency_s + worst
        return self._phase_start

    def pair_bandwidth(self) -> float:
        """Per-pair rate used by the online scheduler: ``pair_bw`` if set, else the narrowest
        GPU attachment link."""
        if self.pair_bw:
            return self.pair_bw
        return min(self._bw[(g, self._adj[g][0])] for g in self.gpus)

    # ---------------------------------------------------------------- routing
    def _host_nodes(self, host: int, with_nics: bool) -> set:
        key = (host, with_nics)
        if key not in self._host_cache:
            self._host_cache[key] = self._host_nodes_uncached(host, with_nics)
        return self._host_cache[key]

    def _intra(self, gpu: int) -> Dict[str, Optional[str]]:
        if gpu not in self._intra_parent:
            self._intra_parent[gpu] = self._bfs(self.gpus[gpu], self._host_nodes(self.host_of(gpu), False))
        return self._intra_parent[gpu]

    def _gpu_to_nic(self, gpu: int) -> List[str]:
        if gpu not in self._nic_route:
            self._nic_route[gpu] = self._to_nic(self.gpus[gpu], self.host_of(gpu))
        return self._nic_route[gpu]

    def _host_nodes_uncached(self, host: int, with_nics: bool) -> set:
        kinds = ("gpu", "switch", "rc", "nic") if with_nics else ("gpu", "switch", "rc")
        return {n for n, a in self.nodes.items()
                if a["type"] in kinds and int(a.get("host", 0)) == host}

    def _bfs(self, start: str, allowed: set) -> Dict[str, Optional[str]]:
        """Deterministic BFS parents (neighbours visited in sorted order)."""
        parent: Dict[str, Optional[str]] = {start: None}
        q = deque([start])
        while q:
            u = q.popleft()
            for v in self._adj[u]:
                if v in allowed and v not in parent:
                    parent[v] = u
                    q.append(v)
        return parent

    @staticmethod
    def _walk(parent: Dict[str, Optional[str]], end: str) -> List[str]:
        out = [end]
        while parent[out[-1]] is not None:
            out.append(parent[out[-1]])
        return out[::-1]

    def _route(self, src: int, dst: int) -> List[Link]:
        if src == dst or not (0 <= src < self.num_gpus and 0 <= dst < self.num_gpus):
            raise ValueError(f"path({src}, {dst}): need two distinct GPUs in 0..{self.num_gpus - 1}")
        a, b = self.gpus[src], self.gpus[dst]
        ha, hb = self.host_of(src), self.host_of(dst)
        if ha == hb:
            parent = self._intra(src)
            if b not in parent:
                raise ValueError(f"topology {self.name}: GPUs {a} and {b} are disconnected inside host {ha}")
            nodes = self._walk(parent, b)
        else:
            nodes = self._gpu_to_nic(src) + self._net_hop() + self._gpu_to_nic(dst)[::-1]
        return [(u, v) for u, v in zip(nodes, nodes[1:])]

    def _to_nic(self, gpu: str, host: int) -> List[str]:
        """Nodes from ``gpu`` to its nearest NIC (ties broken by name), NIC included."""
        parent = self._bfs(gpu, self._host_nodes(host, with_nics=True))
        nics = [n for n in parent if self.nodes[n]["type"] == "nic"]
        if not nics:
            raise ValueError(f"topology {self.name}: GPU {gpu} on host {host} reaches no NIC "
                             f"(disconnected from the network)")
        best = min(nics, key=lambda n: (len(self._walk(parent, n)), n))
        return self._walk(parent, best)

    def _net_hop(self) -> List[str]:
        if getattr(self, "_net_cache", None) is not None:
            return self._net_cache
        nets = [n for n, a in self.nodes.items() if a["type"] == "net"]
        if len(nets) != 1:
            raise ValueError(f"topology {self.name}: multi-host routing needs exactly one 'net' node, got {nets}")
        self._net_cache = nets
        return nets

    # ---------------------------------------------------------------- JSON
    def to_dict(self) -> dict:
        """Plain-data form (bandwidths in GB/s, latencies in µs)."""
        out = {
            "name": self.name,
            "phase_latency_us": self.phase_latency_s * 1e6,
            "gpus": list(self.gpus),
            "nodes": [{"id": n, **a} for n, a in sorted(self.nodes.items())],
            "links": [{"a": l["a"], "b": l["b"], "bw_GBps": l["bw"] / GB,
                       "latency_us": l.get("latency", PCIE_LAT) * 1e6} for l in self._raw_links],
        }
        if self.pair_bw:
            out["pair_bw_GBps"] = self.pair_bw / GB
        return out

    def to_json(self, path: Optional[str] = None) -> str:
        """Serialise to a JSON string; also write it to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=1)
        if path is not None:
            with open(path, "w") as f:
                f.write(text)
        return text

    @classmethod
    def from_dict(cls, d: dict) -> "Topology":
        """Inverse of :meth:`to_dict`; raises ValueError on malformed input."""
        try:
            nodes = {}
            for n in d["nodes"]:
                attrs = {k: v for k, v in n.items() if k != "id"}
                if n["id"] in nodes:
                    raise ValueError(f"duplicate node id {n['id']!r}")
                nodes[n["id"]] = attrs
            links = [{"a": l["a"], "b": l["b"], "bw": float(l["bw_GBps"]) * GB,
                      "latency": float(l.get("latency_us", PCIE_LAT * 1e6)) * 1e-6} for l in d["links"]]
            gpus = d.get("gpus") or sorted(n for n, a in nodes.items() if a.get("type") == "gpu")
            pair_bw = float(d["pair_bw_GBps"]) * GB if d.get("pair_bw_GBps") else None
            return cls(d.get("name", "custom"), nodes, links, gpus,
                       float(d.get("phase_latency_us", PHASE_LATENCY_S * 1e6)) * 1e-6, pair_bw)
        except KeyError as e:
            raise ValueError(f"topology JSON is missing field {e}") from None

    @classmethod
    def from_json(cls, path_or_text: str) -> "Topology":
        """Load from a JSON file path (or a JSON string starting with '{')."""
        text = path_or_text
        if not path_or_text.lstrip().startswith("{"):
            with open(path_or_text) as f:
                text = f.read()
        return cls.from_dict(json.loads(text))

    # ---------------------------------------------------------------- presets
    @staticmethod
    def presets() -> List[str]:
        """Names accepted by :meth:`preset` (``flat<N>`` also works for any N >= 2)."""
        return sorted(PRESETS)

    @classmethod
    def preset(cls, name: str, hosts: int = 1) -> "Topology":
        """Build a preset, replicated over ``hosts`` hosts with one NIC per PCIe switch."""
        if hosts < 1:
            raise ValueError(f"hosts must be >= 1, got {hosts}")
        if name.startswith("flat") and name[4:].isdigit():
            return flat(int(name[4:]), hosts)
        if name not in PRESETS:
            raise ValueError(f"unknown topology preset {name!r}; known: {cls.presets()} or flat<N>")
        return _build_pcie(name, PRESETS[name], hosts)

    def __repr__(self) -> str:
        return f"Topology({self.name!r}, gpus={self.num_gpus}, hosts={self.num_hosts})"

    # ---------------------------------------------------------------- sub-topologies
    def induced(self, gpus: Sequence[int]) -> "Topology":
        """The part of this machine that GPUs ``gpus`` occupy, GPU ``gpus[i]`` becoming GPU i:
        those GPUs and every node and link on the routes between them, with their bandwidths
        and latencies, so each pair's route is the one it has here. Hosts keep their indices.

        A process group over some of the ranks plans its all_to_all on this: its transfers run
        on the same wires as in the whole machine, and links no route of the group uses cannot
        limit it. Raises ValueError for fewer than two GPUs, an index out of range or a repeat;
        :class:`NotInducible` when a route between two of them runs through a GPU left out."""
        order = self._check_gpu_selection(gpus)
        used = {link for s in order for d in order if s != d for link in self.path(s, d)}
        kept = set(self.gpus[g] for g in order)
        for u, v in used:
            if self.nodes[v]["type"] == "gpu" and v not in kept:
                raise NotInducible(f"topology {self.name}: routes between GPUs {order} pass through "
                                   f"GPU {v}, which is not among them")
        nodes = {n: self.nodes[n] for link in used for n in link}
        links = [l for l in self._raw_links if (l["a"], l["b"]) in used or (l["b"], l["a"]) in used]
        name = f"{self.name}[{','.join(map(str, order))}]"
        try:
            sub = Topology(name, nodes, links, [self.gpus[g] for g in order], self.phase_latency_s,
                           self.pair_bw)
        except ValueError as e:
            raise NotInducible(f"topology {self.name}: GPUs {order} alone: {e}") from e
        self._check_same_routes(sub, order)
        return sub

    def _check_gpu_selection(self, gpus: Sequence[int]) -> List[int]:
        order = [int(g) for g in gpus]
        if len(order) < 2:
            raise ValueError(f"topology {self.name}: a sub-topology needs at least two GPUs, got {order}")
        bad = [g for g in order if not 0 <= g < self.num_gpus]
        if bad:
            raise ValueError(f"topology {self.name}: GPU indices {bad} out of range 0..{self.num_gpus - 1}")
        if len(set(order)) != len(order):
            raise ValueError(f"topology {self.name}: GPU list {order} names a GPU twice")
        return order

    def _check_same_routes(self, sub: "Topology", order: List[int]) -> None:
        """Routing is a shortest-path rule, so leaving nodes out could in principle pick another
        route; a sub-topology is only the same machine if no pair's route changed."""
        for i, s in enumerate(order):
            for j, d in enumerate(order):
                if i != j and sub.path(i, j) != self.path(s, d):
                    raise NotInducible(f"topology {self.name}: alone, GPUs {self.gpus[s]} -> "
                                       f"{self.gpus[d]} would route {sub.path(i, j)} instead of "
                                       f"{self.path(s, d)}")


def _build_pcie(name: str, p: dict, hosts: int) -> Topology:
    """Sockets -> root complexes -> (switches ->) GPUs, NIC per switch (or per RC)."""
    nodes: Dict[str, dict] = {}
    links: List[dict] = []
    gpus: List[str] = []
    for h in range(hosts):
        pre = f"h{h}."
        attach_points: List[str] = []
        for s in range(p["sockets"]):
            rc = f"{pre}rc{s}"
            nodes[rc] = {"type": "rc", "host": h}
            if s > 0:
                links.append({"a": f"{pre}rc0", "b": rc, "bw": p["socket_bw"], "latency": SOCKET_LAT})
            if p["gpus_per_switch"]:
                for w in range(p["switches_per_socket"]):
                    sw = f"{pre}sw{s * p['switches_per_socket'] + w}"
                    nodes[sw] = {"type": "switch", "host": h}
                    links.append({"a": sw, "b": rc, "bw": p["uplink_bw"], "latency": PCIE_LAT})
                    attach_points.append(sw)
                    for _ in range(p["gpus_per_switch"]):
                        gpus.append(_gpu(nodes, links, pre, len(gpus), sw, h, p["gpu_bw"]))
            else:
                attach_points.append(rc)
                for _ in range(p["gpus_per_rc"]):
                    gpus.append(_gpu(nodes, links, pre, len(gpus), rc, h, p["gpu_bw"]))
        if hosts > 1:
            for k, ap in enumerate(attach_points):
                nic = f"{pre}nic{k}"
                nodes[nic] = {"type": "nic", "host": h}
                links.append({"a": ap, "b": nic, "bw": p["gpu_bw"], "latency": PCIE_LAT})
                links.append({"a": nic, "b": "net", "bw": p["nic_bw"], "latency": NET_LAT})
    if hosts > 1:
        nodes["net"] = {"type": "net", "host": -1}
    label = name if hosts == 1 else f"{name}x{hosts}"
    return Topology(label, nodes, links, gpus)


def _gpu(nodes: dict, links: list, pre: str, idx: int, parent: str, host: int, bw: float) -> str:
    g = f"{pre}gpu{idx}"
    nodes[g] = {"type": "gpu", "host": host}
    links.append({"a": g, "b": parent, "bw": bw, "latency": PCIE_LAT})
    return g


def flat(n: int, hosts: int = 1, pair_bw: float = 25 * GB) -> Topology:
    """``n`` GPUs per host on one ideal switch: every GPU link carries (n-1) pairs at full rate."""
    if n < 2:
        raise ValueError(f"flat topology needs >= 2 GPUs, got {n}")
    total = n * hosts
    nodes: Dict[str, dict] = {"sw": {"type": "switch", "host": 0}}
    links = []
    gpus = []
    for i in range(total):
        g = f"gpu{i}"
        nodes[g] = {"type": "gpu", "host": 0}
        links.append({"a": g, "b": "sw", "bw": (total - 1) * pair_bw, "latency": PCIE_LAT})
        gpus.append(g)
    return Topology(f"flat{total}", nodes, links, gpus, pair_bw=pair_bw)


def gpu_index_list(topo: Topology, host: int) -> List[int]:
    """Global GPU indices on ``host`` in rank order."""
    return [i for i in range(topo.num_gpus) if topo.host_of(i) == host]


def link_loads(topo: Topology, transfers: Iterable[Tuple[int, int, float]]) -> Dict[Link, float]:
    """Bytes per directed link for ``(src, dst, bytes)`` transfers (diagonal skipped)."""
    loads: Dict[Link, float] = {}
    for s, d, b in transfers:
        if s == d or b <= 0:
            continue
        for l in topo.path(s, d):
            loads[l] = loads.get(l, 0.0) + b
    return loads
