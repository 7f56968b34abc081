"""The collective benchmark across hosts: hoccl and gloo side by side on namespaced hosts.

    python -m hoccl_backend.bench --hosts 2 --link-gbit 4                # 2 hosts x 2 ranks
    python -m hoccl_backend.bench --hosts 3 --ranks-per-host 1 --ops all_reduce --sizes 16M

Each host is a network/IPC/mount/PID/UTS namespace (hoccl_backend.testbed), its one link shaped
to --link-gbit in each direction (tc tbf) with jumbo frames, so the links' own byte counters
count little but payload. One job runs on every host; for each (op, size) the two backends take
turns over --rounds rounds. Per backend it prints the time per op (median over rounds of the
slowest rank), busbw, the bytes that crossed hosts per op (the sum of every host link's tx
counter over the timed loop, read inside each host, divided by the iterations), and:

  min    the hierarchical minimum of cross-host bytes (the sum over hosts): all_reduce
         2(H-1)S, all_gather, reduce_scatter and broadcast (H-1)S, gather and scatter S(W-L)/W
         (rank 0 the root), all_to_all S(W-L) for per-rank input S
         split evenly (S is the buffer as in bench.py; H hosts, L ranks each, W = HL)
  bound  that minimum's per-host share over the link rate (gather and scatter: all of it, on the
         root host's link): no schedule finishes sooner
  t/bnd  time / bound (1.00 = the link is busy the whole time with nothing but needed bytes)

Needs root and iproute2 (CI runs as root); without namespaces it says so and has no counters.
"""
from __future__ import annotations

import os
import statistics
import time

from hoccl_backend.bench import OPS, _buffers, _run_op, buffer_bytes, bus_factor, parse_size
from hoccl_backend.testbed.hosts import IFNAME, Hosts

DEFAULT_SIZES = [1 << 20, 16 << 20, 64 << 20]
HOST_OPS = [*OPS, "broadcast", "gather", "scatter"]  # on request (--ops)


def minimum_cross_bytes(op: str, hosts: int, per_host: int, nbytes: int) -> int:
    """Least bytes any schedule must move across hosts (summed over hosts) for one op."""
    world = hosts * per_host
    if op == "all_reduce":
        return 2 * (hosts - 1) * nbytes
    if op in ("all_gather", "reduce_scatter", "broadcast"):
        return (hosts - 1) * nbytes
    if op in ("gather", "scatter"):  # every block of another host than the root's crosses once
        return nbytes * (world - per_host) // world
    return nbytes * (world - per_host)  # all_to_all: every rank sends (W - L)/W of S off its host


