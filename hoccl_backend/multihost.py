"""Creation of a hoccl group whose ranks sit on more than one host.

It is an ordinary ProcessGroupHOCCL whose shared memory spans this rank's host, joined to its
hosts (span_hosts): every collective runs as one plan across hosts, steps inside a host on the
shared memory, steps across hosts on torch's ProcessGroupGloo (all_gather of mid-size blocks on
even hosts may still run as legs, see docs/multihost.md). The gloo groups cannot be built from
C++ against the torch wheel (its gloo headers are not shipped), so they are built here and
handed over; the C++ group owns them from then on. Every rank creates its groups in one
canonical order (the hoccl group, which exchanges the host table, then global, p2p, its rail):
gloo's constructor connects its full mesh and blocks until every member has arrived.
"""
from __future__ import annotations

import fcntl
import os
import socket
import struct
import warnings
from datetime import timedelta


def _interface_address(name: str) -> str:
    """IPv4 address of a network interface (what gloo binds to for GLOO_SOCKET_IFNAME)."""
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name[:15].encode()))
    return socket.inet_ntoa(packed[20:24])


def inter_host_address() -> str:
    """The address this rank's gloo groups listen on: the first interface of GLOO_SOCKET_IFNAME,
    else what the hostname resolves to (gloo's own rule)."""
    ifnames = [n for n in os.environ.get("GLOO_SOCKET_IFNAME", "").split(",") if n]
    try:
        if ifnames:
            return _interface_address(ifnames[0])
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return ""


def span(pg, store, rank: int, size: int, timeout: timedelta):
    """Joins `pg`, a group created with spans_hosts whose host table names several hosts, to
    its hosts: builds its gloo groups and hands them over. Returns pg."""
    import torch.distributed as dist

    from hoccl_backend import _C

    engine = _C.config_value("HOCCL_INTER_HOST")
    if engine != "gloo":  # the table admits gloo only today; this guards the day it admits more
        raise ValueError(f"hoccl process group creation on rank {rank}: HOCCL_INTER_HOST={engine} "
                         "is not available in this build")
    ranks_of = pg.hosts()  # the group's host table: its rails and the layout its plans use
    local_rank = next(ranks.index(rank) for ranks in ranks_of if rank in ranks)

    address = inter_host_address()
    store.set(f"hoccl/address/{rank}", address)
    addresses = [store.get(f"hoccl/address/{r}").decode() for r in range(size)]
    if local_rank == 0 and (address.startswith("127.") or not address):
        warnings.warn(
            f"hoccl rank {rank}: this group spans {len(ranks_of)} hosts but the inter-host address is "
            f"'{address or 'unresolved'}' (the hostname resolves to loopback); set GLOO_SOCKET_IFNAME "
            "to the interface that reaches the other hosts", stacklevel=2)

    gloo = dist.ProcessGroupGloo
    global_group = gloo(dist.PrefixStore("hoccl/gloo/global", store), rank, size, timeout)
    p2p = gloo(dist.PrefixStore("hoccl/gloo/p2p", store), rank, size, timeout)
    rail_members = [ranks[local_rank] for ranks in ranks_of if len(ranks) > local_rank]
    rail = gloo(dist.PrefixStore(f"hoccl/gloo/rail/{local_rank}", store), rail_members.index(rank),
                len(rail_members), timeout)
    pg.span_hosts(rail, global_group, p2p, addresses)
    return pg
