"""Skewed all_to_all across hosts: VarioPath's choice beside each of its candidates and gloo.

    python -m hoccl_backend.bench --hosts 2 --link-gbit 4 --ops all_to_all_skewed
    python -m hoccl_backend.bench --hosts 4 --link-gbit 4 --ops all_to_all_skewed --sizes 64K,1M,16M

MoE-like demand: every rank's rows go to destinations by a Zipf law (exponent 1.2) over a
shuffled order of the ranks, so a few hot destinations receive most of the bytes, and each
rank's own total varies (0.5x-1.5x the size). Every rank derives the same matrix from the size.
For each size hoccl runs all_to_all_single on three groups of the same ranks, created with
HOCCL_MULTIHOST_ALLTOALL=auto (VarioPath's choice), direct and rail, beside gloo; the backends
take turns over --rounds rounds. It prints each one's time (median over rounds of the slowest
rank), the form auto ran, and auto's time over the best candidate's.
"""
from __future__ import annotations

import os
import random
import statistics
import time

from hoccl_backend.testbed.hosts import Hosts

FORMS = ("auto", "direct", "rail")
ZIPF = 1.2


def skewed_matrix(world: int, nbytes: int) -> list[list[int]]:
    """Rows (float32 elements) rank s sends to rank d: Zipf over a shuffled destination order."""
    rng = random.Random(nbytes * 31 + world)
    hot = list(range(world))
    rng.shuffle(hot)
    weight = [0.0] * world
    for k, d in enumerate(hot):
        weight[d] = 1.0 / (k + 1) ** ZIPF
    total_w = sum(weight)
    per_rank = max(world, nbytes // 4)
    m = []
    for _ in range(world):
        rows = int(per_rank * rng.uniform(0.5, 1.5))
        m.append([int(rows * w / total_w) for w in weight])
    return m


def _iters(nbytes: int) -> int:
    return max(2, min(20, (16 << 20) // max(nbytes, 1)))


def measure(rank, world, sizes, rounds):
    import torch
    import torch.distributed as dist

    groups = {}
    for form in FORMS:
        os.environ["HOCCL_MULTIHOST_ALLTOALL"] = form  # read when the group is created
        groups[form] = dist.new_group(backend="hoccl")
    groups["gloo"] = dist.new_group(backend="gloo")
    out = {}
    for nbytes in sizes:
        m = skewed_matrix(world, nbytes)
        send = m[rank]
        recv = [m[s][rank] for s in range(world)]
        x = torch.ones(sum(send))
        y = torch.empty(sum(recv))

        def run(group):
            dist.all_to_all_single(y, x, recv, send, group=group)

        for group in groups.values():
            for _ in range(2):
                run(group)
        out[("form", nbytes)] = groups["auto"]._get_backend(torch.device("cpu")).last_algorithm()
        iters = _iters(nbytes)
        for r in range(rounds):
            names = list(groups) if r % 2 == 0 else list(groups)[::-1]
            for name in names:
                dist.barrier(group=groups[name])
                start = time.perf_counter()
                for _ in range(iters):
                    run(groups[name])
                out.setdefault((name, nbytes), []).append((time.perf_counter() - start) / iters)
        out[("bytes", nbytes)] = sum(map(sum, m)) * 4
    return out


def _slowest_median(results, key):
    rounds = len(results[0][key])
    return statistics.median(max(r[key][i] for r in results) for i in range(rounds))


def main(args) -> int:
    from hoccl_backend.bench import parse_size

    sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else [64 << 10, 1 << 20, 16 << 20]
    per_host = args.ranks_per_host
    with Hosts(count=args.hosts, ranks=[per_host] * args.hosts, link_gbit=args.link_gbit, mtu=9000) as hosts:
        results = hosts.run_ranks(measure, sizes, args.rounds, backend="hoccl", pg_timeout=600,
                                  timeout=3600)
        described = hosts.describe()
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"# {time.strftime('%Y-%m-%d')}: {described}; {os.cpu_count()} cores; load average {load}; "
          f"Zipf {ZIPF} demand; median of {args.rounds} rounds")
    print("#            op   bytes/rank |   auto us  ran     |  direct us    rail us |    gloo us | auto/best | gloo/auto")
    rows = []
    for nbytes in sizes:
        t = {name: _slowest_median(results, (name, nbytes)) * 1e6 for name in FORMS + ("gloo",)}
        ran = results[0][("form", nbytes)].replace("multihost_", "")
        best = min(t["direct"], t["rail"])
        per_rank = results[0][("bytes", nbytes)] // (args.hosts * per_host)
        print(f"{'all_to_all_skewed':>17} {per_rank:>12} | {t['auto']:9.0f}  {ran:<7} | {t['direct']:10.0f} "
              f"{t['rail']:10.0f} | {t['gloo']:10.0f} | {t['auto'] / best:8.2f}x | {t['gloo'] / t['auto']:8.2f}x")
        rows.append(dict(bytes_per_rank=per_rank, ran=ran, **{f"{k}_us": v for k, v in t.items()}))
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump({"hosts": described, "rows": rows}, f, indent=1)
    return 0
