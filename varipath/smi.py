"""Build a :class:`Topology` from ``nvidia-smi topo -m`` output.

Only the GPU x GPU block of the matrix is used.  Codes map to the tree this module builds:

* ``PIX``  — same PCIe switch;
* ``PXB``  — different switches behind one upstream bridge (same root complex);
* ``PHB`` / ``NODE`` — same CPU socket (through the host bridge);
* ``SYS``  — different sockets (across the socket link);
* ``NV#``  — NVLink: rejected (VarioPath models PCIe-only machines).

GPUs without a ``PIX`` peer attach directly to their root complex.  Bandwidths are the Gen4
figures of the ``gen4-4sw-2skt`` preset unless given.
"""
from __future__ import annotations

import subprocess
from typing import Dict, List, Optional

from .topology import GB, PCIE_LAT, SOCKET_LAT, Topology

CODES = ("X", "PIX", "PXB", "PHB", "NODE", "SYS")


def parse_matrix(text: str) -> List[List[str]]:
    """The GPU x GPU code matrix (row i, column j) from ``nvidia-smi topo -m`` text."""
    lines = [l for l in text.splitlines() if l.strip()]
    if not lines:
        raise ValueError("empty nvidia-smi topo output")
    header = lines[0].split()
    gpu_cols = [i for i, h in enumerate(header) if h.startswith("GPU") and h[3:].isdigit()]
    if not gpu_cols:
        raise ValueError("nvidia-smi topo output has no GPU columns")
    rows: Dict[int, List[str]] = {}
    for line in lines[1:]:
        parts = line.split()
        if not parts or not (parts[0].startswith("GPU") and parts[0][3:].isdigit()):
            continue
        cells = parts[1:1 + len(header)]
        rows[int(parts[0][3:])] = [cells[i] for i in gpu_cols]
    n = len(gpu_cols)
    if sorted(rows) != list(range(n)):
        raise ValueError(f"nvidia-smi topo output: expected rows GPU0..GPU{n - 1}, got {sorted(rows)}")
    matrix = [rows[i] for i in range(n)]
    for i, row in enumerate(matrix):
        for j, code in enumerate(row):
            if code.startswith("NV"):
                raise ValueError(f"GPU{i}-GPU{j} is NVLink ({code}); VarioPath models PCIe-only topologies")
            if code not in CODES:
                raise ValueError(f"GPU{i}-GPU{j}: unknown topology code {code!r}")
            if (i == j) != (code == "X") or matrix[j][i] != code:
                raise ValueError(f"GPU{i}-GPU{j}: matrix is not symmetric with X on the diagonal")
    return matrix


def _groups(matrix: List[List[str]], codes: tuple) -> List[int]:
    """Union-find labels: GPUs joined when their code is in ``codes``."""
    n = len(matrix)
    label = list(range(n))

    def find(x: int) -> int:
        while label[x] != x:
            label[x] = label[label[x]]
            x = label[x]
        return x

    for i in range(n):
        for j in range(n):
            if i != j and matrix[i][j] in codes:
                label[find(i)] = find(j)
    roots = sorted({find(i) for i in range(n)})
    return [roots.index(find(i)) for i in range(n)]


def from_smi(text: str, name: str = "smi", gpu_bw: float = 25 * GB, uplink_bw: float = 25 * GB,
             socket_bw: float = 20 * GB) -> Topology:
    """Topology for one host from ``nvidia-smi topo -m`` text."""
    m = parse_matrix(text)
    n = len(m)
    switch = _groups(m, ("PIX",))
    rc = _groups(m, ("PIX", "PXB"))
    socket = _groups(m, ("PIX", "PXB", "PHB", "NODE"))
    nodes: Dict[str, dict] = {}
    links: List[dict] = []
    for s in sorted(set(socket)):
        nodes[f"h0.cpu{s}"] = {"type": "rc", "host": 0}
        if s > 0:
            links.append({"a": "h0.cpu0", "b": f"h0.cpu{s}", "bw": socket_bw, "latency": SOCKET_LAT})
    for r in sorted(set(rc)):
        sock = socket[rc.index(r)]
        nodes[f"h0.rc{r}"] = {"type": "rc", "host": 0}
        links.append({"a": f"h0.rc{r}", "b": f"h0.cpu{sock}", "bw": uplink_bw * n, "latency": PCIE_LAT})
    gpus = []
    for i in range(n):
        g = f"h0.gpu{i}"
        nodes[g] = {"type": "gpu", "host": 0}
        gpus.append(g)
        peers = [j for j in range(n) if switch[j] == switch[i]]
        if len(peers) > 1:
            sw = f"h0.sw{switch[i]}"
            if sw not in nodes:
                nodes[sw] = {"type": "switch", "host": 0}
                links.append({"a": sw, "b": f"h0.rc{rc[i]}", "bw": uplink_bw, "latency": PCIE_LAT})
            links.append({"a": g, "b": sw, "bw": gpu_bw, "latency": PCIE_LAT})
        else:
            links.append({"a": g, "b": f"h0.rc{rc[i]}", "bw": gpu_bw, "latency": PCIE_LAT})
    return Topology(name, nodes, links, gpus)


def detect() -> Optional[Topology]:
    """Parse this machine's ``nvidia-smi topo -m``; None when unavailable or unsupported."""
    try:
        out = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    try:
        return from_smi(out.stdout, name="detected")
    except ValueError:
        return None