def _link_tx_bytes():
    """This host's link tx counter, read in the rank's own network namespace; None if absent."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, counters = line.partition(":")
            if name.strip() == IFNAME:
                return int(counters.split()[8])
    return None


def _iters(nbytes: int) -> int:
    return max(1, min(20, (32 << 20) // max(nbytes, 1)))


def measure(rank, world, ops, sizes, rounds):
    """One rank: per (op, size, backend) the time of each round, and on local rank 0 the bytes
    its host's link sent during each round; per (op, size) the buffer's benchmark bytes."""
    import torch.distributed as dist

    groups = {"hoccl": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    reads_link = int(os.environ["LOCAL_RANK"]) == 0
    out = {}
    for op in ops:
        for nbytes in sizes:
            buf = _buffers(op, nbytes, world)
            out[("bytes", op, nbytes)] = buffer_bytes(op, buf)
            iters = _iters(nbytes)
            for name, group in groups.items():  # warm-up: connections, page faults, and hoccl's
                for _ in range(3):                   # huge-page promotion of reused buffers
                    _run_op(op, buf, group)
            for r in range(rounds):
                order = list(groups) if r % 2 == 0 else list(groups)[::-1]
                for name in order:
                    group = groups[name]
                    # The counter is read before the barrier: a peer on this host may start
                    # sending as soon as it leaves the barrier, before this rank does. The window
                    # then holds the two barriers' few bytes as well, and all of the op's.
                    tx0 = _link_tx_bytes() if reads_link else None
                    dist.barrier(group=group)
                    start = time.perf_counter()
                    for _ in range(iters):
                        _run_op(op, buf, group)
                    seconds = (time.perf_counter() - start) / iters
                    dist.barrier(group=group)  # every rank done: the counter has the whole op
                    tx1 = _link_tx_bytes() if reads_link else None
                    sent = (tx1 - tx0) / iters if tx0 is not None else None
                    out.setdefault((op, nbytes, name), []).append((seconds, sent))
            del buf
    return out


def summarize(results, hosts, per_host, ops, sizes, link_gbit):
    """Rows: per (op, size, backend) the median slowest-rank time and the median cross-host bytes."""
    world = hosts * per_host
    rate = link_gbit * 1e9 / 8 if link_gbit else None
    rows = []
    for op in ops:
        for nbytes in sizes:
            n = results[0][("bytes", op, nbytes)]
            minimum = minimum_cross_bytes(op, hosts, per_host, n)
            # gather and scatter: every crossing byte uses the root host's link
            share = minimum if op in ("gather", "scatter") else minimum / hosts
            bound = share / rate if rate else None
            for name in [k[2] for k in results[0] if k[:2] == (op, nbytes)]:
                per_round = [[rank_result[(op, nbytes, name)][r] for rank_result in results]
                             for r in range(len(results[0][(op, nbytes, name)]))]
                seconds = statistics.median(max(t for t, _ in ranks) for ranks in per_round)
                sent = [[s for _, s in ranks if s is not None] for ranks in per_round]
                crossed = statistics.median(sum(x) for x in sent) if sent[0] else None
                rows.append({"op": op, "bytes": n, "backend": name, "hosts": hosts, "ranks_per_host": per_host,
                             "link_gbit": link_gbit, "us": seconds * 1e6,
                             "busbw_GBps": n / seconds * bus_factor(op, world) / 1e9,
                             "crossed_bytes": crossed, "min_cross_bytes": minimum,
                             "bound_us": bound * 1e6 if bound else None})
    return rows


def _fmt(value, spec, width):
    return f"{value:{width}{spec}}" if value is not None else f"{'n/a':>{width}}"


def print_table(rows):
    """A line per (op, size): hoccl beside gloo."""
    keyed = {(r["op"], r["bytes"], r["backend"]): r for r in rows}
    names = list(dict.fromkeys(r["backend"] for r in rows if r["backend"] != "gloo"))
    label = max(len(n) for n in names)
    print(f"\n#        op      bytes {'':{label}} |  hoccl us   busbw  crossed/min  t/bnd |   gloo us   busbw  "
          "crossed/min  t/bnd | busbw x gloo |   min bytes   bound us")
    for op, nbytes in dict.fromkeys((r["op"], r["bytes"]) for r in rows):
        g = keyed[(op, nbytes, "gloo")]
        for name in names:
            h = keyed[(op, nbytes, name)]
            cells = []
            for r in (h, g):
                ratio = r["crossed_bytes"] / r["min_cross_bytes"] if r["crossed_bytes"] else None
                t_bound = r["us"] / r["bound_us"] if r["bound_us"] else None
                cells.append(f"{r['us']:10.0f} {r['busbw_GBps']:7.3f} {_fmt(ratio, '.3f', 12)} {_fmt(t_bound, '.2f', 6)}")
            print(f"{op:>16} {nbytes:>10} {name:{label}} | {cells[0]} | {cells[1]} | "
                  f"{h['busbw_GBps'] / g['busbw_GBps']:11.2f}x | {h['min_cross_bytes']:>11} {_fmt(h['bound_us'], '.0f', 10)}")


def main(args) -> int:
    ops = [o.strip() for o in args.ops.split(",")]
    for op in ops:
        if op not in HOST_OPS:
            raise SystemExit(f"unknown op {op!r}; choose from {HOST_OPS}")
    sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else DEFAULT_SIZES
    per_host = args.ranks_per_host
    with Hosts(count=args.hosts, ranks=[per_host] * args.hosts, link_gbit=args.link_gbit, mtu=9000) as hosts:
        if not hosts.isolated:
            print("# no namespaces here: no link shaping and no link counters (crossed = n/a)")
        results = hosts.run_ranks(measure, ops, sizes, args.rounds, backend="hoccl", pg_timeout=600,
                                  timeout=3600)
        described, isolated = hosts.describe(), hosts.isolated
    rows = summarize(results, args.hosts, per_host, ops, sizes, args.link_gbit if isolated else None)
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"# {time.strftime('%Y-%m-%d')}: {described}; {os.cpu_count()} cores; load average {load}; "
          f"median of {args.rounds} rounds")
    print_table(rows)
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump({"hosts": described, "rows": rows}, f, indent=1)
    return 0
